// Fused sliding-window softmax attention for CPU inference (float32, AVX-512), the compiled fast path of
// local:W (and of dilated:W:D, one residue stream at a time).  Loaded by supernet/attention/native.py.
//
// Query i attends the keys j with i - before <= j <= i + after (0 <= j < T): causal local:W is
// (before, after) = (W-1, 0), its bidirectional form (W-1, W-1).  Every query sees itself, so no row is empty.
//
// Per (batch, head) and block of 16 queries, in one pass and without a score buffer in memory:
//   QT    = the block's queries transposed (D x 16), scaled by 1/sqrt(D): one register per feature,
//   ST    = scores of the block's key range, key-major (keys x 16 lanes): 16 keys x 16 queries per tile,
//           a broadcast key element times a QT register (the 16 queries of a key in one register),
//   P     = exp(ST - row max) under the window mask, vectorised across the 16 queries (no horizontal
//           reduction but the two at the end), normalised at the end of the apply,
//   out   = P V, 4 query rows x Dv at a time in registers.
// The key range is widened to whole tiles of 16 where the sequence allows; the mask hides the extra keys.
// The block engine (blocks.py) computes the same thing with batched GEMMs and a softmax over a scores
// buffer; this kernel does it for about 2/3 of the time at 4k tokens (one thread), and has no backward:
// with a gradient the engine runs.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int MQ = 16;  // queries per block: the lanes of one AVX-512 float32 register

// exp(x) for x <= 0 (scores minus their row maximum): Cephes' polynomial on x = n ln2 + r, times 2^n.
inline __m512 exp512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2hi = _mm512_set1_ps(0.693359375f), ln2lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2hi, x);
  r = _mm512_fnmadd_ps(n, ln2lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// dst[d * 16 + r] = rows[r][d0 + d] * sc for d < 16: a 16 x 16 tile transposed in registers.
inline void transpose16(const float* const* rows, int64_t d0, float sc, float* dst) {
  __m512 r[16], t[16];
  const __m512 s = _mm512_set1_ps(sc);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(rows[i] + d0), s);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * 16, r[i]);
}

// ST[c][r] = sum_d K[c][d] QT[d][r] for NK keys (rows of K, ldk apart).  Not inlined: in its own frame the
// compiler keeps the NK accumulators in registers.
template <int NK>
__attribute__((noinline)) void score_tile(const float* K, int64_t ldk, const float* QT, int64_t D, float* ST) {
  __m512 acc[NK];
  for (int c = 0; c < NK; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 qv = _mm512_loadu_ps(QT + d * MQ);
    for (int c = 0; c < NK; ++c) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(K[c * ldk + d]), qv, acc[c]);
  }
  for (int c = 0; c < NK; ++c) _mm512_storeu_ps(ST + c * MQ, acc[c]);
}

// O[r] = inv[r] * sum_{c < cn} PT[c][r] V[c] for rows r < m, RB rows x NV registers of Dv at a time.
template <int NV, int RB>
__attribute__((noinline)) void apply_rows(const float* PT, int64_t cn, const float* V, int64_t ldv, const float* inv,
                                          int64_t m, float* O, int64_t ldo) {
  for (int64_t r0 = 0; r0 < m; r0 += RB) {
    const int rn = (int)std::min<int64_t>(RB, m - r0);
    __m512 acc[RB][NV];
    for (int a = 0; a < RB; ++a)
      for (int b = 0; b < NV; ++b) acc[a][b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cn; ++c) {
      const float* vr = V + c * ldv;
      const float* pc = PT + c * MQ + r0;
      __m512 vv[NV];
      for (int b = 0; b < NV; ++b) vv[b] = _mm512_loadu_ps(vr + b * 16);
      for (int a = 0; a < RB; ++a) {
        const __m512 p = _mm512_set1_ps(pc[a]);  // lanes past m hold 0 (r0 + a < 16: RB divides 16)
        for (int b = 0; b < NV; ++b) acc[a][b] = _mm512_fmadd_ps(p, vv[b], acc[a][b]);
      }
    }
    for (int a = 0; a < rn; ++a) {
      float* orow = O + (r0 + a) * ldo;
      const __m512 iv = _mm512_set1_ps(inv[r0 + a]);
      for (int b = 0; b < NV; ++b) _mm512_storeu_ps(orow + b * 16, _mm512_mul_ps(acc[a][b], iv));
    }
  }
}

void apply_block(const float* PT, int64_t cn, const float* V, int64_t ldv, const float* inv, int64_t m, float* O,
                 int64_t ldo, int64_t dv) {
  switch (dv / 16) {
    case 1: apply_rows<1, 4>(PT, cn, V, ldv, inv, m, O, ldo); break;
    case 2: apply_rows<2, 4>(PT, cn, V, ldv, inv, m, O, ldo); break;
    case 3: apply_rows<3, 4>(PT, cn, V, ldv, inv, m, O, ldo); break;
    case 4: apply_rows<4, 4>(PT, cn, V, ldv, inv, m, O, ldo); break;
    default: apply_rows<8, 2>(PT, cn, V, ldv, inv, m, O, ldo); break;  // dv == 128
  }
}

}  // namespace

