/* simd.h -- the thin vector layer the micro-kernels are written in.
 *
 * Exactly one of FA_ISA_AVX512, FA_ISA_AVX2, FA_ISA_GENERIC is defined by the
 * kernels_<isa>.c file that includes this header; that file alone is compiled
 * with the matching -m flags.  For each element type (f = float, d = double)
 * it defines a vector type, its width, the register tile MR x NRV vectors of
 * the micro-kernels and a handful of operations, among them a vectorised exp.
 *
 * exp(x), for the softmax domain x <= 0 (x = score - row max) and NaN:
 * x = n ln2 + r with |r| <= ln2/2, exp(r) by a polynomial, then scaled by
 * 2^n.  Arguments below the smallest normal result give exactly 0 (so
 * exp(-inf) = 0); NaN gives NaN.
 *
 * exp2(x), for the streaming attention, whose scores come pre-multiplied by
 * log2(e) (FlashAttention-2's trick: no range reduction by ln 2), x <= 0 and
 * NaN: x clamped to >= -127 (-1023 for double; NaN kept), n = round(x),
 * r = x - n exactly, 2^r by a polynomial, scaled by 2^n built in the
 * exponent bits, which are all zero for n = -127: results below 2^-126.5
 * (2^-1022.5) are exactly 0, exp2(-inf) = 0.
 *
 * The polynomials: for double, Taylor series of degree 13 (truncation below
 * 5e-18 relative); for float, degree 5 with constant term 1, the minimax of
 * the relative error on the reduced interval ([-1/2, 1/2] for 2^r,
 * [-ln2/2, ln2/2] for e^r: 9.1e-8), fitted by iteratively reweighted least
 * squares and rounded to float (FA_EXP2F_P*, FA_EXPF_P*, as exact hex
 * literals).  One multiply-add fewer than the degree-6 Taylor series they
 * replaced, and more accurate.  Measured over 4M points (tests/
 * test_exp_accuracy.py checks every ISA): float exp2 on [-126, 0] and exp on
 * [-87, 0] within 2.1 ulp; double within 1 ulp.
 */
#ifndef FASTATTN_SIMD_H
#define FASTATTN_SIMD_H

#include <math.h>
#include <stdint.h>

/* For a hot helper that is also in the kernel table (its address taken):
 * inlined where called directly all the same. */
#if defined(__GNUC__) || defined(__clang__)
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FA_ALWAYS_INLINE __forceinline
#else
#define FA_ALWAYS_INLINE inline
#endif

#define FA_EXPF_LO (-87.3365478515625f) /* below: result 0 (flush, < FLT_MIN) */
#define FA_EXPD_LO (-708.3964185322641)
/* double: e^(r ln2) = sum_k (ln2)^k / k! r^k, the Taylor coefficients of exp2 */
#define FA_LN2 0.693147180559945309417232121458176568
#define FA_EXP2_D1 FA_LN2
#define FA_EXP2_D2 (FA_EXP2_D1 * FA_LN2 / 2)
#define FA_EXP2_D3 (FA_EXP2_D2 * FA_LN2 / 3)
#define FA_EXP2_D4 (FA_EXP2_D3 * FA_LN2 / 4)
#define FA_EXP2_D5 (FA_EXP2_D4 * FA_LN2 / 5)
#define FA_EXP2_D6 (FA_EXP2_D5 * FA_LN2 / 6)
#define FA_EXP2_D7 (FA_EXP2_D6 * FA_LN2 / 7)
#define FA_EXP2_D8 (FA_EXP2_D7 * FA_LN2 / 8)
#define FA_EXP2_D9 (FA_EXP2_D8 * FA_LN2 / 9)
#define FA_EXP2_D10 (FA_EXP2_D9 * FA_LN2 / 10)
#define FA_EXP2_D11 (FA_EXP2_D10 * FA_LN2 / 11)
#define FA_EXP2_D12 (FA_EXP2_D11 * FA_LN2 / 12)
#define FA_EXP2_D13 (FA_EXP2_D12 * FA_LN2 / 13)
/* float: degree-5 minimax polynomials (see above), P1..P5 (P0 = 1) */
#define FA_EXP2F_P1 0x1.62e42ap-1f
#define FA_EXP2F_P2 0x1.ebf9bcp-3f
#define FA_EXP2F_P3 0x1.c6b752p-5f
#define FA_EXP2F_P4 0x1.3cea88p-7f
#define FA_EXP2F_P5 0x1.5bba14p-10f
#define FA_EXPF_P1 0x1.fffff6p-1f
#define FA_EXPF_P2 0x1.fffdc6p-2f
#define FA_EXPF_P3 0x1.555a6ap-3f
#define FA_EXPF_P4 0x1.573a54p-5f
#define FA_EXPF_P5 0x1.0fa834p-7f
/* 1 + P1 r + ... + P5 r^5 by Horner's rule in the ISA's vf_fma/vf_set1: the
 * float exp and exp2 of every vector ISA (P: FA_EXPF_P or FA_EXP2F_P). */
