// Fused sliding-window softmax attention for the CPU (float32, AVX-512), forward and backward: the compiled
// fast path of local:W, dilated:W:D (its residue streams, in place), longformer:W:G, bigbird:W:G:R's causal form,
// fixed:S, and strided:S (its columns: Columns; their backward as dilated's streams); and, further down, the linear family's causal forward and
// backward (linear_forward, linear_backward), a depthwise convolution along the tokens (dwconv_forward) and hydra (hydra_forward).  Loaded by
// supernet/attention/native.py.
//
// Query i attends the keys j with i - before <= j <= i + after (0 <= j < T): causal local:W is
// (before, after) = (W-1, 0), its bidirectional form (W-1, W-1); also the first G keys where j <= i + gaft
// (global keys), and for bigbird the blocks of keys its block picked.  Every query sees itself: no row is empty.
//
// Per (batch, head) and block of 16 queries, without a score matrix in memory:
//   QT    = the block's queries transposed (D x 16), scaled by 1/sqrt(D): one register per feature,
//   ST    = scores of the block's keys, key-major (keys x 16 lanes), in segments of consecutive keys (global keys,
//           picked blocks, the window range): 16 keys x 16 queries per tile, a broadcast key element times a QT
//           register,
//   P     = exp(ST - row max) under the mask, vectorised across the 16 queries, normalised at the end,
//   out   = P V, 4 query rows x Dv at a time in registers, skipping the keys outside a row group's window band.
// The backward recomputes P from the row log-sum-exp the forward kept, and accumulates dK and dV over the blocks of
// a head in order.  The block engine (blocks.py) computes the same with batched GEMMs and a softmax over a scores
// buffer; this kernel takes about half its time forward at 4k tokens (one thread).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace {

constexpr int MQ = 16;  // queries per block: the lanes of one AVX-512 float32 register
constexpr int64_t WIDE = int64_t(1) << 40;  // a product range that limits nothing

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

// ST[c][r] = sum_d K[c][d] QT[d][r] for NK keys (rows of K, ldk apart; LD > 0: ldk == D == LD, known when
// compiling, so that the NK broadcasts of a feature address one pointer at constant offsets instead of NK row
// pointers, more than the registers there are).  Not inlined: in its own frame the accumulators stay in registers.
template <int NK, int LD>
__attribute__((noinline)) void score_tile(const float* K, int64_t ldk, const float* QT, int64_t D, float* ST) {
  const int64_t ld = LD > 0 ? LD : ldk, depth = LD > 0 ? LD : D;
  __m512 acc[NK];
  for (int c = 0; c < NK; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    const __m512 qv = _mm512_loadu_ps(QT + d * MQ);
    for (int c = 0; c < NK; ++c) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(K[c * ld + d]), qv, acc[c]);
  }
  for (int c = 0; c < NK; ++c) _mm512_storeu_ps(ST + c * MQ, acc[c]);
}

// O[i] = (accumulate ? O[i] : 0) + s_i * sum_j A[i * ra + j * ja] X[j] for rows i < rows, over 0 <= j < n and
// i + jlo <= j <= i + jhi (the window: A is 0 outside it, so its products are skipped), with s_i = rs[i] (rs
// given) or alpha; X's and O's rows NV registers wide, RB rows of O at a time in registers; `stream` (not
// accumulating, O's rows 64-byte aligned: streamable): non-temporal stores, which write a line without reading it
// from memory first (O written once, not read again by the kernel).  The
// forward's weighted sum is (A = P^T: ra 1, ja 16; rs = 1 / row sums); the backward's dQ (A = dS^T, the
// same layout) and dK, dV (A = dS^T, P^T read the other way: ra 16, ja 1; accumulated over query blocks).
template <int NV, int RB>
__attribute__((noinline)) void rows_product(const float* A, int64_t ra, int64_t ja, int64_t rows, int64_t n, const float* X,
                                            int64_t ldx, const float* rs, float alpha, bool accumulate, float* O,
                                            int64_t ldo, int64_t jlo, int64_t jhi, bool stream) {
  for (int64_t i0 = 0; i0 < rows; i0 += RB) {
    const int rn = (int)std::min<int64_t>(RB, rows - i0);
    const int64_t j0 = std::max<int64_t>(0, i0 + jlo), j1 = std::min<int64_t>(n, i0 + rn - 1 + jhi + 1);
    __m512 acc[RB][NV];
    for (int a = 0; a < RB; ++a)
      for (int b = 0; b < NV; ++b) acc[a][b] = _mm512_setzero_ps();
    const float* arow[RB];
    for (int a = 0; a < RB; ++a) arow[a] = A + (i0 + (a < rn ? a : 0)) * ra;
    for (int64_t j = j0; j < j1; ++j) {
      const float* xr = X + j * ldx;
      __m512 xv[NV];
      for (int b = 0; b < NV; ++b) xv[b] = _mm512_loadu_ps(xr + b * 16);
      for (int a = 0; a < RB; ++a) {
        const __m512 p = _mm512_set1_ps(arow[a][j * ja]);
        for (int b = 0; b < NV; ++b) acc[a][b] = _mm512_fmadd_ps(p, xv[b], acc[a][b]);
      }
    }
    for (int a = 0; a < rn; ++a) {
      float* orow = O + (i0 + a) * ldo;
      const __m512 sv = _mm512_set1_ps(rs ? rs[i0 + a] : alpha);
      for (int b = 0; b < NV; ++b) {
        if (stream) {
          _mm512_stream_ps(orow + b * 16, _mm512_mul_ps(acc[a][b], sv));
        } else {
          const __m512 base = accumulate ? _mm512_loadu_ps(orow + b * 16) : _mm512_setzero_ps();
          _mm512_storeu_ps(orow + b * 16, _mm512_fmadd_ps(acc[a][b], sv, base));
        }
      }
    }
  }
}

void product(const float* A, int64_t ra, int64_t ja, int64_t rows, int64_t n, const float* X, int64_t ldx, const float* rs,
             float alpha, bool accumulate, float* O, int64_t ldo, int64_t width, int64_t jlo, int64_t jhi,
             bool stream = false) {
  switch (width / 16) {
    case 1: rows_product<1, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 2: rows_product<2, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 3: rows_product<3, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 4: rows_product<4, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    default: rows_product<8, 2>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;  // 128
  }
}

// A (B, H, T, X) output whose rows may be written with streaming stores (rows_product's `stream`): too large to stay
// in a core's L2 cache anyway (a smaller one is left in cache for what reads it next), rows a multiple of 64 bytes
// apart; a block streams where its first row is 64-byte aligned (`aligned`).
constexpr int64_t STREAM_BYTES = int64_t(2) << 20;
bool streaming(const at::Tensor& t) { return t.numel() * 4 >= STREAM_BYTES && t.stride(2) % 16 == 0; }
bool aligned(const float* p) { return (reinterpret_cast<uintptr_t>(p) & 63) == 0; }

// Rows j0 .. j1 - 1 (ld apart, `width` floats each) into L2: what the next block reads.  A block's work is a few
// microseconds; the hardware's prefetcher alone leaves it waiting on the rows it meets (a kernel reading from L2
// runs about 1.4x as fast as one that streams its head from memory, 4k tokens, one thread).
void prefetch_rows(const float* x, int64_t ld, int64_t j0, int64_t j1, int64_t width) {
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t d = 0; d < width; d += 16) _mm_prefetch(reinterpret_cast<const char*>(x + j * ld + d), _MM_HINT_T1);
  }
}

// Scores of keys K[0 .. cn) (rows ldk apart) against a block's transposed queries QT (D x 16): ST[c][r], tiles
// of 16, 4, 1 keys.
template <int LD>
void scores_of(const float* K, int64_t ldk, int64_t cn, const float* QT, int64_t D, float* ST) {
  int64_t c = 0;
  for (; c + 16 <= cn; c += 16) score_tile<16, LD>(K + c * ldk, ldk, QT, D, ST + c * MQ);
  for (; c + 4 <= cn; c += 4) score_tile<4, LD>(K + c * ldk, ldk, QT, D, ST + c * MQ);
  for (; c < cn; ++c) score_tile<1, LD>(K + c * ldk, ldk, QT, D, ST + c * MQ);
}

