/* simd_avx2.h -- the AVX2 + FMA mapping (see simd.h for the contract). */
#include <immintrin.h>
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
#define FA_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
static inline vf vf_set1(float a) { return _mm256_set1_ps(a); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_max_acc(vf acc, vf x) { return _mm256_max_ps(x, acc); }
static inline vf vf_round(vf x) { return _mm256_round_ps(x, FA_RN); }
/* p * 2^n by the exponent bits of 2^n: normal for n in [-126, 0] */
static inline vf vf_ldexp(vf p, vf n)
{
    __m256i e = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vf vf_zero_below(vf p, vf x, float lo)
{
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_LT_OQ), p);
}
static inline vf vf_exp_bits(vf x) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(x), 23)); }
static inline vf vf_nan_acc(vf acc, vf x) { return _mm256_or_ps(acc, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }
static inline float vf_hmax(vf a)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float vf_hsum(vf a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vd vd_load(const double *p) { return _mm256_loadu_pd(p); }
static inline void vd_store(double *p, vd a) { _mm256_storeu_pd(p, a); }
static inline vd vd_set1(double a) { return _mm256_set1_pd(a); }
static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
static inline vd vd_fnma(vd a, vd b, vd c) { return _mm256_fnmadd_pd(a, b, c); }
static inline vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm256_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
static inline vd vd_max(vd a, vd b) { return _mm256_max_pd(a, b); }
static inline vd vd_max_acc(vd acc, vd x) { return _mm256_max_pd(x, acc); }
static inline vd vd_round(vd x) { return _mm256_round_pd(x, FA_RN); }
/* p * 2^n by the exponent bits of 2^n: normal for n in [-1022, 0] */
static inline vd vd_ldexp(vd p, vd n)
{
    __m128i n32 = _mm256_cvtpd_epi32(_mm256_max_pd(n, _mm256_set1_pd(-1022.0)));
    __m256i e = _mm256_cvtepi32_epi64(n32);
    e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}
static inline vd vd_zero_below(vd p, vd x, double lo)
{
    return _mm256_andnot_pd(_mm256_cmp_pd(x, _mm256_set1_pd(lo), _CMP_LT_OQ), p);
}
static inline vd vd_exp_bits(vd x) { return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_castpd_si256(x), 52)); }
static inline vd vd_nan_acc(vd acc, vd x) { return _mm256_or_pd(acc, _mm256_cmp_pd(x, x, _CMP_UNORD_Q)); }
static inline double vd_hmax(vd a)
{
    __m128d m = _mm_max_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    m = _mm_max_sd(m, _mm_unpackhi_pd(m, m));
    return _mm_cvtsd_f64(m);
}
static inline double vd_hsum(vd a)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
}
#include "simd/transpose_x86.h"
