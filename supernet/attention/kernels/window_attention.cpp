// Fused sliding-window softmax attention for the CPU (float32; AVX-512, AVX2 or Neon: simd.h), forward and backward: the compiled
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

#include "window_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "simd.h"

namespace nas {
namespace {

using namespace simd;

#define NAS_CHECK(cond, ...) ::nas::check((cond), __VA_ARGS__)

void serial(int64_t n, const std::function<void(int64_t, int64_t)>& body) { body(0, n); }
Parallel parallel_ = serial;

template <class F>
void parallel(int64_t n, const F& body) {
  if (n > 0) parallel_(n, body);
}

constexpr int MQ = 16;  // queries per block: the lanes of a vf (one AVX-512 register, two AVX2, four Neon)
constexpr int64_t WIDE = int64_t(1) << 40;  // a product range that limits nothing

// ST[c][r] = sum_d K[c][d] QT[d][r] for NK keys (rows of K, ldk apart; LD > 0: ldk == D == LD, known when
// compiling, so that the NK broadcasts of a feature address one pointer at constant offsets instead of NK row
// pointers, more than the registers there are).  Not inlined: in its own frame the accumulators stay in registers.
template <int NK, int LD>
__attribute__((noinline)) void score_tile(const float* K, int64_t ldk, const float* QT, int64_t D, float* ST) {
  const int64_t ld = LD > 0 ? LD : ldk, depth = LD > 0 ? LD : D;
  vf acc[NK];
  for (int c = 0; c < NK; ++c) acc[c] = vzero();
  for (int64_t d = 0; d < depth; ++d) {
    const vf qv = vloadu(QT + d * MQ);
    for (int c = 0; c < NK; ++c) acc[c] = vfmadd(vset1(K[c * ld + d]), qv, acc[c]);
  }
  for (int c = 0; c < NK; ++c) vstoreu(ST + c * MQ, acc[c]);
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
    vf acc[RB][NV];
    for (int a = 0; a < RB; ++a)
      for (int b = 0; b < NV; ++b) acc[a][b] = vzero();
    const float* arow[RB];
    for (int a = 0; a < RB; ++a) arow[a] = A + (i0 + (a < rn ? a : 0)) * ra;
    for (int64_t j = j0; j < j1; ++j) {
      const float* xr = X + j * ldx;
      vf xv[NV];
      for (int b = 0; b < NV; ++b) xv[b] = vloadu(xr + b * 16);
      for (int a = 0; a < RB; ++a) {
        const vf p = vset1(arow[a][j * ja]);
        for (int b = 0; b < NV; ++b) acc[a][b] = vfmadd(p, xv[b], acc[a][b]);
      }
    }
    for (int a = 0; a < rn; ++a) {
      float* orow = O + (i0 + a) * ldo;
      const vf sv = vset1(rs ? rs[i0 + a] : alpha);
      for (int b = 0; b < NV; ++b) {
        if (stream) {
          vstream(orow + b * 16, vmul(acc[a][b], sv));
        } else {
          const vf base = accumulate ? vloadu(orow + b * 16) : vzero();
          vstoreu(orow + b * 16, vfmadd(acc[a][b], sv, base));
        }
      }
    }
  }
}

void product(const float* A, int64_t ra, int64_t ja, int64_t rows, int64_t n, const float* X, int64_t ldx, const float* rs,
             float alpha, bool accumulate, float* O, int64_t ldo, int64_t width, int64_t jlo, int64_t jhi,
             bool stream = false) {
#if NAS_AVX512
  switch (width / 16) {
    case 1: rows_product<1, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 2: rows_product<2, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 3: rows_product<3, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    case 4: rows_product<4, 4>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;
    default: rows_product<8, 2>(A, ra, ja, rows, n, X, ldx, rs, alpha, accumulate, O, ldo, jlo, jhi, stream); break;  // 128
  }
#else
  // AVX2 (16 registers, two per vf) and Neon (32, four per vf): the columns in slices of 32 floats, 2 rows at a time
  // (8 AVX2 accumulators, 4 for X's slice), a last slice of 16 floats 4 rows at a time; the same sums, in the same order
  for (int64_t c0 = 0; c0 < width; c0 += 32) {
    if (width - c0 >= 32) {
      rows_product<2, 2>(A, ra, ja, rows, n, X + c0, ldx, rs, alpha, accumulate, O + c0, ldo, jlo, jhi, stream);
    } else {
      rows_product<1, 4>(A, ra, ja, rows, n, X + c0, ldx, rs, alpha, accumulate, O + c0, ldo, jlo, jhi, stream);
    }
  }
#endif
}

// A (B, H, T, X) output whose rows may be written with streaming stores (rows_product's `stream`): too large to stay
// in a core's L2 cache anyway (a smaller one is left in cache for what reads it next), rows a multiple of 64 bytes
// apart; a block streams where its first row is 64-byte aligned (`aligned`).
constexpr int64_t STREAM_BYTES = int64_t(2) << 20;
bool streaming(const Arr& t) { return t.numel() * 4 >= STREAM_BYTES && t.stride(2) % 16 == 0; }
bool aligned(const float* p) { return (reinterpret_cast<uintptr_t>(p) & 63) == 0; }

// Rows j0 .. j1 - 1 (ld apart, `width` floats each) into L2: what the next block reads.  A block's work is a few
// microseconds; the hardware's prefetcher alone leaves it waiting on the rows it meets (a kernel reading from L2
// runs about 1.4x as fast as one that streams its head from memory, 4k tokens, one thread).
void prefetch_rows(const float* x, int64_t ld, int64_t j0, int64_t j1, int64_t width) {
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t d = 0; d < width; d += 16) prefetch_l2(x + j * ld + d);
  }
}