void scores(const float* K, int64_t ldk, int64_t cn, const float* QT, int64_t D, float* ST) {
  if (ldk == D) {  // rows back to back (a contiguous head): the stride known when compiling
    switch (D) {
      case 16: return scores_of<16>(K, ldk, cn, QT, D, ST);
      case 32: return scores_of<32>(K, ldk, cn, QT, D, ST);
      case 48: return scores_of<48>(K, ldk, cn, QT, D, ST);
      case 64: return scores_of<64>(K, ldk, cn, QT, D, ST);
      case 128: return scores_of<128>(K, ldk, cn, QT, D, ST);
    }
  }
  scores_of<0>(K, ldk, cn, QT, D, ST);
}

// What a query sees: keys i - before .. i + after (the window), the first G keys where j <= i + gaft (global
// keys: longformer, bigbird), and for bigbird the R blocks of `width` keys that its block of `width` queries
// picked (picks[block][r]: a block index, -1 for none; they lie before the window; keys under G are the global
// rule's).  fixed:S (S > 0, a multiple of 16): the window stops at the start of the query's block of S keys, and
// the last key of every earlier block of S is seen too (the summaries: a segment of keys S apart).
struct Pattern {
  int64_t T, G;
  int32_t bef, aft, gaft;
  const int64_t* picks;  // (ceil(T / width), R) or null
  int64_t R, width;
  int64_t S;
};

constexpr int MAX_SEGMENTS = 3 + 8;  // global keys or summaries, up to 8 picked blocks, the window
enum Kind { GLOBAL, PICKED, WINDOW, SUMMARY };
struct Segment {
  int64_t start, count, row;  // keys start, start+step, ... (count of them), at row `row` of the block's scores buffer
  Kind kind;
  int64_t step;
};

// A block of 16 queries and the keys it sees, as segments of consecutive keys scored into one buffer of
// n rows: the global keys before the window range, the picked blocks, the window range (widened to whole
// tiles of 16 where the sequence allows: the mask hides the extra keys).  mask[row]: the lanes that see it.
struct Block {
  int64_t q0, m, kstart, cn;
  Segment seg[MAX_SEGMENTS];
  int nseg = 0;
  int64_t n = 0;  // rows
  bool overlap;   // global keys inside the window range: its products are not limited to the window's band
  __mmask16 live;
  Block(int64_t blk, const Pattern& pt, __mmask16* mask) {
    const int64_t T = pt.T;
    q0 = blk * MQ;
    m = std::min<int64_t>(MQ, T - q0);
    const int64_t sb = pt.S ? q0 / pt.S * pt.S : 0;  // fixed: the start of the block of S the queries are in
    int64_t ks = std::max<int64_t>(sb, q0 - pt.bef), ke = std::min<int64_t>(T, q0 + m + pt.aft);
    const int64_t want = (ke - ks + 15) / 16 * 16;
    ks = std::max<int64_t>(0, ke - want);
    ke = std::min<int64_t>(T, ks + want);
    kstart = ks;
    cn = ke - ks;
    overlap = pt.G > kstart;
    live = (__mmask16)(m >= 16 ? 0xFFFFu : ((1u << m) - 1u));
    const int64_t gn = std::min(pt.G, kstart);
    if (gn) add(0, gn, GLOBAL);
    if (sb > 0) add(pt.S - 1, sb / pt.S, SUMMARY, pt.S);
    if (pt.picks) {
      const int64_t* row = pt.picks + (q0 / pt.width) * pt.R;
      for (int64_t r = 0; r < pt.R; ++r) {
        if (row[r] >= 0) add(row[r] * pt.width, pt.width, PICKED);
      }
    }
    add(kstart, cn, WINDOW);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lo = _mm512_sub_epi32(lane, _mm512_set1_epi32(pt.bef));  // r - before <= j - q0 <= r + after
    const __m512i hi = _mm512_add_epi32(lane, _mm512_set1_epi32(pt.aft));
    const __m512i ghi = _mm512_add_epi32(lane, _mm512_set1_epi32(pt.gaft));  // global: j < G, j - q0 <= r + gaft
    for (int s = 0; s < nseg; ++s) {
      const Segment& g = seg[s];
      for (int64_t c = 0; c < g.count; ++c) {
        const int64_t j = g.start + c * g.step;
        const __m512i rel = _mm512_set1_epi32((int32_t)(j - q0));
        __mmask16 ok = 0;
        if (g.kind == WINDOW && j >= sb) ok = _mm512_cmple_epi32_mask(lo, rel) & _mm512_cmpge_epi32_mask(hi, rel);
        if (g.kind == SUMMARY) ok = 0xFFFF;  // before every lane's block
        if (g.kind != PICKED && j < pt.G) ok |= _mm512_cmpge_epi32_mask(ghi, rel);
        if (g.kind == PICKED && j >= pt.G) ok = 0xFFFF;  // a picked block lies before every lane's window
        mask[g.row + c] = ok & live;
      }
    }
  }
  void add(int64_t start, int64_t count, Kind kind, int64_t step = 1) {
    seg[nseg++] = Segment{start, count, n, kind, step};
    n += count;
  }
  // the window segment's products: query r sees the keys c in [r + lo, r + hi] (key c: queries c - hi .. c - lo);
  // other segments, or global keys in the window range: any query any key
  int64_t band_lo(const Segment& g, int32_t bef) const { return g.kind == WINDOW && !overlap ? q0 - kstart - bef : -WIDE; }
  int64_t band_hi(const Segment& g, int32_t aft) const { return g.kind == WINDOW && !overlap ? q0 - kstart + aft : WIDE; }
};

// The softmax numerators of n rows of scores (16 lanes each), in place: per lane the maximum over the rows its mask
// lets it see (lanes outside `live`, past the sequence: 0, not -inf), then ST[c] = exp(ST[c] - max) where seen, else
// 0.  Returns the lanes' sums; `mx` gets the maxima.
__m512 masked_exp(float* st, const __mmask16* mask, int64_t n, __mmask16 live, __m512& mx) {
  mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < n; ++c) mx = _mm512_mask_max_ps(mx, mask[c], mx, _mm512_loadu_ps(st + c * MQ));
  mx = _mm512_mask_mov_ps(_mm512_setzero_ps(), live, mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; ++c) {
    float* row = st + c * MQ;
    const __m512 e = _mm512_maskz_mov_ps(mask[c], exp512(_mm512_sub_ps(_mm512_loadu_ps(row), mx)));
    _mm512_storeu_ps(row, e);
    sum = _mm512_add_ps(sum, e);
  }
  return sum;
}

// The 16 query rows of a block (rows past m repeat row 0: finite, and masked out)
void block_rows(const float* x, int64_t ld, const Block& bl, const float** rows) {
  for (int r = 0; r < MQ; ++r) rows[r] = x + (bl.q0 + (r < bl.m ? r : 0)) * ld;
}

void transpose_rows(const float* const* rows, int64_t D, float sc, float* dst) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) transpose16(rows, d0, sc, dst + d0 * MQ);
}

struct View {  // a (B, H, T, X) float tensor's pointer and strides
  float* p;
  int64_t s0, s1, s2;
  explicit View(const at::Tensor& t) : p(t.data_ptr<float>()), s0(t.stride(0)), s1(t.stride(1)), s2(t.stride(2)) {}
  float* head(int64_t b, int64_t h) const { return p + b * s0 + h * s1; }
  View stream(int64_t r, int64_t step) const {  // rows r, r + step, r + 2 step, ... (a residue stream: dilated)
    View s = *this;
    s.p += r * s2;
    s.s2 *= step;
    return s;
  }
};

// Every kernel's operands: float32 on the CPU, the last stride 1.
void check_layout(const char* what, std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->stride(-1) == 1, what, ": float32 CPU, last stride 1");
  }
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && out.sizes() == v.sizes(), "window attention: shapes");
  TORCH_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2), "window attention: v's shape");
  check_layout("window attention", {&q, &k, &v, &out});
  for (int64_t x : {q.size(3), v.size(3)}) {
    TORCH_CHECK(x % 16 == 0 && (x <= 64 || x == 128), "window attention: head sizes 16, 32, 48, 64 or 128");
  }
}

}  // namespace