// q, k (B, H, T, D), v and out (B, H, T, Dv): float32 on the CPU, any strides with the last one 1;
// D a multiple of 16, Dv one of 16, 32, 48, 64, 128 (checked by the caller; checked again here).
void window_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, int64_t before,
                    int64_t after) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && out.sizes() == v.sizes(), "window_forward: shapes");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kFloat, "window_forward: float32 only");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && out.stride(3) == 1, "window_forward: last stride 1");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  TORCH_CHECK(v.size(0) == B && v.size(1) == H && v.size(2) == T, "window_forward: v shape");
  TORCH_CHECK(D % 16 == 0 && DV % 16 == 0 && (DV <= 64 || DV == 128), "window_forward: head sizes");
  TORCH_CHECK(before >= 0 && after >= 0, "window_forward: window");
  if (T == 0 || B * H == 0) return;
  const float* Q = q.data_ptr<float>();
  const float* K = k.data_ptr<float>();
  const float* V = v.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const int64_t nb = (T + MQ - 1) / MQ;
  const int64_t most = (std::min(before + after, T) + MQ + 15) / 16 * 16 + 16;  // keys a block can score
  const float scale = 1.f / std::sqrt((float)D);
  const int32_t bef = (int32_t)std::min<int64_t>(before, T), aft = (int32_t)std::min<int64_t>(after, T);
  at::parallel_for(0, B * H * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> st(most * MQ), qt(D * MQ);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / (H * nb), h = (w / nb) % H, blk = w % nb;
      const float* qh = Q + b * q.stride(0) + h * q.stride(1);
      const float* kh = K + b * k.stride(0) + h * k.stride(1);
      const float* vh = V + b * v.stride(0) + h * v.stride(1);
      float* oh = O + b * out.stride(0) + h * out.stride(1);
      const int64_t ldq = q.stride(2), ldk = k.stride(2), ldv = v.stride(2), ldo = out.stride(2);
      const int64_t q0 = blk * MQ, m = std::min<int64_t>(MQ, T - q0);
      const float* rows[MQ];
      for (int r = 0; r < MQ; ++r) rows[r] = qh + (q0 + (r < m ? r : 0)) * ldq;
      for (int64_t d0 = 0; d0 < D; d0 += 16) transpose16(rows, d0, scale, qt.data() + d0 * MQ);

      int64_t kstart = std::max<int64_t>(0, q0 - bef), kend = std::min<int64_t>(T, q0 + m + aft);
      const int64_t want = (kend - kstart + 15) / 16 * 16;  // whole tiles where the sequence allows
      kstart = std::max<int64_t>(0, kend - want);
      kend = std::min<int64_t>(T, kstart + want);
      const int64_t cn = kend - kstart;
      int64_t c = 0;
      for (; c + 16 <= cn; c += 16) score_tile<16>(kh + (kstart + c) * ldk, ldk, qt.data(), D, st.data() + c * MQ);
      for (; c + 4 <= cn; c += 4) score_tile<4>(kh + (kstart + c) * ldk, ldk, qt.data(), D, st.data() + c * MQ);
      for (; c < cn; ++c) score_tile<1>(kh + (kstart + c) * ldk, ldk, qt.data(), D, st.data() + c * MQ);

      // lane r (query q0 + r, r < m) sees key kstart + c iff r - before <= kstart + c - q0 <= r + after
      const __mmask16 live = (__mmask16)(m >= 16 ? 0xFFFFu : ((1u << m) - 1u));
      const __m512i lo = _mm512_sub_epi32(lane, _mm512_set1_epi32(bef)), hi = _mm512_add_epi32(lane, _mm512_set1_epi32(aft));
      auto seen = [&](int64_t cc) -> __mmask16 {
        const __m512i rel = _mm512_set1_epi32((int32_t)(kstart + cc - q0));
        return _mm512_cmple_epi32_mask(lo, rel) & _mm512_cmpge_epi32_mask(hi, rel) & live;
      };
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t cc = 0; cc < cn; ++cc) mx = _mm512_mask_max_ps(mx, seen(cc), mx, _mm512_loadu_ps(st.data() + cc * MQ));
      mx = _mm512_mask_mov_ps(_mm512_setzero_ps(), live, mx);  // dead lanes (past T): 0, not -inf
      __m512 sum = _mm512_setzero_ps();
      for (int64_t cc = 0; cc < cn; ++cc) {
        float* row = st.data() + cc * MQ;
        const __m512 e = _mm512_maskz_mov_ps(seen(cc), exp512(_mm512_sub_ps(_mm512_loadu_ps(row), mx)));
        _mm512_storeu_ps(row, e);
        sum = _mm512_add_ps(sum, e);
      }
      alignas(64) float inv[MQ];
      _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_mask_mov_ps(_mm512_set1_ps(1.f), live, sum)));
      apply_block(st.data(), cn, vh + kstart * ldv, ldv, inv, m, oh + q0 * ldo, ldo, DV);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("window_forward", &window_forward, "fused sliding-window attention, inference (float32, AVX-512)");
}
