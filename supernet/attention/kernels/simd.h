// The kernels' vector of 16 floats (one block's 16 query lanes) and 16-bit lane masks, for the instruction set the file
// is compiled for (window_attention.cpp; supernet/attention/native.py passes the flags):
//
//   AVX-512 (-mavx512f -mavx512dq -mfma): one __m512, the masks __mmask16: every operation one instruction;
//   AVX2 + FMA (-mavx2 -mfma):            two __m256, a mask expanded to two lane masks where an operation takes one;
//   aarch64 Neon (no flag: every aarch64 core has it): four float32x4_t.
//
// Every operation gives the same result on each (IEEE float32 arithmetic, the same fused multiply-adds, the same
// exponential's polynomial); only vhsum's order of additions differs.  KEY_TILE and PRODUCT_COLS / PRODUCT_ROWS are
// the register tiles the kernels' inner loops use: AVX2 has 16 vector registers (a vf takes two), Neon 32 (a vf takes
// four), AVX-512 32 (a vf takes one).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
#define NAS_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define NAS_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define NAS_NEON 1
#include <arm_neon.h>
#else
#error "window_attention.cpp needs AVX-512 (-mavx512f -mavx512dq -mfma), AVX2 (-mavx2 -mfma) or aarch64 Neon"
#endif