Pattern pattern(int64_t T, int64_t before, int64_t after, int64_t globals, int64_t global_after, const at::Tensor& picks,
                int64_t width, int64_t blocks, int64_t columns) {
  TORCH_CHECK(columns >= 0 && (columns == 0 || (globals == 0 && picks.numel() == 0 && blocks == 0 && before < columns && after == 0)),
              "window attention: columns (strided) alone, causal, the window shorter than the stride");
  TORCH_CHECK(before >= 0 && after >= -1 && globals >= 0 && global_after >= 0, "window attention: window");
  TORCH_CHECK(blocks >= 0 && blocks % MQ == 0 && (blocks == 0 || (globals == 0 && picks.numel() == 0)),
              "window attention: blocks (fixed) a multiple of 16, without global keys or picks");
  Pattern p{T, std::min(globals, T), (int32_t)std::min(before, T), (int32_t)std::min(after, T),
            (int32_t)std::min(global_after, T), nullptr, 0, 1, blocks};
  if (picks.numel() > 0) {
    TORCH_CHECK(picks.scalar_type() == at::kLong && picks.dim() == 2 && picks.is_contiguous() && width % MQ == 0 &&
                    picks.size(0) >= (T + width - 1) / width && picks.size(1) <= 8,
                "window attention: picks (blocks, R <= 8) int64, width a multiple of 16");
    p.picks = picks.data_ptr<int64_t>();
    p.R = picks.size(1);
    p.width = width;
  }
  return p;
}

// The pattern on each of the residue streams r, r + step, ... (r < min(step, T); one stream where step is 1): their
// lengths differ by one at most, stream 0 the longest.
std::vector<Pattern> stream_patterns(int64_t T, int64_t step, int64_t before, int64_t after, int64_t globals,
                                     int64_t global_after, const at::Tensor& picks, int64_t width, int64_t blocks,
                                     int64_t columns) {
  std::vector<Pattern> pats;
  for (int64_t r = 0; r < std::min(step, T); ++r) {
    pats.push_back(pattern((T - r + step - 1) / step, before, after, globals, global_after, picks, width, blocks, columns));
  }
  return pats;
}

int64_t most_rows(const Pattern& p) {  // rows a block's scores buffer can need
  return (std::min<int64_t>(p.bef + p.aft, p.T) + MQ + 15) / 16 * 16 + 16 + p.G + p.R * p.width + (p.S ? p.T / p.S : 0);
}

// strided:C's columns (keys i - C, i - 2C, ...) of the queries of one span of 16 C tokens, t0 = 16 C sb ..: per residue
// c < C the stream of rows c, c + C, c + 2C, ..., where stream query s sees the stream keys 0 .. s - 1 (causal
// attention within the stream without its diagonal); the span holds stream queries 16 sb .. 16 sb + 15 of every stream.
// One block of 16 stream queries against their keys in tiles (a key row serves 16 queries, where scoring each query's
// columns alone streams every column row from L2 once per query).  Per span row (token t0 + row): acc (unnormalised,
// DV wide), mx (the row's column maximum, -inf for a row without columns: tokens below C) and sum.
struct Columns {
  int64_t C, span;
  std::vector<float> acc, mx, sum, st;
  std::vector<__mmask16> mask;
  Columns(int64_t C_, int64_t T, int64_t DV) : C(C_), span(std::min(MQ * C_, T)), acc(span * DV), mx(span), sum(span),
                                             st(((T + C_ - 1) / C_) * MQ), mask((T + C_ - 1) / C_) {}
  void run(const float* qh, int64_t ldq, const float* kh, int64_t ldk, const float* vh, int64_t ldv, int64_t T,
           int64_t D, int64_t DV, int64_t sb, float scale, float* qt) {
    const int64_t t0 = sb * MQ * C;
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t c = 0; c < C; ++c) {
      const int64_t n = (T - c + C - 1) / C, s0 = std::max<int64_t>(1, sb * MQ), s1 = std::min(n, sb * MQ + MQ);
      if (s0 >= s1) continue;
      // queries s0 .. s1 - 1, keys 0 .. s1 - 2 rounded up to whole tiles of 16 where the stream allows (masked)
      const int64_t m = s1 - s0, kn = std::min(n, (s1 - 1 + 15) / 16 * 16);
      const float* rows[MQ];
      for (int r = 0; r < MQ; ++r) rows[r] = qh + (c + (s0 + (r < m ? r : 0)) * C) * ldq;
      transpose_rows(rows, D, scale, qt);
      scores(kh + c * ldk, ldk * C, kn, qt, D, st.data());
      const __mmask16 live = (__mmask16)(m >= 16 ? 0xFFFFu : ((1u << m) - 1u));
      const __m512i seen = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)s0));  // lane r: keys j < s0 + r
      for (int64_t j = 0; j < kn; ++j) mask[j] = _mm512_cmpgt_epi32_mask(seen, _mm512_set1_epi32((int32_t)j)) & live;
      __m512 top;
      const __m512 total = masked_exp(st.data(), mask.data(), kn, live, top);
      const int64_t row0 = c + s0 * C - t0;  // the span row of stream query s0; the next ones C rows apart
      product(st.data(), 1, MQ, m, kn, vh + c * ldv, ldv * C, nullptr, 1.f, false, acc.data() + row0 * DV, C * DV, DV,
              -WIDE, s0 - 1);
      alignas(64) float tv[MQ], sv[MQ];
      _mm512_store_ps(tv, top);
      _mm512_store_ps(sv, total);
      for (int64_t r = 0; r < m; ++r) mx[row0 + r * C] = tv[r], sum[row0 + r * C] = sv[r];
    }
  }
};

// One block of 16 queries (window_forward's work): scores of its key segments, softmax, P V into out, the lse if
// L; with `col` (strided), the block's column rows (at span row cr) join the softmax.
void window_block(const Pattern& pat, const View& Q, const View& K, const View& V, const View& O, const View* L, int64_t b,
                  int64_t h, int64_t blk, int64_t D, int64_t DV, float scale, float* st, float* qt,
                  __mmask16* mask, const Columns* col, int64_t cr, const float* sk, const float* sv, bool big) {
  const int64_t T = pat.T;
  const Block bl(blk, pat, mask);
  const float* vh = V.head(b, h);
  {  // the next block's queries, and the key and value rows it adds
    const int64_t first = std::min(T, bl.kstart + bl.cn), last = std::min(T, first + MQ);
    prefetch_rows(K.head(b, h), K.s2, first, last, D);
    prefetch_rows(vh, V.s2, first, last, DV);
    prefetch_rows(Q.head(b, h), Q.s2, bl.q0 + MQ, std::min(T, bl.q0 + 2 * MQ), D);
  }
  const float* rows[MQ];
  block_rows(Q.head(b, h), Q.s2, bl, rows);
  transpose_rows(rows, D, scale, qt);
  for (int s = 0; s < bl.nseg; ++s) {
    const Segment& g = bl.seg[s];
    if (g.kind == SUMMARY && sk) scores(sk, D, g.count, qt, D, st + g.row * MQ);  // gathered: rows S apart alias in cache
    else scores(K.head(b, h) + g.start * K.s2, K.s2 * g.step, g.count, qt, D, st + g.row * MQ);
  }
  __m512 mx;
  __m512 sum = masked_exp(st, mask, bl.n, bl.live, mx);
  alignas(64) float inv[MQ], cw[MQ], lse_[MQ], mxv[MQ], sums[MQ];
  __m512 whole = mx;  // the row's maximum over window and columns
  if (col) {  // rows past T: mx and sum 0 (finite), weight 0
    const __m512 cm = _mm512_maskz_loadu_ps(bl.live, col->mx.data() + cr), cs = _mm512_maskz_loadu_ps(bl.live, col->sum.data() + cr);
    whole = _mm512_max_ps(mx, cm);
    const __m512 aw = exp512(_mm512_sub_ps(mx, whole)), ac = exp512(_mm512_sub_ps(cm, whole));
    const __m512 cmask = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(cm, _mm512_set1_ps(-1e30f), _CMP_GT_OQ), ac);  // no columns: 0
    sum = _mm512_fmadd_ps(aw, sum, _mm512_mul_ps(cmask, cs));
    sum = _mm512_mask_mov_ps(_mm512_set1_ps(1.f), bl.live, sum);
    const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.f), sum);
    _mm512_store_ps(inv, _mm512_mul_ps(aw, r));
    _mm512_store_ps(cw, _mm512_mul_ps(cmask, r));
  } else {
    sum = _mm512_mask_mov_ps(_mm512_set1_ps(1.f), bl.live, sum);
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), sum));
  }
  if (L) {
    _mm512_store_ps(mxv, whole);
    _mm512_store_ps(sums, sum);
    for (int64_t r = 0; r < bl.m; ++r) lse_[r] = mxv[r] + std::log(sums[r]);
    float* lh = L->head(b, h) + bl.q0 * L->s2;
    for (int64_t r = 0; r < bl.m; ++r) lh[r * L->s2] = lse_[r];
  }
  float* ob = O.head(b, h) + bl.q0 * O.s2;
  // one product: the rows' final values (big: the output is larger than L2, and aligned)
  const bool stream = big && bl.nseg == 1 && !col && aligned(ob);
  for (int s = 0; s < bl.nseg; ++s) {
    const Segment& g = bl.seg[s];
    const bool gathered = g.kind == SUMMARY && sv;
    product(st + g.row * MQ, 1, MQ, bl.m, g.count, gathered ? sv : vh + g.start * V.s2, gathered ? DV : V.s2 * g.step, inv, 1.f,
            s > 0, ob, O.s2, DV, bl.band_lo(g, pat.bef), bl.band_hi(g, pat.aft), stream);
  }
  for (int64_t r = 0; col && r < bl.m; ++r) {
    if (cw[r] == 0.f) continue;  // no columns (or none that count): acc not written
    const __m512 w = _mm512_set1_ps(cw[r]);
    const float* a = col->acc.data() + (cr + r) * DV;
    float* o = ob + r * O.s2;
    for (int64_t e = 0; e < DV; e += 16) _mm512_storeu_ps(o + e, _mm512_fmadd_ps(_mm512_loadu_ps(a + e), w, _mm512_loadu_ps(o + e)));
  }
}