#define FA_POLY5F(r, P)                                                                 \
    vf_fma(vf_fma(vf_fma(vf_fma(vf_fma(vf_set1(P##5), (r), vf_set1(P##4)), (r),         \
                                vf_set1(P##3)), (r), vf_set1(P##2)), (r), vf_set1(P##1)), \
           (r), vf_set1(1.0f))

#if defined(FA_ISA_AVX512)
#if defined(FA_AVX512_SIMDE)
/* Test builds only (setup.py, FASTATTN_AVX512_EMULATION=simde): the same
 * AVX-512 source, its _mm512 intrinsics implemented by SIMDe on AVX2, so the
 * AVX-512 kernels can be executed and checked on a CPU without AVX-512. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif
#define FA_ISA_NAME avx512
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
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline vf vf_set1(float a) { return _mm512_set1_ps(a); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
/* max ignoring a NaN in x: returns acc where x is NaN */
static inline vf vf_max_acc(vf acc, vf x) { return _mm512_max_ps(x, acc); }
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
/* lanes of acc become NaN where x is NaN (sticky NaN detector) */
static inline vf vf_nan_acc(vf acc, vf x) { return _mm512_mask_mov_ps(acc, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x); }
static inline float vf_hsum(vf a)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), vf_hi256(a));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vf_exp(vf x)
{
    const vf log2e = _mm512_set1_ps(1.44269504088896341f);
    const vf ln2hi = _mm512_set1_ps(0.693359375f), ln2lo = _mm512_set1_ps(-2.12194440e-4f);
    __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(FA_EXPF_LO), _CMP_LT_OQ);
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, ln2hi, x);
    r = _mm512_fnmadd_ps(n, ln2lo, r);
    vf p = FA_POLY5F(r, FA_EXPF_P);
    p = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(p, under, _mm512_setzero_ps());
}
static inline vd vd_load(const double *p) { return _mm512_loadu_pd(p); }
static inline void vd_store(double *p, vd a) { _mm512_storeu_pd(p, a); }
static inline vd vd_set1(double a) { return _mm512_set1_pd(a); }
static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
static inline vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm512_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
static inline vd vd_max_acc(vd acc, vd x) { return _mm512_max_pd(x, acc); }
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
static inline vd vd_exp_poly(vd r)
{
    vd p = _mm512_set1_pd(1.0 / 6227020800.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 479001600.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 39916800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 3628800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 362880.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 40320.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 5040.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    return _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
}
static inline vd vd_exp(vd x)
{
    __mmask8 under = _mm512_cmp_pd_mask(x, _mm512_set1_pd(FA_EXPD_LO), _CMP_LT_OQ);
    vd n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vd r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0.693147180369123816490), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    vd p = _mm512_scalef_pd(vd_exp_poly(r), n);
    return _mm512_mask_mov_pd(p, under, _mm512_setzero_pd());
}
static inline vf vf_exp2(vf x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x); /* NaN: max gives its 2nd operand */
    vf n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_sub_ps(x, n);
    vf p = FA_POLY5F(r, FA_EXP2F_P);
    /* 2^n: n + 127 lands in the low mantissa bits of n + (2^23 + 127) */
    __m512i e = _mm512_slli_epi32(_mm512_castps_si512(_mm512_add_ps(n, _mm512_set1_ps(8388735.0f))), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
static inline vd vd_exp2(vd x)
{
    x = _mm512_max_pd(_mm512_set1_pd(-1023.0), x);
    vd n = _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vd r = _mm512_sub_pd(x, n);
    vd p = _mm512_set1_pd(FA_EXP2_D13);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D12));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D11));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D10));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D9));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D8));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D7));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D6));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D4));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D3));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D2));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(FA_EXP2_D1));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    __m512i e = _mm512_slli_epi64(_mm512_castpd_si512(_mm512_add_pd(n, _mm512_set1_pd(4503599627371519.0))), 52);
    return _mm512_mul_pd(p, _mm512_castsi512_pd(e));
}

