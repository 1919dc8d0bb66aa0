/* simd_avx512.h -- the AVX-512F mapping (see simd.h for the contract). */
#if defined(FA_AVX512_SIMDE)
/* Test builds only (setup.py, FASTATTN_AVX512_EMULATION=simde): the same
 * AVX-512 source, its _mm512 intrinsics implemented by SIMDe on AVX2, so the
 * AVX-512 kernels can be executed and checked on a CPU without AVX-512. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif
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
#define FA_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline vf vf_set1(float a) { return _mm512_set1_ps(a); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_max_acc(vf acc, vf x) { return _mm512_max_ps(x, acc); }
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, FA_RN); }
static inline vf vf_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }
static inline vf vf_zero_below(vf p, vf x, float lo)
{
    return _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_LT_OQ), _mm512_setzero_ps());
}
static inline vf vf_exp_bits(vf x) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(x), 23)); }
/* Horizontal max / sum: the two 256-bit halves combined, then within 256
 * bits (AVX-512F only: no AVX512DQ extract). */
static inline __m256 vf_hi256(vf a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
static inline float vf_hmax(vf a)
{
    __m256 h = _mm256_max_ps(_mm512_castps512_ps256(a), vf_hi256(a));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline vf vf_nan_acc(vf acc, vf x) { return _mm512_mask_mov_ps(acc, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x); }
static inline float vf_hsum(vf a)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), vf_hi256(a));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vd vd_load(const double *p) { return _mm512_loadu_pd(p); }
static inline void vd_store(double *p, vd a) { _mm512_storeu_pd(p, a); }
static inline vd vd_set1(double a) { return _mm512_set1_pd(a); }
static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
static inline vd vd_fnma(vd a, vd b, vd c) { return _mm512_fnmadd_pd(a, b, c); }
static inline vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm512_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
static inline vd vd_max(vd a, vd b) { return _mm512_max_pd(a, b); }
static inline vd vd_max_acc(vd acc, vd x) { return _mm512_max_pd(x, acc); }
static inline vd vd_round(vd x) { return _mm512_roundscale_pd(x, FA_RN); }
static inline vd vd_ldexp(vd p, vd n) { return _mm512_scalef_pd(p, n); }
static inline vd vd_zero_below(vd p, vd x, double lo)
{
    return _mm512_mask_mov_pd(p, _mm512_cmp_pd_mask(x, _mm512_set1_pd(lo), _CMP_LT_OQ), _mm512_setzero_pd());
}
static inline vd vd_exp_bits(vd x) { return _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_castpd_si512(x), 52)); }
static inline double vd_hmax(vd a)
{
    __m256d h = _mm256_max_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    __m128d m = _mm_max_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    m = _mm_max_sd(m, _mm_unpackhi_pd(m, m));
    return _mm_cvtsd_f64(m);
}
static inline vd vd_nan_acc(vd acc, vd x) { return _mm512_mask_mov_pd(acc, _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x); }
static inline double vd_hsum(vd a)
{
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
}
#include "simd/transpose_x86.h"