// q, k (B, H, T, D), v and out (B, H, T, Dv): float32 on the CPU, any strides with the last one 1; D and Dv
// one of 16, 32, 48, 64, 128.  lse (B, H, T), contiguous, or empty: the log of each row's softmax
// denominator (scores scaled), which the backward needs.  strided (columns C): per span of 16 C tokens, the columns
// of its queries first, then its blocks, so that the column rows are in cache when the blocks take them in.
// step > 1 (dilated): the pattern on each residue stream r, r + step, ... (rows step apart), block sb of
// every stream in turn (their keys lie in one stretch of the head: it stays in cache, where a stream at a time
// reads the whole head once per stream).
void window_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
                    int64_t before, int64_t after, int64_t globals, int64_t global_after, const at::Tensor& picks,
                    int64_t width, int64_t blocks, int64_t columns, int64_t step) {
  check(q, k, v, out);
  TORCH_CHECK(after >= 0, "window attention: every query sees itself (after >= 0)");
  const bool keep = lse.numel() > 0;
  TORCH_CHECK(!keep || (lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2)), "window attention: lse");
  TORCH_CHECK(step >= 1 && (step == 1 || columns == 0), "window attention: step (dilation) >= 1, without columns");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  if (T == 0 || B * H == 0) return;
  const std::vector<Pattern> pats = stream_patterns(T, step, before, after, globals, global_after, picks, width, blocks, columns);
  const int64_t streams = pats.size();
  const View Q(q), K(k), V(v), O(out), L(keep ? lse : q);  // L: (B, H, T) log-sum-exps, read where kept
  const int64_t nb = (pats[0].T + MQ - 1) / MQ;  // stream 0's blocks: the most
  const int64_t most = most_rows(pats[0]);
  const float scale = 1.f / std::sqrt((float)D);
  const int64_t per = columns ? (std::min(MQ * columns, T) + MQ - 1) / MQ : 1;  // blocks per task
  const int64_t tasks = (nb + per - 1) / per;
  const bool big = streaming(out);
  at::parallel_for(0, B * H * tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> st(most * MQ), qt(D * MQ);
    std::vector<__mmask16> mask(most);
    std::unique_ptr<Columns> col(columns ? new Columns(columns, T, DV) : nullptr);
    // fixed: the summaries (keys S - 1, 2 S - 1, ...) of head `gathered` back to back, K's and V's
    const bool summaries = blocks > 0 && step == 1;
    std::vector<float> sk(summaries ? T / blocks * D : 0), sv(summaries ? T / blocks * DV : 0);
    int64_t gathered = -1;
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / (H * tasks), h = (w / tasks) % H, sp = w % tasks, blk0 = sp * per;
      if (summaries && gathered != b * H + h) {
        gathered = b * H + h;
        for (int64_t j = 0; j < T / blocks; ++j) {
          const float *kr = K.head(b, h) + ((j + 1) * blocks - 1) * K.s2, *vr = V.head(b, h) + ((j + 1) * blocks - 1) * V.s2;
          std::copy(kr, kr + D, sk.data() + j * D);
          std::copy(vr, vr + DV, sv.data() + j * DV);
        }
      }
      if (col) col->run(Q.head(b, h), Q.s2, K.head(b, h), K.s2, V.head(b, h), V.s2, T, D, DV, sp, scale, qt.data());
      for (int64_t r = 0; r < streams; ++r) {
        const Pattern& pat = pats[r];
        const View Qr = Q.stream(r, step), Kr = K.stream(r, step), Vr = V.stream(r, step), Or = O.stream(r, step);
        const View Lr = L.stream(r, step);
        for (int64_t blk = blk0; blk < std::min((pat.T + MQ - 1) / MQ, blk0 + per); ++blk) {
          window_block(pat, Qr, Kr, Vr, Or, keep ? &Lr : nullptr, b, h, blk, D, DV, scale, st.data(), qt.data(), mask.data(), col.get(), (blk - blk0) * MQ,
                       summaries ? sk.data() : nullptr, summaries ? sv.data() : nullptr, big);
        }
      }
    }
    _mm_sfence();  // the streamed stores seen by whichever thread reads out next
  });
}