#elif defined(FA_ISA_AVX2)
#include <immintrin.h>
#define FA_ISA_NAME avx2
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
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
static inline vf vf_set1(float a) { return _mm256_set1_ps(a); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_max_acc(vf acc, vf x) { return _mm256_max_ps(x, acc); }
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
static inline vf vf_exp(vf x)
{
    vf under = _mm256_cmp_ps(x, _mm256_set1_ps(FA_EXPF_LO), _CMP_LT_OQ);
    vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    vf p = FA_POLY5F(r, FA_EXPF_P);
    /* 2^n by its exponent bits: normal for n in [-126, 0] */
    __m256i e = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, p);
}
static inline vd vd_load(const double *p) { return _mm256_loadu_pd(p); }
static inline void vd_store(double *p, vd a) { _mm256_storeu_pd(p, a); }
static inline vd vd_set1(double a) { return _mm256_set1_pd(a); }
static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
static inline vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm256_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
static inline vd vd_max_acc(vd acc, vd x) { return _mm256_max_pd(x, acc); }
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
static inline vd vd_exp(vd x)
{
    vd under = _mm256_cmp_pd(x, _mm256_set1_pd(FA_EXPD_LO), _CMP_LT_OQ);
    vd n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vd r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0.693147180369123816490), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
    vd p = _mm256_set1_pd(1.0 / 6227020800.0);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 479001600.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 39916800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 3628800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 362880.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 40320.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 5040.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 720.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 120.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    __m128i n32 = _mm256_cvtpd_epi32(_mm256_max_pd(n, _mm256_set1_pd(-1022.0)));
    __m256i e = _mm256_cvtepi32_epi64(n32);
    e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    p = _mm256_mul_pd(p, _mm256_castsi256_pd(e));
    return _mm256_andnot_pd(under, p);
}
static inline vf vf_exp2(vf x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x); /* NaN: max gives its 2nd operand */
    vf n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_sub_ps(x, n);
    vf p = FA_POLY5F(r, FA_EXP2F_P);
    /* 2^n: n + 127 lands in the low mantissa bits of n + (2^23 + 127) */
    __m256i e = _mm256_slli_epi32(_mm256_castps_si256(_mm256_add_ps(n, _mm256_set1_ps(8388735.0f))), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vd vd_exp2(vd x)
{
    x = _mm256_max_pd(_mm256_set1_pd(-1023.0), x);
    vd n = _mm256_round_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vd r = _mm256_sub_pd(x, n);
    vd p = _mm256_set1_pd(FA_EXP2_D13);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D12));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D11));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D10));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D9));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D8));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D7));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D6));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D4));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D3));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D2));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(FA_EXP2_D1));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    __m256i e = _mm256_slli_epi64(_mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(4503599627371519.0))), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}

