/* simd_avx512.h -- the AVX-512F mapping (see simd.h for the contract).
 * Included by simd.h once for the types and constants, then once per
 * element type (FA_SFX f32, f64) for the operations: V(op) -> vf_op, vd_op
 * on _mm512_op_ps, _mm512_op_pd. */
#ifndef FA_SFX
#if defined(FA_AVX512_SIMDE)
/* Test builds only (setup.py, FASTATTN_AVX512_EMULATION=simde): the same
 * AVX-512 source, its _mm512 intrinsics implemented by SIMDe on AVX2, so the
 * AVX-512 kernels can be executed and checked on a CPU without AVX-512. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif
#include "simd/x86.h"
typedef __m512 vf;
typedef __m512d vd;
#define VF_W 16
#define VD_W 8
#define VF_MR 8
#define VF_NRV 2
#define VD_MR 8
#define VD_NRV 2
#define VF_PV_MR 8
#define VD_PV_MR 8
/* scalef: ldexp exact for any n (vmath_tmpl.h's exp2 needs no clamp) */
#define FA_SIMD_SCALEF 1
#include "simd/transpose_x86.h"
/* 16-bit storage widened to a float vector: vcvtph2ps (float16, AVX-512F),
 * a shift (bfloat16: the upper half of a float32); every lane exact. */