// Gradients of window_forward: dq, dk, dv (written), all (B, H, T, .) with the last stride 1.  P = exp(S - lse)
// recomputed per block; dS = P * (dP - rowsum(dO * O)); one (b, h) per task, its blocks in order (dk and dv rows
// are shared by neighbouring blocks: accumulated, each zeroed when a block first reaches it); step > 1 (dilated):
// block blk of every residue stream in turn, as the forward (each stream's rows in place, its own zeroing front).
// The forward's output is not needed: rowsum(dO * O) = sum over keys of P dP.  `delta` (B, H, T), when not empty: that
// row sum given, for a softmax over more keys than the pattern's (strided: lse the joint one of its window and columns),
// whose keys then get their exact share.  after = -1 (the backward only): keys strictly before the query (strided's
// columns: each residue stream, step S, with before >= T).  `accumulate`: dq, dk, dv added to, not written (strided's
// columns onto its window's gradients).
void window_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
                     const at::Tensor& dout, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, int64_t before,
                     int64_t after, int64_t globals, int64_t global_after, const at::Tensor& picks, int64_t width,
                     int64_t blocks, int64_t columns, int64_t step, const at::Tensor& delta, bool accumulate) {
  TORCH_CHECK(columns == 0 && step >= 1, "window attention backward: no columns (strided's: delta), step >= 1");
  check(q, k, v, dout);
  check(dq, dk, dv, dv);
  TORCH_CHECK(dq.sizes() == q.sizes() && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2),
              "window attention backward: shapes");
  const bool given = delta.numel() > 0;  // rowsum(dO * O) of a softmax that spans more keys than these (strided)
  TORCH_CHECK(!given || (delta.is_contiguous() && delta.scalar_type() == at::kFloat && delta.numel() == lse.numel()),
              "window attention backward: delta (B, H, T) float32 contiguous");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  if (T == 0 || B * H == 0) return;
  const std::vector<Pattern> pats = stream_patterns(T, step, before, after, globals, global_after, picks, width, blocks, 0);
  const int64_t streams = pats.size();
  const View Q0(q), K0(k), V0(v), dO0(dout), dQ0(dq), dK0(dk), dV0(dv), L0(lse), R0(given ? delta : lse);
  const int64_t most = most_rows(pats[0]), nb = (pats[0].T + MQ - 1) / MQ;  // stream 0's blocks: the most
  const float scale = 1.f / std::sqrt((float)D);
  const bool big = streaming(dq) && !accumulate;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> pt(most * MQ), dst(most * MQ), qt(D * MQ), dot(DV * MQ);
    std::vector<__mmask16> mask(most);
    std::vector<int64_t> reached(streams);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / H, h = w % H;
      std::fill(reached.begin(), reached.end(), 0);
      for (int64_t blk = 0; blk < nb; ++blk) {
        for (int64_t r = 0; r < streams && blk * MQ < pats[r].T; ++r) {  // block blk of every stream in turn
          const Pattern& pat = pats[r];
          const int64_t T = pat.T;
          const View Q = Q0.stream(r, step), K = K0.stream(r, step), V = V0.stream(r, step), dO = dO0.stream(r, step);
          const View dQ = dQ0.stream(r, step), dK = dK0.stream(r, step), dV = dV0.stream(r, step), L = L0.stream(r, step);
          const View Rs = R0.stream(r, step);
          const float *qh = Q.head(b, h), *kh = K.head(b, h), *vh = V.head(b, h), *gh = dO.head(b, h), *lh = L.head(b, h);
          float *dkh = dK.head(b, h), *dvh = dV.head(b, h);
          int64_t& fresh = reached[r];  // key rows below this one hold gradient already
          const Block bl(blk, pat, mask.data());
          {  // the next block's queries and output gradients, and the key and value rows it adds
            const int64_t first = std::min(T, bl.kstart + bl.cn), last = std::min(T, first + MQ);
            const int64_t next = bl.q0 + MQ, end = std::min(T, next + MQ);
            prefetch_rows(kh, K.s2, first, last, D);
            prefetch_rows(vh, V.s2, first, last, DV);
            prefetch_rows(qh, Q.s2, next, end, D);
            prefetch_rows(gh, dO.s2, next, end, DV);
          }
          const float *qrows[MQ], *grows[MQ];  // (rows past m repeat row 0)
          block_rows(qh, Q.s2, bl, qrows);
          block_rows(gh, dO.s2, bl, grows);
          transpose_rows(qrows, D, scale, qt.data());
          transpose_rows(grows, DV, 1.f, dot.data());
          alignas(64) float lsev[MQ] = {0};
          for (int64_t i = 0; i < bl.m; ++i) lsev[i] = lh[(bl.q0 + i) * L.s2];
          const __m512 lsel = _mm512_load_ps(lsev);
          for (int s = 0; s < bl.nseg; ++s) {  // S^T and dP^T
            const Segment& g = bl.seg[s];
            scores(kh + g.start * K.s2, K.s2 * g.step, g.count, qt.data(), D, pt.data() + g.row * MQ);
            scores(vh + g.start * V.s2, V.s2 * g.step, g.count, dot.data(), DV, dst.data() + g.row * MQ);
          }
          // P = exp(S - lse); rowsum(dO * O) = sum_c P dP (from the buffers in cache, not a pass over O), or `delta`
          __m512 di = _mm512_setzero_ps();
          for (int64_t c = 0; c < bl.n; ++c) {
            const __m512 p = _mm512_maskz_mov_ps(mask[c], exp512(_mm512_sub_ps(_mm512_loadu_ps(pt.data() + c * MQ), lsel)));
            _mm512_storeu_ps(pt.data() + c * MQ, p);
            di = _mm512_fmadd_ps(p, _mm512_loadu_ps(dst.data() + c * MQ), di);
          }
          if (given) {
            alignas(64) float dv_[MQ] = {0};
            const float* rh = Rs.head(b, h);
            for (int64_t i = 0; i < bl.m; ++i) dv_[i] = rh[(bl.q0 + i) * Rs.s2];
            di = _mm512_load_ps(dv_);
          }
          for (int64_t c = 0; c < bl.n; ++c) {  // dS = P * (dP - rowsum)
            const __m512 p = _mm512_loadu_ps(pt.data() + c * MQ);
            _mm512_storeu_ps(dst.data() + c * MQ, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dst.data() + c * MQ), di)));
          }
          // key rows no earlier block reached start at zero (window ranges only move forward; global keys and
          // picked blocks lie before the window range, in rows the first blocks' windows zeroed)
          for (int64_t j = std::max(fresh, bl.kstart); j < bl.kstart + bl.cn && !accumulate; ++j) {
            std::fill_n(dkh + j * dK.s2, D, 0.f);
            std::fill_n(dvh + j * dV.s2, DV, 0.f);
          }
          fresh = std::max(fresh, bl.kstart + bl.cn);
          // dQ[r] = scale * sum_c dS^T[c][r] K[c];  dK[c] += scale * sum_r dS^T[c][r] Q[r];  dV[c] += sum_r P^T[c][r] dO[r]
          float* dqb = dQ.head(b, h) + bl.q0 * dQ.s2;
          for (int s = 0; s < bl.nseg; ++s) {
            const Segment& g = bl.seg[s];
            const int64_t lo = bl.band_lo(g, pat.bef), hi = bl.band_hi(g, pat.aft);
            const float *ds = dst.data() + g.row * MQ, *p = pt.data() + g.row * MQ;
            product(ds, 1, MQ, bl.m, g.count, kh + g.start * K.s2, K.s2 * g.step, nullptr, scale, accumulate || s > 0, dqb, dQ.s2, D, lo, hi,
                    big && bl.nseg == 1 && aligned(dqb));
            product(ds, MQ, 1, g.count, bl.m, qh + bl.q0 * Q.s2, Q.s2, nullptr, scale, true, dkh + g.start * dK.s2, dK.s2 * g.step,
                    D, -hi, -lo);
            product(p, MQ, 1, g.count, bl.m, gh + bl.q0 * dO.s2, dO.s2, nullptr, 1.f, true, dvh + g.start * dV.s2, dV.s2 * g.step,
                    DV, -hi, -lo);
          }
        }
      }
      for (int64_t r = 0; r < streams && !accumulate; ++r) {  // key rows no query saw (after = -1: a stream's last key): 0
        const View dK = dK0.stream(r, step), dV = dV0.stream(r, step);
        for (int64_t j = reached[r]; j < pats[r].T; ++j) {
          std::fill_n(dK.head(b, h) + j * dK.s2, D, 0.f);
          std::fill_n(dV.head(b, h) + j * dV.s2, DV, 0.f);
        }
      }
    }
    _mm_sfence();
  });
}

// Causal kernelized (linear) attention of queries and keys q, k (B, H, T, F) and values v (B, H, T, Dv):
//   out_i (+)= sum_{j<=i} (fq_i . fk_j) v_j / (sum_{j<=i} fq_i . fk_j + eps)   (normalize; else the numerator alone),
// the forward of linear, relu-linear, cosformer, performer, sima and msla, with the feature map fq = phi(q), fk = phi(k)
// applied here, elementwise (FEATURE_*), or already (FEATURE_NONE).  Per (batch, head), blocks of 16 tokens in order,
// with the running state of the tokens before the block, S = sum_j fk_j v_j^T (F x Dv) and z = sum_j fk_j:
//   the block's fq and fk rows mapped into buffers in cache,
//   A   = the block's scores fq . fk, key-major as the window kernel's, zero where the key comes after the query,
//   den = row sums of A + fq . z,
//   out = (A V + fq S) / den;   then S += fk^T V and z += the block's fk, for the next block.
// F a multiple of 16 (at most 512), Dv one of 16, 32, 48, 64, 128; any strides with the last one 1.  den_out (B, H, T),
// when not empty: each row's den + eps, what linear_backward takes (FEATURE_NONE, normalising).
// FEATURE_PERFORMER: q, k (B, H, T, D) raw, proj (F, D) performer's random features scaled by D^(-1/4): per block,
// logits = x proj^T (a tile product), fq = exp(logits - their row maximum - ln(F) / 2), fk = exp(logits - |x|^2 /
// (2 sqrt(D)) - ln(F) / 2) (linear.performer_features).
// FEATURE_COSFORMER: q, k (B, H, T, D) raw, proj (T, 2) each position's (cos a_i, sin a_i): phi(x_i) = [relu(x_i) cos a_i,
// relu(x_i) sin a_i], F = 2 D (linear.cosformer_features).
enum Feature : int64_t {
  FEATURE_NONE = 0, FEATURE_RELU = 1, FEATURE_ELU1 = 2, FEATURE_SIMA = 3, FEATURE_PERFORMER = 4, FEATURE_COSFORMER = 5
};