#elif defined(FA_ISA_GENERIC)
/* Portable C: one-lane "vectors"; the compiler may auto-vectorise the loops. */
#define FA_ISA_NAME generic
typedef float vf;
typedef double vd;
#define VF_W 1
#define VD_W 1
#define VF_MR 4
#define VF_NRV 4
#define VD_MR 4
#define VD_NRV 4
#define VF_PV_MR 4
#define VD_PV_MR 4
static inline vf vf_load(const float *p) { return *p; }
static inline void vf_store(float *p, vf a) { *p = a; }
static inline vf vf_set1(float a) { return a; }
static inline vf vf_zero(void) { return 0.0f; }
static inline vf vf_fma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_max_acc(vf acc, vf x) { return x > acc ? x : acc; }
static inline vf vf_nan_acc(vf acc, vf x) { return x != x ? x : acc; }
static inline float vf_hmax(vf a) { return a; }
static inline float vf_hsum(vf a) { return a; }
static inline vf vf_exp(vf x) { return x < FA_EXPF_LO ? 0.0f : expf(x); }
static inline vd vd_load(const double *p) { return *p; }
static inline void vd_store(double *p, vd a) { *p = a; }
static inline vd vd_set1(double a) { return a; }
static inline vd vd_zero(void) { return 0.0; }
static inline vd vd_fma(vd a, vd b, vd c) { return a * b + c; }
static inline vd vd_add(vd a, vd b) { return a + b; }
static inline vd vd_sub(vd a, vd b) { return a - b; }
static inline vd vd_mul(vd a, vd b) { return a * b; }
static inline vd vd_max_acc(vd acc, vd x) { return x > acc ? x : acc; }
static inline vd vd_nan_acc(vd acc, vd x) { return x != x ? x : acc; }
static inline double vd_hmax(vd a) { return a; }
static inline double vd_hsum(vd a) { return a; }
static inline vd vd_exp(vd x) { return x < FA_EXPD_LO ? 0.0 : exp(x); }
static inline vf vf_exp2(vf x) { return x < -126.0f ? 0.0f : exp2f(x); }
static inline vd vd_exp2(vd x) { return x < -1022.0 ? 0.0 : exp2(x); }
#define VF_TB 4
#define VD_TB 4
static inline void vf_transpose_block(const float *src, int64_t srs, float *dst, int64_t drs)
{
    for (int r = 0; r < VF_TB; r++)
        for (int i = 0; i < VF_TB; i++) dst[i * drs + r] = src[r * srs + i];
}
static inline void vd_transpose_block(const double *src, int64_t srs, double *dst, int64_t drs)
{
    for (int r = 0; r < VD_TB; r++)
        for (int i = 0; i < VD_TB; i++) dst[i * drs + r] = src[r * srs + i];
}
#else
#error "define one of FA_ISA_AVX512, FA_ISA_AVX2, FA_ISA_GENERIC"
#endif

#if defined(FA_ISA_AVX512) || defined(FA_ISA_AVX2)
/* Transposes of one TB x TB block for packing K: dst[i][r] = src[r][i]
 * (row strides srs, drs in elements); 256-bit for both x86 paths (every
 * AVX-512 CPU has AVX2). */
#define VF_TB 8
#define VD_TB 4
static inline void vf_transpose_block(const float *src, int64_t srs, float *dst, int64_t drs)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + srs);
    __m256 r2 = _mm256_loadu_ps(src + 2 * srs), r3 = _mm256_loadu_ps(src + 3 * srs);
    __m256 r4 = _mm256_loadu_ps(src + 4 * srs), r5 = _mm256_loadu_ps(src + 5 * srs);
    __m256 r6 = _mm256_loadu_ps(src + 6 * srs), r7 = _mm256_loadu_ps(src + 7 * srs);
    /* pairs of rows interleaved, then quadruples, then the 128-bit halves */
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + drs, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * drs, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * drs, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * drs, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * drs, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * drs, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * drs, _mm256_permute2f128_ps(u3, u7, 0x31));
}
static inline void vd_transpose_block(const double *src, int64_t srs, double *dst, int64_t drs)
{
    __m256d r0 = _mm256_loadu_pd(src), r1 = _mm256_loadu_pd(src + srs);
    __m256d r2 = _mm256_loadu_pd(src + 2 * srs), r3 = _mm256_loadu_pd(src + 3 * srs);
    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    _mm256_storeu_pd(dst, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(dst + drs, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(dst + 2 * drs, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(dst + 3 * drs, _mm256_permute2f128_pd(t1, t3, 0x31));
}

#endif

#endif