namespace simd {

using mask16 = uint16_t;  // lane r of a vf: bit r

#if NAS_AVX512
constexpr const char* ISA = "avx512";
constexpr int KEY_TILE = 16;     // keys per score tile: 16 accumulators
using vf = __m512;

inline vf vloadu(const float* p) { return _mm512_loadu_ps(p); }
inline void vstoreu(float* p, vf a) { _mm512_storeu_ps(p, a); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
inline vf vfnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf vabs(vf a) { return _mm512_abs_ps(a); }
inline float vhsum(vf a) { return _mm512_reduce_add_ps(a); }
inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vscale2(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n integral
inline vf vmaskz(mask16 m, vf a) { return _mm512_maskz_mov_ps(m, a); }                  // a where m, else 0
inline vf vmask_mov(vf src, mask16 m, vf a) { return _mm512_mask_mov_ps(src, m, a); }  // a where m, else src
inline vf vmask_max(vf src, mask16 m, vf a, vf b) { return _mm512_mask_max_ps(src, m, a, b); }
inline vf vmaskz_add(mask16 m, vf a, vf b) { return _mm512_maskz_add_ps(m, a, b); }
inline vf vmask_add(vf src, mask16 m, vf a, vf b) { return _mm512_mask_add_ps(src, m, a, b); }
inline vf vmaskz_loadu(mask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }  // reads the lanes of m only
inline void vmask_storeu(float* p, mask16 m, vf a) { _mm512_mask_storeu_ps(p, m, a); }   // writes the lanes of m only
inline mask16 vgt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline void vstream(float* p, vf a) { _mm512_stream_ps(p, a); }  // p 64-byte aligned
inline void vfence() { _mm_sfence(); }

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

#elif NAS_AVX2
constexpr const char* ISA = "avx2";
constexpr int KEY_TILE = 6;  // 12 accumulators, 2 for the queries, 1 broadcast key element: the 16 registers
struct vf {
  __m256 lo, hi;
};

inline vf vloadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstoreu(float* p, vf a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline vf vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline vf vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vf vadd(vf a, vf b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline vf vsub(vf a, vf b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline vf vmul(vf a, vf b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vf vdiv(vf a, vf b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline vf vfmadd(vf a, vf b, vf c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline vf vfnmadd(vf a, vf b, vf c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline vf vmax(vf a, vf b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline vf vmin(vf a, vf b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline vf vabs(vf a) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
inline float vhsum(vf a) {
  const __m256 s = _mm256_add_ps(a.lo, a.hi);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline vf vround(vf a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
// p 2^n for integral n in [-126, 128] (vexp's range): two exact power-of-two factors, each a normal float
inline __m256 scale2(__m256 p, __m256 n) {
  const __m256i e = _mm256_cvtps_epi32(n), e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}
inline vf vscale2(vf p, vf n) { return {scale2(p.lo, n.lo), scale2(p.hi, n.hi)}; }
inline vf expand(mask16 m) {  // lane r all ones where bit r of m is set
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128), high = _mm256_slli_epi32(bits, 8);
  const __m256i b = _mm256_set1_epi32(m);
  return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, bits), bits)),
          _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, high), high))};
}
inline vf vmaskz(mask16 m, vf a) {
  const vf k = expand(m);
  return {_mm256_and_ps(k.lo, a.lo), _mm256_and_ps(k.hi, a.hi)};
}
inline vf vmask_mov(vf src, mask16 m, vf a) {
  const vf k = expand(m);
  return {_mm256_blendv_ps(src.lo, a.lo, k.lo), _mm256_blendv_ps(src.hi, a.hi, k.hi)};
}
inline vf vmask_max(vf src, mask16 m, vf a, vf b) { return vmask_mov(src, m, vmax(a, b)); }
inline vf vmaskz_add(mask16 m, vf a, vf b) { return vmaskz(m, vadd(a, b)); }
inline vf vmask_add(vf src, mask16 m, vf a, vf b) { return vmask_mov(src, m, vadd(a, b)); }
inline vf vmaskz_loadu(mask16 m, const float* p) {
  const vf k = expand(m);
  return {_mm256_maskload_ps(p, _mm256_castps_si256(k.lo)), _mm256_maskload_ps(p + 8, _mm256_castps_si256(k.hi))};
}
inline void vmask_storeu(float* p, mask16 m, vf a) {
  const vf k = expand(m);
  _mm256_maskstore_ps(p, _mm256_castps_si256(k.lo), a.lo);
  _mm256_maskstore_ps(p + 8, _mm256_castps_si256(k.hi), a.hi);
}
inline mask16 vgt(vf a, vf b) {
  return (mask16)(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)) |
                  (_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)) << 8));
}
inline void vstream(float* p, vf a) {  // p 64-byte aligned
  _mm256_stream_ps(p, a.lo);
  _mm256_stream_ps(p + 8, a.hi);
}
inline void vfence() { _mm_sfence(); }

// dst[d * 16 + r] = rows[r][d0 + d] * sc for d < 16: four 8 x 8 tiles transposed in registers.
inline void transpose16(const float* const* rows, int64_t d0, float sc, float* dst) {
  const __m256 s = _mm256_set1_ps(sc);
  for (int rh = 0; rh < 16; rh += 8) {
    for (int ch = 0; ch < 16; ch += 8) {
      __m256 r[8], t[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(_mm256_loadu_ps(rows[rh + i] + d0 + ch), s);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + (ch + i) * 16 + rh, _mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
        _mm256_storeu_ps(dst + (ch + 4 + i) * 16 + rh, _mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
      }
    }
  }
}

#else  // NAS_NEON
constexpr const char* ISA = "neon";
constexpr int KEY_TILE = 6;  // 24 accumulator registers, 4 for the queries, 1 broadcast: 29 of 32
struct vf {
  float32x4_t v[4];
};

#define NAS_EACH(expr)            \
  vf r;                           \
  for (int i = 0; i < 4; ++i) {   \
    r.v[i] = expr;                \
  }                               \
  return r

inline vf vloadu(const float* p) { NAS_EACH(vld1q_f32(p + 4 * i)); }
inline void vstoreu(float* p, vf a) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.v[i]);
}
inline vf vset1(float x) { NAS_EACH(vdupq_n_f32(x)); }
inline vf vzero() { NAS_EACH(vdupq_n_f32(0.f)); }
inline vf vadd(vf a, vf b) { NAS_EACH(vaddq_f32(a.v[i], b.v[i])); }
inline vf vsub(vf a, vf b) { NAS_EACH(vsubq_f32(a.v[i], b.v[i])); }
inline vf vmul(vf a, vf b) { NAS_EACH(vmulq_f32(a.v[i], b.v[i])); }
inline vf vdiv(vf a, vf b) { NAS_EACH(vdivq_f32(a.v[i], b.v[i])); }
inline vf vfmadd(vf a, vf b, vf c) { NAS_EACH(vfmaq_f32(c.v[i], a.v[i], b.v[i])); }
inline vf vfnmadd(vf a, vf b, vf c) { NAS_EACH(vfmsq_f32(c.v[i], a.v[i], b.v[i])); }
inline vf vmax(vf a, vf b) { NAS_EACH(vmaxq_f32(a.v[i], b.v[i])); }
inline vf vmin(vf a, vf b) { NAS_EACH(vminq_f32(a.v[i], b.v[i])); }
inline vf vabs(vf a) { NAS_EACH(vabsq_f32(a.v[i])); }
inline float vhsum(vf a) { return vaddvq_f32(vaddq_f32(vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3]))); }
inline vf vround(vf a) { NAS_EACH(vrndnq_f32(a.v[i])); }
inline float32x4_t scale2(float32x4_t p, float32x4_t n) {  // p 2^n for integral n in [-126, 128]: two exact factors
  const int32x4_t e = vcvtq_s32_f32(n), e1 = vshrq_n_s32(e, 1), e2 = vsubq_s32(e, e1), bias = vdupq_n_s32(127);
  const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e1, bias), 23));
  const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e2, bias), 23));
  return vmulq_f32(vmulq_f32(p, f1), f2);
}
inline vf vscale2(vf p, vf n) { NAS_EACH(scale2(p.v[i], n.v[i])); }
inline uint32x4_t part(mask16 m, int i) {  // lanes 4i .. 4i + 3 all ones where their bit of m is set
  const uint32_t b = 1u << (4 * i);
  const uint32x4_t bits = {b, b << 1, b << 2, b << 3};
  return vtstq_u32(vdupq_n_u32(m), bits);
}
inline vf vmaskz(mask16 m, vf a) { NAS_EACH(vbslq_f32(part(m, i), a.v[i], vdupq_n_f32(0.f))); }
inline vf vmask_mov(vf src, mask16 m, vf a) { NAS_EACH(vbslq_f32(part(m, i), a.v[i], src.v[i])); }
inline vf vmask_max(vf src, mask16 m, vf a, vf b) { return vmask_mov(src, m, vmax(a, b)); }
inline vf vmaskz_add(mask16 m, vf a, vf b) { return vmaskz(m, vadd(a, b)); }
inline vf vmask_add(vf src, mask16 m, vf a, vf b) { return vmask_mov(src, m, vadd(a, b)); }
inline vf vmaskz_loadu(mask16 m, const float* p) {
  alignas(16) float x[16];
  for (int r = 0; r < 16; ++r) x[r] = (m >> r) & 1 ? p[r] : 0.f;
  return vloadu(x);
}
inline void vmask_storeu(float* p, mask16 m, vf a) {
  alignas(16) float x[16];
  vstoreu(x, a);
  for (int r = 0; r < 16; ++r) {
    if ((m >> r) & 1) p[r] = x[r];
  }
}
inline mask16 vgt(vf a, vf b) {
  unsigned m = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32x4_t bits = {1u, 2u, 4u, 8u};
    m |= vaddvq_u32(vandq_u32(vcgtq_f32(a.v[i], b.v[i]), bits)) << (4 * i);
  }
  return (mask16)m;
}
inline void vstream(float* p, vf a) { vstoreu(p, a); }
inline void vfence() {}
#undef NAS_EACH