// Performer's features of a block's 16 rows (transposed into xt: D x 16) into ft (F x 16, feature-major): the logits
// as scores of proj's rows against the rows, minus the row's shift, exponentiated.
void performer_block(const float* const* rows, int64_t D, const float* proj, int64_t F, bool query, float* xt, float* ft) {
  transpose_rows(rows, D, 1.f, xt);
  scores(proj, D, F, xt, D, ft);
  const float half_log = 0.5f * std::log((float)F);
  __m512 shift;
  if (query) {
    shift = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t f = 0; f < F; ++f) shift = _mm512_max_ps(shift, _mm512_loadu_ps(ft + f * MQ));
  } else {
    shift = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m512 x = _mm512_loadu_ps(xt + d * MQ);
      shift = _mm512_fmadd_ps(x, x, shift);
    }
    shift = _mm512_mul_ps(shift, _mm512_set1_ps(0.5f / std::sqrt((float)D)));
  }
  shift = _mm512_add_ps(shift, _mm512_set1_ps(half_log));
  for (int64_t f = 0; f < F; ++f) _mm512_storeu_ps(ft + f * MQ, exp512(_mm512_sub_ps(_mm512_loadu_ps(ft + f * MQ), shift)));
}

// dst[0 .. F) = phi(src): relu; elu(x) + 1 (= x + 1 above 0, exp(x) below); or a copy.
inline void map_row(const float* src, int64_t F, int64_t feature, float* dst) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  for (int64_t f = 0; f < F; f += 16) {
    const __m512 x = _mm512_loadu_ps(src + f);
    __m512 y = x;
    if (feature == FEATURE_RELU) y = _mm512_max_ps(x, zero);
    if (feature == FEATURE_ELU1) {
      const __mmask16 pos = _mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ);
      y = _mm512_mask_add_ps(exp512(_mm512_min_ps(x, zero)), pos, x, one);
    }
    _mm512_storeu_ps(dst + f, y);
  }
}

inline float hsum(__m512 x) { return _mm512_reduce_add_ps(x); }

// acc[0 .. n) += the m rows of x (ld apart); n a multiple of 16.
inline void add_rows(float* acc, const float* x, int64_t ld, int64_t m, int64_t n) {
  for (int64_t f = 0; f < n; f += 16) {
    __m512 a = _mm512_loadu_ps(acc + f);
    for (int64_t c = 0; c < m; ++c) a = _mm512_add_ps(a, _mm512_loadu_ps(x + c * ld + f));
    _mm512_storeu_ps(acc + f, a);
  }
}

// y[0 .. n) += a x; n a multiple of 16.
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(a);
  for (int64_t f = 0; f < n; f += 16) _mm512_storeu_ps(y + f, _mm512_fmadd_ps(s, _mm512_loadu_ps(x + f), _mm512_loadu_ps(y + f)));
}

void linear_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, int64_t feature,
                    bool normalize, double eps, double l1_eps, bool accumulate, const at::Tensor& proj,
                    const at::Tensor& den_out) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && out.sizes() == v.sizes() &&
                  v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "linear attention: shapes");
  check_layout("linear attention", {&q, &k, &v, &out});
  TORCH_CHECK(feature >= FEATURE_NONE && feature <= FEATURE_COSFORMER, "linear attention: feature map");
  const bool favor = feature == FEATURE_PERFORMER, cosf = feature == FEATURE_COSFORMER;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  const int64_t F = favor ? proj.size(0) : cosf ? 2 * D : D;
  TORCH_CHECK(!cosf || (proj.dim() == 2 && proj.size(0) == T && proj.size(1) == 2 && proj.is_contiguous() &&
                        proj.scalar_type() == at::kFloat),
              "linear attention: cosformer's angles (T, 2) float32 contiguous");
  TORCH_CHECK(!favor || (proj.dim() == 2 && proj.size(1) == D && proj.is_contiguous() && proj.scalar_type() == at::kFloat &&
                         D % 16 == 0 && D <= 512),
              "linear attention: performer's projection (F, D) float32 contiguous, D a multiple of 16 up to 512");
  TORCH_CHECK(F % 16 == 0 && F > 0 && F <= 512, "linear attention: features a multiple of 16, at most 512");
  TORCH_CHECK(DV % 16 == 0 && (DV <= 64 || DV == 128), "linear attention: value head sizes 16, 32, 48, 64 or 128");
  const bool keep = den_out.numel() > 0;  // the backward's input: each row's denominator plus eps
  TORCH_CHECK(!keep || (normalize && den_out.is_contiguous() && den_out.scalar_type() == at::kFloat &&
                        den_out.numel() == B * H * T),
              "linear attention: the denominators' output (B, H, T) float32 contiguous, when normalising");
  if (T == 0 || B * H == 0) return;
  const View Q(q), K(k), V(v), O(out);
  const float* W = favor || cosf ? proj.data_ptr<float>() : nullptr;
  float* dens = keep ? den_out.data_ptr<float>() : nullptr;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(F * DV), z(F), za(F), qb(MQ * F), kb(MQ * F), qt(F * MQ), sc(MQ * MQ), xt(favor ? D * MQ : 0),
        ft(favor ? F * MQ : 0);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / H, h = w % H;
      const float *qh = Q.head(b, h), *kh = K.head(b, h), *vh = V.head(b, h);
      std::fill(S.begin(), S.end(), 0.f);
      std::fill(z.begin(), z.end(), 0.f);
      std::fill(za.begin(), za.end(), 0.f);
      for (int64_t q0 = 0; q0 < T; q0 += MQ) {
        const int64_t m = std::min<int64_t>(MQ, T - q0);
        const float* vb = vh + q0 * V.s2;
        if (favor) {  // fq feature-major into qt; fk transposed back into kb's rows
          const float* rows[MQ];
          for (int r = 0; r < MQ; ++r) rows[r] = qh + (q0 + (r < m ? r : 0)) * Q.s2;
          performer_block(rows, D, W, F, true, xt.data(), qt.data());
          for (int r = 0; r < MQ; ++r) rows[r] = kh + (q0 + (r < m ? r : 0)) * K.s2;
          performer_block(rows, D, W, F, false, xt.data(), ft.data());
          for (int64_t f0 = 0; f0 < F; f0 += 16) {
            alignas(64) float tile[MQ * 16];
            const float* frows[16];
            for (int i = 0; i < 16; ++i) frows[i] = ft.data() + (f0 + i) * MQ;
            transpose16(frows, 0, 1.f, tile);  // tile[r * 16 + i] = fk of row r, feature f0 + i
            for (int64_t r = 0; r < m; ++r) std::copy(tile + r * 16, tile + r * 16 + 16, kb.data() + r * F + f0);
          }
        }
        for (int64_t r = 0; r < m && !favor; ++r) {  // the block's feature rows
          const float *qr = qh + (q0 + r) * Q.s2, *kr = kh + (q0 + r) * K.s2;
          float *qd = qb.data() + r * F, *kd = kb.data() + r * F;
          if (feature == FEATURE_SIMA) {  // fq = (q / (|q|_1 + l1_eps)) / (sum_{j<=i} |k_j| + eps) per feature
            std::copy(kr, kr + F, kd);
            __m512 l1 = _mm512_setzero_ps();
            for (int64_t f = 0; f < F; f += 16) {
              _mm512_storeu_ps(za.data() + f, _mm512_add_ps(_mm512_loadu_ps(za.data() + f), _mm512_abs_ps(_mm512_loadu_ps(kr + f))));
              l1 = _mm512_add_ps(l1, _mm512_abs_ps(_mm512_loadu_ps(qr + f)));
            }
            const __m512 n = _mm512_add_ps(_mm512_set1_ps(hsum(l1)), _mm512_set1_ps((float)l1_eps));
            for (int64_t f = 0; f < F; f += 16) {
              const __m512 qn = _mm512_div_ps(_mm512_loadu_ps(qr + f), n);
              _mm512_storeu_ps(qd + f, _mm512_div_ps(qn, _mm512_add_ps(_mm512_loadu_ps(za.data() + f), _mm512_set1_ps((float)eps))));
            }
          } else if (cosf) {
            const __m512 zero = _mm512_setzero_ps(), c = _mm512_set1_ps(W[(q0 + r) * 2]), sn = _mm512_set1_ps(W[(q0 + r) * 2 + 1]);
            for (int64_t f = 0; f < D; f += 16) {
              const __m512 a = _mm512_max_ps(_mm512_loadu_ps(qr + f), zero), e = _mm512_max_ps(_mm512_loadu_ps(kr + f), zero);
              _mm512_storeu_ps(qd + f, _mm512_mul_ps(a, c));
              _mm512_storeu_ps(qd + D + f, _mm512_mul_ps(a, sn));
              _mm512_storeu_ps(kd + f, _mm512_mul_ps(e, c));
              _mm512_storeu_ps(kd + D + f, _mm512_mul_ps(e, sn));
            }
          } else {
            map_row(qr, F, feature, qd);
            map_row(kr, F, feature, kd);
          }
        }
        if (!favor) {
          const float* rows[MQ];  // (rows past m repeat row 0: finite, and never written)
          for (int r = 0; r < MQ; ++r) rows[r] = qb.data() + (r < m ? r : 0) * F;
          transpose_rows(rows, F, 1.f, qt.data());
        }
        scores(kb.data(), F, m, qt.data(), F, sc.data());
        __m512 den = _mm512_setzero_ps();
        for (int64_t c = 0; c < m; ++c) {  // key c is seen by the queries r >= c
          const __m512 a = _mm512_maskz_mov_ps((__mmask16)(0xFFFFu << c), _mm512_loadu_ps(sc.data() + c * MQ));
          _mm512_storeu_ps(sc.data() + c * MQ, a);
          den = _mm512_add_ps(den, a);
        }
        alignas(64) float inv[MQ];
        if (normalize) {
          for (int64_t f = 0; f < F; ++f) den = _mm512_fmadd_ps(_mm512_set1_ps(z[f]), _mm512_loadu_ps(qt.data() + f * MQ), den);
          const __m512 de = _mm512_add_ps(den, _mm512_set1_ps((float)eps));
          _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), de));
          if (keep) _mm512_mask_storeu_ps(dens + w * T + q0, (__mmask16)((1u << m) - 1u), de);
        }
        const float* rs = normalize ? inv : nullptr;
        float* ob = O.head(b, h) + q0 * O.s2;
        product(sc.data(), 1, MQ, m, m, vb, V.s2, rs, 1.f, accumulate, ob, O.s2, DV, -WIDE, 0);  // inside the block
        if (q0 > 0) product(qt.data(), 1, MQ, m, F, S.data(), DV, rs, 1.f, true, ob, O.s2, DV, -WIDE, WIDE);  // before it
        product(kb.data(), 1, F, F, m, vb, V.s2, nullptr, 1.f, true, S.data(), DV, DV, -WIDE, WIDE);  // S += fk^T V
        add_rows(z.data(), kb.data(), F, m, F);
      }
    }
  });
}

