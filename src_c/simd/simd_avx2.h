/* simd_avx2.h -- the AVX2 + FMA mapping (see simd.h for the contract).
 * Included by simd.h once for the types and constants, then once per
 * element type (FA_SFX f32, f64) for the operations: V(op) -> vf_op, vd_op
 * on _mm256_op_ps, _mm256_op_pd. */
#ifndef FA_SFX
#include <immintrin.h>
#include "simd/x86.h"
typedef __m256 vf;
typedef __m256d vd;
#define VF_W 8
#define VD_W 4
#define VF_MR 6
#define VF_NRV 2
#define VD_MR 6
#define VD_NRV 2
#define VF_PV_MR 6
#define VD_PV_MR 6
/* the int8 KV cache's integer dot products (VPMADDWD) */
#define FA_SIMD_Q8_DOT "simd/q8_dot_avx2.h"
#include "simd/transpose_x86.h"
/* 16-bit storage widened to a float vector: F16C (float16), a shift
 * (bfloat16: the upper half of a float32); every lane exact. */
static inline vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vf_load_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* float vector rounded to nearest even into 16-bit storage (overflow to
 * +-inf, NaN stays a quiet NaN) */
static inline void vf_store_f16(uint16_t *p, vf x)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(r));
}

#else /* the operations of element type FA_SFX */
#define FA_MM _mm256 /* MM(add) -> _mm256_add_ps, _mm256_add_pd (x86.h) */
#define FA_MMSI si256
#include "simd/x86_ops_tmpl.h"
static inline VT V(round)(VT x) { return MM(round)(x, FA_RN); }
static inline VT V(zero_below)(VT p, VT x, FA_T lo) { return MM(andnot)(MM(cmp)(x, MM(set1)(lo), _CMP_LT_OQ), p); }
/* 1 if every lane of x is < lo (NaN is not) */
static inline int V(all_below)(VT x, FA_T lo)
{
    return MM(movemask)(MM(cmp)(x, MM(set1)(lo), _CMP_LT_OQ)) == (1 << VC(W)) - 1;
}
/* a where x < lo, else b (NaN x: b) */
static inline VT V(where_below)(VT a, VT b, VT x, FA_T lo) { return MM(blendv)(b, a, MM(cmp)(x, MM(set1)(lo), _CMP_LT_OQ)); }
/* lanes of acc become all-ones bits (a NaN) where x is NaN */
static inline VT V(nan_acc)(VT acc, VT x) { return MM(or)(acc, MM(cmp)(x, x, _CMP_UNORD_Q)); }
#if !FA_IS_F64(FA_SFX)
/* lane i = the sum of x[i]'s lanes, for the 8 vectors x[0..8): three
 * rounds of horizontal adds, then the 128-bit halves added */
static inline vf vf_hsum_lanes(const vf *x)
{
    const vf g0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
    const vf g1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}
/* VF_W int8 at p, sign-extended and converted to float (the int8 KV cache) */
static inline vf vf_load_i8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
/* p * 2^n by the exponent bits of 2^n: normal for n in [-126, 0] */
static inline vf vf_ldexp(vf p, vf n)
{
    __m256i e = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#else
/* p * 2^n by the exponent bits of 2^n: normal for n in [-1022, 0] */
static inline vd vd_ldexp(vd p, vd n)
{
    __m128i n32 = _mm256_cvtpd_epi32(_mm256_max_pd(n, _mm256_set1_pd(-1022.0)));
    __m256i e = _mm256_cvtepi32_epi64(n32);
    e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}
#endif
/* p 2^n where x >= lo (or x is NaN), 0 where x < lo */
static inline VT V(ldexp_from)(VT p, VT n, VT x, FA_T lo) { return V(zero_below)(V(ldexp)(p, n), x, lo); }
static inline FA_T V(hmax)(VT a) { return FA_CAT(fa_hmax256, FA_PASTE(FA_PS_, FA_SFX))(a); }
static inline FA_T V(hsum)(VT a) { return FA_CAT(fa_hsum256, FA_PASTE(FA_PS_, FA_SFX))(a); }
#undef FA_MM
#undef FA_MMSI
#endif