// dst[d * 16 + r] = rows[r][d0 + d] * sc for d < 16: sixteen 4 x 4 tiles transposed in registers.
inline void transpose16(const float* const* rows, int64_t d0, float sc, float* dst) {
  for (int rq = 0; rq < 16; rq += 4) {
    for (int cq = 0; cq < 16; cq += 4) {
      float32x4_t a = vmulq_n_f32(vld1q_f32(rows[rq] + d0 + cq), sc), b = vmulq_n_f32(vld1q_f32(rows[rq + 1] + d0 + cq), sc);
      float32x4_t c = vmulq_n_f32(vld1q_f32(rows[rq + 2] + d0 + cq), sc), d = vmulq_n_f32(vld1q_f32(rows[rq + 3] + d0 + cq), sc);
      const float32x4_t t0 = vtrn1q_f32(a, b), t1 = vtrn2q_f32(a, b), t2 = vtrn1q_f32(c, d), t3 = vtrn2q_f32(c, d);
      vst1q_f32(dst + (cq + 0) * 16 + rq, vcombine_f32(vget_low_f32(t0), vget_low_f32(t2)));
      vst1q_f32(dst + (cq + 1) * 16 + rq, vcombine_f32(vget_low_f32(t1), vget_low_f32(t3)));
      vst1q_f32(dst + (cq + 2) * 16 + rq, vcombine_f32(vget_high_f32(t0), vget_high_f32(t2)));
      vst1q_f32(dst + (cq + 3) * 16 + rq, vcombine_f32(vget_high_f32(t1), vget_high_f32(t3)));
    }
  }
}
#endif

// exp(x): Cephes' polynomial on x = n ln2 + r, times 2^n (x below -87.3 is taken as -87.3: about 1e-38; above 89, inf).
inline vf vexp(vf x) {
  const vf log2e = vset1(1.44269504088896341f);
  const vf ln2hi = vset1(0.693359375f), ln2lo = vset1(-2.12194440e-4f);
  x = vmax(x, vset1(-87.3f));
#if !NAS_AVX512
  x = vmin(x, vset1(89.f));  // vscale2's range (AVX-512's scalef takes any n)
#endif
  const vf n = vround(vmul(x, log2e));
  vf r = vfnmadd(n, ln2hi, x);
  r = vfnmadd(n, ln2lo, r);
  vf p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vfmadd(p, vmul(r, r), vadd(r, vset1(1.f)));
  return vscale2(p, n);
}

// Bits lo .. hi of a lane mask (clipped to 0 .. 15; none where hi < lo).
inline mask16 lanes(int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 15 ? 15 : hi;
  if (hi < lo) return 0;
  return (mask16)(((1u << (hi - lo + 1)) - 1u) << lo);
}

inline void prefetch_l2(const float* p) { __builtin_prefetch(p, 0, 2); }

}  // namespace simd