// Scores of keys K[0 .. cn) (rows ldk apart) against a block's transposed queries QT (D x 16): ST[c][r], tiles
// of KEY_TILE (AVX-512 16, AVX2 and Neon 6: what their registers hold), 4, 1 keys.
template <int LD>
void scores_of(const float* K, int64_t ldk, int64_t cn, const float* QT, int64_t D, float* ST) {
  int64_t c = 0;
  for (; c + KEY_TILE <= cn; c += KEY_TILE) score_tile<KEY_TILE, LD>(K + c * ldk, ldk, QT, D, ST + c * MQ);
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
  mask16 live;
  Block(int64_t blk, const Pattern& pt, mask16* mask) {
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
    live = (mask16)(m >= 16 ? 0xFFFFu : ((1u << m) - 1u));
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
    for (int s = 0; s < nseg; ++s) {
      const Segment& g = seg[s];
      for (int64_t c = 0; c < g.count; ++c) {
        const int64_t j = g.start + c * g.step, rel = j - q0;
        mask16 ok = 0;
        if (g.kind == WINDOW && j >= sb) ok = lanes(rel - pt.aft, rel + pt.bef);  // r - before <= j - q0 <= r + after
        if (g.kind == SUMMARY) ok = 0xFFFF;  // before every lane's block
        if (g.kind != PICKED && j < pt.G) ok |= lanes(rel - pt.gaft, 15);  // global: j < G, j - q0 <= r + gaft
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
vf masked_exp(float* st, const mask16* mask, int64_t n, mask16 live, vf& mx) {
  mx = vset1(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < n; ++c) mx = vmask_max(mx, mask[c], mx, vloadu(st + c * MQ));
  mx = vmask_mov(vzero(), live, mx);
  vf sum = vzero();
  for (int64_t c = 0; c < n; ++c) {
    float* row = st + c * MQ;
    const vf e = vmaskz(mask[c], vexp(vsub(vloadu(row), mx)));
    vstoreu(row, e);
    sum = vadd(sum, e);
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
  explicit View(const Arr& t) : p(t.f()), s0(t.stride(0)), s1(t.stride(1)), s2(t.stride(2)) {}
  float* head(int64_t b, int64_t h) const { return p + b * s0 + h * s1; }
  View stream(int64_t r, int64_t step) const {  // rows r, r + step, r + 2 step, ... (a residue stream: dilated)
    View s = *this;
    s.p += r * s2;
    s.s2 *= step;
    return s;
  }
};

// Every kernel's operands: float32 on the CPU, the last stride 1.
void check_layout(const char* what, std::initializer_list<const Arr*> tensors) {
  for (const Arr* t : tensors) {
    NAS_CHECK(t->dtype == DType::Float32 && t->cpu && t->stride(-1) == 1, what, ": float32 CPU, last stride 1");
  }
}

void check_window(const Arr& q, const Arr& k, const Arr& v, const Arr& out) {
  NAS_CHECK(q.dim() == 4 && k.same_sizes(q) && v.dim() == 4 && out.same_sizes(v), "window attention: shapes");
  NAS_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2), "window attention: v's shape");
  check_layout("window attention", {&q, &k, &v, &out});
  for (int64_t x : {q.size(3), v.size(3)}) {
    NAS_CHECK(x % 16 == 0 && (x <= 64 || x == 128), "window attention: head sizes 16, 32, 48, 64 or 128");
  }
}

}  // namespace

void set_parallel(Parallel p) { parallel_ = p ? p : serial; }
const char* isa() { return ISA; }

Pattern pattern(int64_t T, int64_t before, int64_t after, int64_t globals, int64_t global_after, const Arr& picks,
                int64_t width, int64_t blocks, int64_t columns) {
  NAS_CHECK(columns >= 0 && (columns == 0 || (globals == 0 && picks.numel() == 0 && blocks == 0 && before < columns && after == 0)),
              "window attention: columns (strided) alone, causal, the window shorter than the stride");
  NAS_CHECK(before >= 0 && after >= -1 && globals >= 0 && global_after >= 0, "window attention: window");
  NAS_CHECK(blocks >= 0 && blocks % MQ == 0 && (blocks == 0 || (globals == 0 && picks.numel() == 0)),
              "window attention: blocks (fixed) a multiple of 16, without global keys or picks");
  Pattern p{T, std::min(globals, T), (int32_t)std::min(before, T), (int32_t)std::min(after, T),
            (int32_t)std::min(global_after, T), nullptr, 0, 1, blocks};
  if (picks.numel() > 0) {
    NAS_CHECK(picks.dtype == DType::Int64 && picks.dim() == 2 && picks.is_contiguous() && width % MQ == 0 &&
                    picks.size(0) >= (T + width - 1) / width && picks.size(1) <= 8,
                "window attention: picks (blocks, R <= 8) int64, width a multiple of 16");
    p.picks = picks.i64();
    p.R = picks.size(1);
    p.width = width;
  }
  return p;
}

// The pattern on each of the residue streams r, r + step, ... (r < min(step, T); one stream where step is 1): their
// lengths differ by one at most, stream 0 the longest.
std::vector<Pattern> stream_patterns(int64_t T, int64_t step, int64_t before, int64_t after, int64_t globals,
                                     int64_t global_after, const Arr& picks, int64_t width, int64_t blocks,
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
  std::vector<mask16> mask;
  Columns(int64_t C_, int64_t T, int64_t DV) : C(C_), span(std::min(MQ * C_, T)), acc(span * DV), mx(span), sum(span),
                                             st(((T + C_ - 1) / C_) * MQ), mask((T + C_ - 1) / C_) {}
  void run(const float* qh, int64_t ldq, const float* kh, int64_t ldk, const float* vh, int64_t ldv, int64_t T,
           int64_t D, int64_t DV, int64_t sb, float scale, float* qt) {
    const int64_t t0 = sb * MQ * C;
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < C; ++c) {
      const int64_t n = (T - c + C - 1) / C, s0 = std::max<int64_t>(1, sb * MQ), s1 = std::min(n, sb * MQ + MQ);
      if (s0 >= s1) continue;
      // queries s0 .. s1 - 1, keys 0 .. s1 - 2 rounded up to whole tiles of 16 where the stream allows (masked)
      const int64_t m = s1 - s0, kn = std::min(n, (s1 - 1 + 15) / 16 * 16);
      const float* rows[MQ];
      for (int r = 0; r < MQ; ++r) rows[r] = qh + (c + (s0 + (r < m ? r : 0)) * C) * ldq;
      transpose_rows(rows, D, scale, qt);
      scores(kh + c * ldk, ldk * C, kn, qt, D, st.data());
      const mask16 live = (mask16)(m >= 16 ? 0xFFFFu : ((1u << m) - 1u));
      for (int64_t j = 0; j < kn; ++j) mask[j] = lanes(j - s0 + 1, 15) & live;  // lane r: keys j < s0 + r
      vf top;
      const vf total = masked_exp(st.data(), mask.data(), kn, live, top);
      const int64_t row0 = c + s0 * C - t0;  // the span row of stream query s0; the next ones C rows apart
      product(st.data(), 1, MQ, m, kn, vh + c * ldv, ldv * C, nullptr, 1.f, false, acc.data() + row0 * DV, C * DV, DV,
              -WIDE, s0 - 1);
      alignas(64) float tv[MQ], sv[MQ];
      vstoreu(tv, top);
      vstoreu(sv, total);
      for (int64_t r = 0; r < m; ++r) mx[row0 + r * C] = tv[r], sum[row0 + r * C] = sv[r];
    }
  }
};

// One block of 16 queries (window_forward's work): scores of its key segments, softmax, P V into out, the lse if
// L; with `col` (strided), the block's column rows (at span row cr) join the softmax.
void window_block(const Pattern& pat, const View& Q, const View& K, const View& V, const View& O, const View* L, int64_t b,
                  int64_t h, int64_t blk, int64_t D, int64_t DV, float scale, float* st, float* qt,
                  mask16* mask, const Columns* col, int64_t cr, const float* sk, const float* sv, bool big) {
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
  vf mx;
  vf sum = masked_exp(st, mask, bl.n, bl.live, mx);
  alignas(64) float inv[MQ], cw[MQ], lse_[MQ], mxv[MQ], sums[MQ];
  vf whole = mx;  // the row's maximum over window and columns
  if (col) {  // rows past T: mx and sum 0 (finite), weight 0
    const vf cm = vmaskz_loadu(bl.live, col->mx.data() + cr), cs = vmaskz_loadu(bl.live, col->sum.data() + cr);
    whole = vmax(mx, cm);
    const vf aw = vexp(vsub(mx, whole)), ac = vexp(vsub(cm, whole));
    const vf cmask = vmaskz(vgt(cm, vset1(-1e30f)), ac);  // no columns: 0
    sum = vfmadd(aw, sum, vmul(cmask, cs));
    sum = vmask_mov(vset1(1.f), bl.live, sum);
    const vf r = vdiv(vset1(1.f), sum);
    vstoreu(inv, vmul(aw, r));
    vstoreu(cw, vmul(cmask, r));
  } else {
    sum = vmask_mov(vset1(1.f), bl.live, sum);
    vstoreu(inv, vdiv(vset1(1.f), sum));
  }
  if (L) {
    vstoreu(mxv, whole);
    vstoreu(sums, sum);
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
    const vf w = vset1(cw[r]);
    const float* a = col->acc.data() + (cr + r) * DV;
    float* o = ob + r * O.s2;
    for (int64_t e = 0; e < DV; e += 16) vstoreu(o + e, vfmadd(vloadu(a + e), w, vloadu(o + e)));
  }
}

// q, k (B, H, T, D), v and out (B, H, T, Dv): float32 on the CPU, any strides with the last one 1; D and Dv
// one of 16, 32, 48, 64, 128.  lse (B, H, T), contiguous, or empty: the log of each row's softmax
// denominator (scores scaled), which the backward needs.  strided (columns C): per span of 16 C tokens, the columns
// of its queries first, then its blocks, so that the column rows are in cache when the blocks take them in.
// step > 1 (dilated): the pattern on each residue stream r, r + step, ... (rows step apart), block sb of
// every stream in turn (their keys lie in one stretch of the head: it stays in cache, where a stream at a time
// reads the whole head once per stream).
void window_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, const Arr& lse,
                    int64_t before, int64_t after, int64_t globals, int64_t global_after, const Arr& picks,
                    int64_t width, int64_t blocks, int64_t columns, int64_t step) {
  check_window(q, k, v, out);
  NAS_CHECK(after >= 0, "window attention: every query sees itself (after >= 0)");
  const bool keep = lse.numel() > 0;
  NAS_CHECK(!keep || (lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2)), "window attention: lse");
  NAS_CHECK(step >= 1 && (step == 1 || columns == 0), "window attention: step (dilation) >= 1, without columns");
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
  parallel(B * H * tasks, [&](int64_t begin, int64_t end) {
    std::vector<float> st(most * MQ), qt(D * MQ);
    std::vector<mask16> mask(most);
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
    vfence();  // the streamed stores seen by whichever thread reads out next
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
void window_backward(const Arr& q, const Arr& k, const Arr& v, const Arr& lse,
                     const Arr& dout, const Arr& dq, const Arr& dk, const Arr& dv, int64_t before,
                     int64_t after, int64_t globals, int64_t global_after, const Arr& picks, int64_t width,
                     int64_t blocks, int64_t columns, int64_t step, const Arr& delta, bool accumulate) {
  NAS_CHECK(columns == 0 && step >= 1, "window attention backward: no columns (strided's: delta), step >= 1");
  check_window(q, k, v, dout);
  check_window(dq, dk, dv, dv);
  NAS_CHECK(dq.same_sizes(q) && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2),
              "window attention backward: shapes");
  const bool given = delta.numel() > 0;  // rowsum(dO * O) of a softmax that spans more keys than these (strided)
  NAS_CHECK(!given || (delta.is_contiguous() && delta.dtype == DType::Float32 && delta.numel() == lse.numel()),
              "window attention backward: delta (B, H, T) float32 contiguous");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  if (T == 0 || B * H == 0) return;
  const std::vector<Pattern> pats = stream_patterns(T, step, before, after, globals, global_after, picks, width, blocks, 0);
  const int64_t streams = pats.size();
  const View Q0(q), K0(k), V0(v), dO0(dout), dQ0(dq), dK0(dk), dV0(dv), L0(lse), R0(given ? delta : lse);
  const int64_t most = most_rows(pats[0]), nb = (pats[0].T + MQ - 1) / MQ;  // stream 0's blocks: the most
  const float scale = 1.f / std::sqrt((float)D);
  const bool big = streaming(dq) && !accumulate;
  parallel(B * H, [&](int64_t begin, int64_t end) {
    std::vector<float> pt(most * MQ), dst(most * MQ), qt(D * MQ), dot(DV * MQ);
    std::vector<mask16> mask(most);
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
          const vf lsel = vloadu(lsev);
          for (int s = 0; s < bl.nseg; ++s) {  // S^T and dP^T
            const Segment& g = bl.seg[s];
            scores(kh + g.start * K.s2, K.s2 * g.step, g.count, qt.data(), D, pt.data() + g.row * MQ);
            scores(vh + g.start * V.s2, V.s2 * g.step, g.count, dot.data(), DV, dst.data() + g.row * MQ);
          }
          // P = exp(S - lse); rowsum(dO * O) = sum_c P dP (from the buffers in cache, not a pass over O), or `delta`
          vf di = vzero();
          for (int64_t c = 0; c < bl.n; ++c) {
            const vf p = vmaskz(mask[c], vexp(vsub(vloadu(pt.data() + c * MQ), lsel)));
            vstoreu(pt.data() + c * MQ, p);
            di = vfmadd(p, vloadu(dst.data() + c * MQ), di);
          }
          if (given) {
            alignas(64) float dv_[MQ] = {0};
            const float* rh = Rs.head(b, h);
            for (int64_t i = 0; i < bl.m; ++i) dv_[i] = rh[(bl.q0 + i) * Rs.s2];
            di = vloadu(dv_);
          }
          for (int64_t c = 0; c < bl.n; ++c) {  // dS = P * (dP - rowsum)
            const vf p = vloadu(pt.data() + c * MQ);
            vstoreu(dst.data() + c * MQ, vmul(p, vsub(vloadu(dst.data() + c * MQ), di)));
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
    vfence();
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
  vf shift;
  if (query) {
    shift = vset1(-std::numeric_limits<float>::infinity());
    for (int64_t f = 0; f < F; ++f) shift = vmax(shift, vloadu(ft + f * MQ));
  } else {
    shift = vzero();
    for (int64_t d = 0; d < D; ++d) {
      const vf x = vloadu(xt + d * MQ);
      shift = vfmadd(x, x, shift);
    }
    shift = vmul(shift, vset1(0.5f / std::sqrt((float)D)));
  }
  shift = vadd(shift, vset1(half_log));
  for (int64_t f = 0; f < F; ++f) vstoreu(ft + f * MQ, vexp(vsub(vloadu(ft + f * MQ), shift)));
}

// dst[0 .. F) = phi(src): relu; elu(x) + 1 (= x + 1 above 0, exp(x) below); or a copy.
inline void map_row(const float* src, int64_t F, int64_t feature, float* dst) {
  const vf zero = vzero(), one = vset1(1.f);
  for (int64_t f = 0; f < F; f += 16) {
    const vf x = vloadu(src + f);
    vf y = x;
    if (feature == FEATURE_RELU) y = vmax(x, zero);
    if (feature == FEATURE_ELU1) {
      const mask16 pos = vgt(x, zero);
      y = vmask_add(vexp(vmin(x, zero)), pos, x, one);
    }
    vstoreu(dst + f, y);
  }
}

inline float hsum(vf x) { return vhsum(x); }

// acc[0 .. n) += the m rows of x (ld apart); n a multiple of 16.
inline void add_rows(float* acc, const float* x, int64_t ld, int64_t m, int64_t n) {
  for (int64_t f = 0; f < n; f += 16) {
    vf a = vloadu(acc + f);
    for (int64_t c = 0; c < m; ++c) a = vadd(a, vloadu(x + c * ld + f));
    vstoreu(acc + f, a);
  }
}

// y[0 .. n) += a x; n a multiple of 16.
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const vf s = vset1(a);
  for (int64_t f = 0; f < n; f += 16) vstoreu(y + f, vfmadd(s, vloadu(x + f), vloadu(y + f)));
}

void linear_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, int64_t feature,
                    bool normalize, double eps, double l1_eps, bool accumulate, const Arr& proj,
                    const Arr& den_out) {
  NAS_CHECK(q.dim() == 4 && k.same_sizes(q) && v.dim() == 4 && out.same_sizes(v) &&
                  v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "linear attention: shapes");
  check_layout("linear attention", {&q, &k, &v, &out});
  NAS_CHECK(feature >= FEATURE_NONE && feature <= FEATURE_COSFORMER, "linear attention: feature map");
  const bool favor = feature == FEATURE_PERFORMER, cosf = feature == FEATURE_COSFORMER;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), DV = v.size(3);
  const int64_t F = favor ? proj.size(0) : cosf ? 2 * D : D;
  NAS_CHECK(!cosf || (proj.dim() == 2 && proj.size(0) == T && proj.size(1) == 2 && proj.is_contiguous() &&
                        proj.dtype == DType::Float32),
              "linear attention: cosformer's angles (T, 2) float32 contiguous");
  NAS_CHECK(!favor || (proj.dim() == 2 && proj.size(1) == D && proj.is_contiguous() && proj.dtype == DType::Float32 &&
                         D % 16 == 0 && D <= 512),
              "linear attention: performer's projection (F, D) float32 contiguous, D a multiple of 16 up to 512");
  NAS_CHECK(F % 16 == 0 && F > 0 && F <= 512, "linear attention: features a multiple of 16, at most 512");
  NAS_CHECK(DV % 16 == 0 && (DV <= 64 || DV == 128), "linear attention: value head sizes 16, 32, 48, 64 or 128");
  const bool keep = den_out.numel() > 0;  // the backward's input: each row's denominator plus eps
  NAS_CHECK(!keep || (normalize && den_out.is_contiguous() && den_out.dtype == DType::Float32 &&
                        den_out.numel() == B * H * T),
              "linear attention: the denominators' output (B, H, T) float32 contiguous, when normalising");
  if (T == 0 || B * H == 0) return;
  const View Q(q), K(k), V(v), O(out);
  const float* W = favor || cosf ? proj.f() : nullptr;
  float* dens = keep ? den_out.f() : nullptr;
  parallel(B * H, [&](int64_t begin, int64_t end) {
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
            vf l1 = vzero();
            for (int64_t f = 0; f < F; f += 16) {
              vstoreu(za.data() + f, vadd(vloadu(za.data() + f), vabs(vloadu(kr + f))));
              l1 = vadd(l1, vabs(vloadu(qr + f)));
            }
            const vf n = vadd(vset1(hsum(l1)), vset1((float)l1_eps));
            for (int64_t f = 0; f < F; f += 16) {
              const vf qn = vdiv(vloadu(qr + f), n);
              vstoreu(qd + f, vdiv(qn, vadd(vloadu(za.data() + f), vset1((float)eps))));
            }
          } else if (cosf) {
            const vf zero = vzero(), c = vset1(W[(q0 + r) * 2]), sn = vset1(W[(q0 + r) * 2 + 1]);
            for (int64_t f = 0; f < D; f += 16) {
              const vf a = vmax(vloadu(qr + f), zero), e = vmax(vloadu(kr + f), zero);
              vstoreu(qd + f, vmul(a, c));
              vstoreu(qd + D + f, vmul(a, sn));
              vstoreu(kd + f, vmul(e, c));
              vstoreu(kd + D + f, vmul(e, sn));
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
        vf den = vzero();
        for (int64_t c = 0; c < m; ++c) {  // key c is seen by the queries r >= c
          const vf a = vmaskz((mask16)(0xFFFFu << c), vloadu(sc.data() + c * MQ));
          vstoreu(sc.data() + c * MQ, a);
          den = vadd(den, a);
        }
        alignas(64) float inv[MQ];
        if (normalize) {
          for (int64_t f = 0; f < F; ++f) den = vfmadd(vset1(z[f]), vloadu(qt.data() + f * MQ), den);
          const vf de = vadd(den, vset1((float)eps));
          vstoreu(inv, vdiv(vset1(1.f), de));
          if (keep) vmask_storeu(dens + w * T + q0, (mask16)((1u << m) - 1u), de);
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
void linear_backward(const Arr& q, const Arr& k, const Arr& v, const Arr& g,
                     const Arr& out, const Arr& den, const Arr& dq, const Arr& dk, const Arr& dv,
                     bool normalize) {
  NAS_CHECK(q.dim() == 4 && k.same_sizes(q) && v.dim() == 4 && g.same_sizes(v) && out.same_sizes(v) &&
                  dq.same_sizes(q) && dk.same_sizes(q) && dv.same_sizes(v) &&
                  v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "linear attention backward: shapes");
  check_layout("linear attention backward", {&q, &k, &v, &g, &out, &dq, &dk, &dv});
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), F = q.size(3), DV = v.size(3);
  NAS_CHECK(F % 16 == 0 && F > 0 && F <= 512, "linear attention backward: features a multiple of 16, at most 512");
  NAS_CHECK(DV % 16 == 0 && (DV <= 64 || DV == 128), "linear attention backward: value head sizes 16, 32, 48, 64 or 128");
  NAS_CHECK(!normalize || (den.is_contiguous() && den.dtype == DType::Float32 && den.numel() == B * H * T),
              "linear attention backward: the denominators (B, H, T) float32 contiguous");
  if (T == 0 || B * H == 0) return;
  const View Q(q), K(k), V(v), G(g), O(out), DQ(dq), DK(dk), DVV(dv);
  const float* dens = normalize ? den.f() : nullptr;
  const int64_t nblk = (T + MQ - 1) / MQ;
  parallel(B * H, [&](int64_t begin, int64_t end) {
    std::vector<float> ST(DV * F), z(F), R(F * DV), RT(DV * F), y(F), dn(MQ * DV), dd(MQ), dnt(DV * MQ), qt(F * MQ),
        sa(MQ * MQ), sd(MQ * MQ);
    // dn and dd of the block at q0 (m rows; rows past m zero), dn transposed into dnt; sd = dA (keys c x lanes i), masked
    auto block_grads = [&](int64_t w, const float* gh, const float* oh, const float* vb, int64_t q0, int64_t m) {
      std::fill(dn.begin(), dn.end(), 0.f);
      std::fill(dd.begin(), dd.end(), 0.f);
      for (int64_t r = 0; r < m; ++r) {
        const float *gr = gh + (q0 + r) * G.s2, *orow = oh + (q0 + r) * O.s2;
        float* d = dn.data() + r * DV;
        const vf inv = vset1(normalize ? 1.f / dens[w * T + q0 + r] : 1.f);
        vf acc = vzero();
        for (int64_t e = 0; e < DV; e += 16) {
          const vf x = vmul(vloadu(gr + e), inv);
          vstoreu(d + e, x);
          acc = vfmadd(x, vloadu(orow + e), acc);
        }
        if (normalize) dd[r] = -hsum(acc);
      }
      const float* rows[MQ];
      for (int r = 0; r < MQ; ++r) rows[r] = dn.data() + r * DV;
      transpose_rows(rows, DV, 1.f, dnt.data());
      scores(vb, V.s2, m, dnt.data(), DV, sd.data());  // sd[c][i] = v_c . dn_i
      const vf ddv = vloadu(dd.data());
      for (int64_t c = 0; c < m; ++c) {  // row i sees key c for i >= c
        const mask16 seen = (mask16)(0xFFFFu << c);
        vstoreu(sd.data() + c * MQ, vmaskz_add(seen, vloadu(sd.data() + c * MQ), ddv));
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
          vstoreu(sa.data() + c * MQ, vmaskz((mask16)(0xFFFFu << c), vloadu(sa.data() + c * MQ)));
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
void dwconv_forward(const Arr& x, const Arr& w, const Arr& out, const std::vector<int64_t>& offsets) {
  NAS_CHECK(x.dim() == 4 && out.same_sizes(x) && x.size(3) % 16 == 0, "depthwise conv: shapes");
  check_layout("depthwise conv", {&x, &out, &w});
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), NT = (int64_t)offsets.size();
  NAS_CHECK(w.is_contiguous() && w.dim() == 2 && w.size(0) == NT && w.size(1) == H * D, "depthwise conv: taps (K, H * D)");
  const View X(x), O(out);
  const float* W = w.f();
  parallel(B * H, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* xh = X.head(b, h);
      float* oh = O.head(b, h);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < D; d += 16) {
          vf acc = vzero();
          for (int64_t s = 0; s < NT; ++s) {
            const int64_t j = t + offsets[s];
            if (j >= 0 && j < T) acc = vfmadd(vloadu(W + s * H * D + h * D + d), vloadu(xh + j * X.s2 + d), acc);
          }
          vstoreu(oh + t * O.s2 + d, acc);
        }
      }
    }
  });
}

// hydra: out_t = n(q_t) * s_t per channel, n(x) = x / max(|x|_2, eps); causal: s_t = mean_{j<=t} n(k_j) * v_j (a
// running sum over the tokens in order), else s = the mean over every token.  q, k, v, out (B, H, T, D) with the last
// stride 1, D a multiple of 16 up to 512: one pass over the tokens, where the torch path writes five tensors.
inline vf l2_scale(const float* x, int64_t D, float eps) {
  vf sq = vzero();
  for (int64_t d = 0; d < D; d += 16) {
    const vf a = vloadu(x + d);
    sq = vfmadd(a, a, sq);
  }
  return vset1(1.f / std::max(std::sqrt(vhsum(sq)), eps));
}

// s += n(k_t) * v_t per channel
inline void add_kv(float* s, const float* kt, const float* vt, int64_t D, float eps) {
  const vf n = l2_scale(kt, D, eps);
  for (int64_t d = 0; d < D; d += 16) {
    vstoreu(s + d, vfmadd(vmul(vloadu(kt + d), n), vloadu(vt + d), vloadu(s + d)));
  }
}

void hydra_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, bool causal, double eps) {
  NAS_CHECK(q.dim() == 4 && k.same_sizes(q) && v.same_sizes(q) && out.same_sizes(q) &&
                  q.size(3) % 16 == 0 && q.size(3) <= 512,
              "hydra: shapes (B, H, T, D), D a multiple of 16 up to 512");
  check_layout("hydra", {&q, &k, &v, &out});
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const View Q(q), K(k), V(v), O(out);
  const float e = (float)eps;
  parallel(B * H, [&](int64_t begin, int64_t end) {
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
        const vf n = vdiv(l2_scale(qt, D, e), vset1((float)(causal ? t + 1 : T)));
        float* ot = oh + t * O.s2;
        for (int64_t d = 0; d < D; d += 16) {
          vstoreu(ot + d, vmul(vmul(vloadu(qt + d), n), vloadu(s + d)));
        }
      }
    }
  });
}

}  // namespace nas