// Width-`width` products (any multiple of 16): columns in slices of at most 64 floats, the widths product lays out.
void product_cols(const float* A, int64_t ra, int64_t ja, int64_t rows, int64_t n, const float* X, int64_t ldx,
                  bool accumulate, float* O, int64_t ldo, int64_t width) {
  for (int64_t c0 = 0; c0 < width; c0 += 64) {
    product(A, ra, ja, rows, n, X + c0, ldx, nullptr, 1.f, accumulate, O + c0, ldo, std::min<int64_t>(64, width - c0),
            -WIDE, WIDE);
  }
}

// The gradients of linear_forward without a feature map (q, k: the features fq, fk (B, H, T, F)), from g = dL/d out,
// the forward's out and its denominators plus eps `den` (B, H, T; empty without `normalize`).  Per row i:
//   dn_i = g_i / den_i,  dd_i = -dn_i . out_i      (without normalize: dn = g, dd = 0)
//   dA_ic = dn_i . v_c + dd_i  for c <= i           (the gradient of the score fq_i . fk_c)
//   dq_i = sum_{c<=i} dA_ic fk_c,  dk_c = sum_{i>=c} dA_ic fq_i,  dv_c = sum_{i>=c} (fq_i . fk_c) dn_i.
// By blocks of 16 rows, as the forward: the pairs inside a block from its scores; the earlier rows through running
// sums, in order for dq (S = sum fk_j v_j^T, kept transposed as ST (Dv x F), and z = sum fk_j over the rows before the
// block: dq_i += dn_i ST + dd_i z) and in reverse for dk and dv (R = sum fq_i dn_i^T and y = sum dd_i fq_i over the
// rows after it: dk_c += R v_c + y, dv_c += R^T fk_c; R kept both ways, F x Dv and Dv x F).  dq, dk, dv written.
void linear_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                     const at::Tensor& out, const at::Tensor& den, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                     bool normalize) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && g.sizes() == v.sizes() && out.sizes() == v.sizes() &&
                  dq.sizes() == q.sizes() && dk.sizes() == q.sizes() && dv.sizes() == v.sizes() &&
                  v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "linear attention backward: shapes");
  check_layout("linear attention backward", {&q, &k, &v, &g, &out, &dq, &dk, &dv});
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), F = q.size(3), DV = v.size(3);
  TORCH_CHECK(F % 16 == 0 && F > 0 && F <= 512, "linear attention backward: features a multiple of 16, at most 512");
  TORCH_CHECK(DV % 16 == 0 && (DV <= 64 || DV == 128), "linear attention backward: value head sizes 16, 32, 48, 64 or 128");
  TORCH_CHECK(!normalize || (den.is_contiguous() && den.scalar_type() == at::kFloat && den.numel() == B * H * T),
              "linear attention backward: the denominators (B, H, T) float32 contiguous");
  if (T == 0 || B * H == 0) return;
  const View Q(q), K(k), V(v), G(g), O(out), DQ(dq), DK(dk), DVV(dv);
  const float* dens = normalize ? den.data_ptr<float>() : nullptr;
  const int64_t nblk = (T + MQ - 1) / MQ;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ST(DV * F), z(F), R(F * DV), RT(DV * F), y(F), dn(MQ * DV), dd(MQ), dnt(DV * MQ), qt(F * MQ),
        sa(MQ * MQ), sd(MQ * MQ);
    // dn and dd of the block at q0 (m rows; rows past m zero), dn transposed into dnt; sd = dA (keys c x lanes i), masked
    auto block_grads = [&](int64_t w, const float* gh, const float* oh, const float* vb, int64_t q0, int64_t m) {
      std::fill(dn.begin(), dn.end(), 0.f);
      std::fill(dd.begin(), dd.end(), 0.f);
      for (int64_t r = 0; r < m; ++r) {
        const float *gr = gh + (q0 + r) * G.s2, *orow = oh + (q0 + r) * O.s2;
        float* d = dn.data() + r * DV;
        const __m512 inv = _mm512_set1_ps(normalize ? 1.f / dens[w * T + q0 + r] : 1.f);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t e = 0; e < DV; e += 16) {
          const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(gr + e), inv);
          _mm512_storeu_ps(d + e, x);
          acc = _mm512_fmadd_ps(x, _mm512_loadu_ps(orow + e), acc);
        }
        if (normalize) dd[r] = -hsum(acc);
      }
      const float* rows[MQ];
      for (int r = 0; r < MQ; ++r) rows[r] = dn.data() + r * DV;
      transpose_rows(rows, DV, 1.f, dnt.data());
      scores(vb, V.s2, m, dnt.data(), DV, sd.data());  // sd[c][i] = v_c . dn_i
      const __m512 ddv = _mm512_loadu_ps(dd.data());
      for (int64_t c = 0; c < m; ++c) {  // row i sees key c for i >= c
        const __mmask16 seen = (__mmask16)(0xFFFFu << c);
        _mm512_storeu_ps(sd.data() + c * MQ, _mm512_maskz_add_ps(seen, _mm512_loadu_ps(sd.data() + c * MQ), ddv));
      }
    };
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / H, h = w % H;
      const float *qh = Q.head(b, h), *kh = K.head(b, h), *vh = V.head(b, h), *gh = G.head(b, h), *oh = O.head(b, h);
      float *dqh = DQ.head(b, h), *dkh = DK.head(b, h), *dvh = DVV.head(b, h);
      // dq, in order
      std::fill(ST.begin(), ST.end(), 0.f);
      std::fill(z.begin(), z.end(), 0.f);
      for (int64_t blk = 0; blk < nblk; ++blk) {
        const int64_t q0 = blk * MQ, m = std::min<int64_t>(MQ, T - q0);
        const float *vb = vh + q0 * V.s2, *kb = kh + q0 * K.s2;
        float* dqb = dqh + q0 * DQ.s2;
        block_grads(w, gh, oh, vb, q0, m);
        product_cols(sd.data(), 1, MQ, m, m, kb, K.s2, false, dqb, DQ.s2, F);  // inside the block
        if (q0 > 0) {
          product_cols(dn.data(), DV, 1, m, DV, ST.data(), F, true, dqb, DQ.s2, F);  // dn_i S^T
          for (int64_t r = 0; r < m && normalize; ++r) axpy(dd[r], z.data(), dqb + r * DQ.s2, F);  // dd_i z
        }
        product_cols(vb, 1, V.s2, DV, m, kb, K.s2, true, ST.data(), F, F);  // ST += V^T fk
        add_rows(z.data(), kb, K.s2, m, F);
      }
      // dk and dv, in reverse
      std::fill(R.begin(), R.end(), 0.f);
      std::fill(RT.begin(), RT.end(), 0.f);
      std::fill(y.begin(), y.end(), 0.f);
      for (int64_t blk = nblk - 1; blk >= 0; --blk) {
        const int64_t q0 = blk * MQ, m = std::min<int64_t>(MQ, T - q0);
        const float *vb = vh + q0 * V.s2, *kb = kh + q0 * K.s2, *qb = qh + q0 * Q.s2;
        float *dkb = dkh + q0 * DK.s2, *dvb = dvh + q0 * DVV.s2;
        block_grads(w, gh, oh, vb, q0, m);
        const float* rows[MQ];  // (rows past m repeat row 0: finite, and never read)
        for (int r = 0; r < MQ; ++r) rows[r] = qb + (r < m ? r : 0) * Q.s2;
        transpose_rows(rows, F, 1.f, qt.data());
        scores(kb, K.s2, m, qt.data(), F, sa.data());  // sa[c][i] = fk_c . fq_i
        for (int64_t c = 0; c < m; ++c) {
          _mm512_storeu_ps(sa.data() + c * MQ, _mm512_maskz_mov_ps((__mmask16)(0xFFFFu << c), _mm512_loadu_ps(sa.data() + c * MQ)));
        }
        product(sa.data(), MQ, 1, m, m, dn.data(), DV, nullptr, 1.f, false, dvb, DVV.s2, DV, -WIDE, WIDE);  // inside
        product_cols(sd.data(), MQ, 1, m, m, qb, Q.s2, false, dkb, DK.s2, F);
        if (q0 + m < T) {  // the rows after the block
          product(kb, K.s2, 1, m, F, R.data(), DV, nullptr, 1.f, true, dvb, DVV.s2, DV, -WIDE, WIDE);  // R^T fk_c
          product_cols(vb, V.s2, 1, m, DV, RT.data(), F, true, dkb, DK.s2, F);  // R v_c
          for (int64_t c = 0; c < m && normalize; ++c) axpy(1.f, y.data(), dkb + c * DK.s2, F);  // + y
        }
        product(qb, 1, Q.s2, F, m, dn.data(), DV, nullptr, 1.f, true, R.data(), DV, DV, -WIDE, WIDE);  // R += fq^T dn
        product_cols(dn.data(), 1, DV, DV, m, qb, Q.s2, true, RT.data(), F, F);  // RT += dn^T fq
        for (int64_t r = 0; r < m && normalize; ++r) axpy(dd[r], qb + r * Q.s2, y.data(), F);  // y += dd_i fq_i
      }
    }
  });
}