#if !defined(FA_AVX512_SIMDE)
static inline vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vf_load_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#else /* SIMDe has neither conversion: two AVX2 halves through memory */
static inline vf vf_load_f16(const uint16_t *p)
{
    float t[16];
    _mm256_storeu_ps(t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
    _mm256_storeu_ps(t + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
    return _mm512_loadu_ps(t);
}
static inline vf vf_load_bf16(const uint16_t *p)
{
    uint32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = (uint32_t)p[i] << 16;
    return _mm512_castsi512_ps(_mm512_loadu_si512((const void *)t));
}
#endif
/* the low halves of x's 16 dwords as 16 halves at p (vpmovdw; SIMDe lacks
 * it: through memory) */
static inline void fa_store_lo16(uint16_t *p, __m512i x)
{
#if !defined(FA_AVX512_SIMDE)
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(x));
#else
    uint32_t t[16];
    _mm512_storeu_si512((void *)t, x);
    for (int i = 0; i < 16; i++) p[i] = (uint16_t)t[i];
#endif
}
/* float vector rounded to nearest even into 16-bit storage (overflow to
 * +-inf, NaN stays a quiet NaN) */
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                              _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    fa_store_lo16(p, _mm512_srli_epi32(r, 16));
}
#if !defined(FA_AVX512_SIMDE)
static inline void vf_store_f16(uint16_t *p, vf x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else
static inline void vf_store_f16(uint16_t *p, vf x)
{
    float t[16];
    _mm512_storeu_ps(t, x);
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(_mm256_loadu_ps(t), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)(p + 8), _mm256_cvtps_ph(_mm256_loadu_ps(t + 8), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif

#else /* the operations of element type FA_SFX */
#define FA_MM _mm512 /* MM(add) -> _mm512_add_ps, _mm512_add_pd (x86.h) */
#define FA_MMSI si512
#define MMASK(op) FA_CAT(MM(op), mask) /* MMASK(cmp) -> _mm512_cmp_ps_mask */
#include "simd/x86_ops_tmpl.h"
static inline VT V(round)(VT x) { return MM(roundscale)(x, FA_RN); }
static inline VT V(ldexp)(VT p, VT n) { return MM(scalef)(p, n); }
static inline VT V(zero_below)(VT p, VT x, FA_T lo)
{
    return MM(mask_mov)(p, MMASK(cmp)(x, MM(set1)(lo), _CMP_LT_OQ), MM(setzero)());
}
/* p 2^n where x >= lo (or x is NaN), 0 where x < lo: scalef under the mask */
static inline VT V(ldexp_from)(VT p, VT n, VT x, FA_T lo)
{
    return MM(maskz_scalef)(MMASK(cmp)(x, MM(set1)(lo), _CMP_NLT_UQ), p, n);
}
/* 1 if every lane of x is < lo (NaN is not) */
static inline int V(all_below)(VT x, FA_T lo)
{
    return MMASK(cmp)(x, MM(set1)(lo), _CMP_LT_OQ) == (1 << VC(W)) - 1;
}
/* a where x < lo, else b (NaN x: b) */
static inline VT V(where_below)(VT a, VT b, VT x, FA_T lo)
{
    return MM(mask_mov)(b, MMASK(cmp)(x, MM(set1)(lo), _CMP_LT_OQ), a);
}
/* lanes of acc become NaN where x is NaN (sticky NaN detector) */
static inline VT V(nan_acc)(VT acc, VT x) { return MM(mask_mov)(acc, MMASK(cmp)(x, x, _CMP_UNORD_Q), x); }
/* Horizontal max / sum: the two 256-bit halves combined, then within 256
 * bits (x86.h; AVX-512F only: no AVX512DQ extract). */
#if !FA_IS_F64(FA_SFX)
static inline __m256 vf_hi256(vf a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
static inline float vf_hmax(vf a) { return fa_hmax256_ps(_mm256_max_ps(_mm512_castps512_ps256(a), vf_hi256(a))); }
static inline float vf_hsum(vf a) { return fa_hsum256_ps(_mm256_add_ps(_mm512_castps512_ps256(a), vf_hi256(a))); }
/* lane i = the sum of x[i]'s lanes, for the 16 vectors x[0..16): pairs of
 * 256-bit halves added, then 128-bit quarters, then a 4 x 4 transpose-add
 * within the quarters; the inputs taken as x[4m + k] -> slot 4k + m so that
 * lane 4m + k, which sums slot 4k + m, is x[4m + k]'s. */
/* _mm512_shuffle_f32x4 spelled through its integer twin (SIMDe has only that) */
#define FA_SHUF128(a, b, imm) \
    _mm512_castsi512_ps(_mm512_shuffle_i32x4(_mm512_castps_si512(a), _mm512_castps_si512(b), imm))
static inline vf vf_hsum_lanes(const vf *x)
{
    vf y[8], z[4];
    for (int i = 0; i < 8; i++) {
        const vf a = x[(2 * i) % 4 * 4 + (2 * i) / 4], b = x[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
        y[i] = _mm512_add_ps(FA_SHUF128(a, b, 0x44), FA_SHUF128(a, b, 0xee));
    }
    for (int i = 0; i < 4; i++)
        z[i] = _mm512_add_ps(FA_SHUF128(y[2 * i], y[2 * i + 1], 0x88),
                             FA_SHUF128(y[2 * i], y[2 * i + 1], 0xdd));
    const vf t0 = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
    const vf t1 = _mm512_add_ps(_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xee));
}
/* VF_W int8 at p, sign-extended and converted to float (the int8 KV cache);
 * SIMDe has no 512-bit cvtepi8_epi32 / cvtepi32_ps: element by element there */
#if defined(FA_AVX512_SIMDE)
static inline vf vf_load_i8(const int8_t *p)
{
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = (float)p[i];
    return _mm512_loadu_ps(t);
}
#else
static inline vf vf_load_i8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
#endif
#else
static inline __m256d vd_hi256(vd a) { return _mm512_extractf64x4_pd(a, 1); }
static inline double vd_hmax(vd a) { return fa_hmax256_pd(_mm256_max_pd(_mm512_castpd512_pd256(a), vd_hi256(a))); }
static inline double vd_hsum(vd a) { return fa_hsum256_pd(_mm256_add_pd(_mm512_castpd512_pd256(a), vd_hi256(a))); }
#endif
#undef FA_MM
#undef FA_MMSI
#undef MMASK
#endif