// Depthwise convolution along the tokens of x (B, H, T, D) with taps w (K, H * D): out[t] = sum_s w[s] x[t + offsets[s]]
// per channel, zeros outside the sequence (causal: offsets 0, -1, ..., -(K-1); centred: 0, -1, +1, ...).  D a multiple
// of 16; x and out any strides with the last one 1, w contiguous.  msla's, lsra's and convmod's inference.
void dwconv_forward(const at::Tensor& x, const at::Tensor& w, at::Tensor& out, std::vector<int64_t> offsets) {
  TORCH_CHECK(x.dim() == 4 && out.sizes() == x.sizes() && x.size(3) % 16 == 0, "depthwise conv: shapes");
  check_layout("depthwise conv", {&x, &out, &w});
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), NT = (int64_t)offsets.size();
  TORCH_CHECK(w.is_contiguous() && w.dim() == 2 && w.size(0) == NT && w.size(1) == H * D, "depthwise conv: taps (K, H * D)");
  const View X(x), O(out);
  const float* W = w.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* xh = X.head(b, h);
      float* oh = O.head(b, h);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < D; d += 16) {
          __m512 acc = _mm512_setzero_ps();
          for (int64_t s = 0; s < NT; ++s) {
            const int64_t j = t + offsets[s];
            if (j >= 0 && j < T) acc = _mm512_fmadd_ps(_mm512_loadu_ps(W + s * H * D + h * D + d), _mm512_loadu_ps(xh + j * X.s2 + d), acc);
          }
          _mm512_storeu_ps(oh + t * O.s2 + d, acc);
        }
      }
    }
  });
}

// hydra: out_t = n(q_t) * s_t per channel, n(x) = x / max(|x|_2, eps); causal: s_t = mean_{j<=t} n(k_j) * v_j (a
// running sum over the tokens in order), else s = the mean over every token.  q, k, v, out (B, H, T, D) with the last
// stride 1, D a multiple of 16 up to 512: one pass over the tokens, where the torch path writes five tensors.
inline __m512 l2_scale(const float* x, int64_t D, float eps) {
  __m512 sq = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 a = _mm512_loadu_ps(x + d);
    sq = _mm512_fmadd_ps(a, a, sq);
  }
  return _mm512_set1_ps(1.f / std::max(std::sqrt(_mm512_reduce_add_ps(sq)), eps));
}

// s += n(k_t) * v_t per channel
inline void add_kv(float* s, const float* kt, const float* vt, int64_t D, float eps) {
  const __m512 n = l2_scale(kt, D, eps);
  for (int64_t d = 0; d < D; d += 16) {
    _mm512_store_ps(s + d, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(kt + d), n), _mm512_loadu_ps(vt + d), _mm512_load_ps(s + d)));
  }
}

void hydra_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, bool causal, double eps) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes() && out.sizes() == q.sizes() &&
                  q.size(3) % 16 == 0 && q.size(3) <= 512,
              "hydra: shapes (B, H, T, D), D a multiple of 16 up to 512");
  check_layout("hydra", {&q, &k, &v, &out});
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const View Q(q), K(k), V(v), O(out);
  const float e = (float)eps;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float s[512];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float *qh = Q.head(b, h), *kh = K.head(b, h), *vh = V.head(b, h);
      float* oh = O.head(b, h);
      std::fill(s, s + D, 0.f);
      for (int64_t t = 0; t < T && !causal; ++t) add_kv(s, kh + t * K.s2, vh + t * V.s2, D, e);  // every token first
      for (int64_t t = 0; t < T; ++t) {
        if (causal) add_kv(s, kh + t * K.s2, vh + t * V.s2, D, e);  // the tokens so far
        const float* qt = qh + t * Q.s2;
        const __m512 n = _mm512_div_ps(l2_scale(qt, D, e), _mm512_set1_ps((float)(causal ? t + 1 : T)));
        float* ot = oh + t * O.s2;
        for (int64_t d = 0; d < D; d += 16) {
          _mm512_storeu_ps(ot + d, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(qt + d), n), _mm512_load_ps(s + d)));
        }
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("window_forward", &window_forward, "fused sliding-window attention with global keys (float32, AVX-512)");
  m.def("window_backward", &window_backward, "its gradients");
  m.def("linear_forward", &linear_forward, "causal kernelized (linear) attention with its feature map (float32, AVX-512)");
  m.def("linear_backward", &linear_backward, "its gradients, without a feature map");
  m.def("dwconv_forward", &dwconv_forward, "depthwise convolution along the tokens (float32, AVX-512)");
  m.def("hydra_forward", &hydra_forward, "hydra attention, causal or bidirectional (float32, AVX-512)");
}
