/* vmath.h -- the vector exp and exp2 of the kernels: their constants and
 * Horner macros, here once; the algorithms, once, in vmath_tmpl.h, over the
 * primitives each mapping header supplies (round, fnma, ldexp, zero_below,
 * exp_bits, max, fma, set1: see simd.h), so that every ISA runs the same
 * sequence in its own instructions.
 *
 * exp(x), for the softmax domain x <= 0 (x = score - row max) and NaN:
 * x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, hi and lo), exp(r) by a
 * polynomial, then scaled by 2^n (ldexp).  Arguments below the smallest
 * normal result (EXP_LO) give exactly 0 (so exp(-inf) = 0); NaN gives NaN.
 *
 * exp2(x), for the streaming attention, whose scores come pre-multiplied by
 * log2(e) (FlashAttention-2's trick: no range reduction by ln 2), x <= 0 and
 * NaN: x clamped to >= EXP2_MIN (-127; -1023 for double; NaN kept),
 * n = round(x), r = x - n exactly, 2^r by a polynomial, scaled by 2^n built in
 * the exponent bits (n + EXP2_MAGIC puts n + bias in the low mantissa bits;
 * exp_bits shifts them into the exponent field), which are all zero for
 * n = EXP2_MIN: results below 2^-126.5 (2^-1022.5) are exactly 0,
 * exp2(-inf) = 0.  A mapping whose ldexp is exact for any n
 * (FA_SIMD_SCALEF: AVX-512's scalef) computes the same bits with no clamp
 * and no exponent bits: n = round(x), p 2^n by ldexp, 0 where x < EXP2_LO
 * (-126.5; -1022.5), by a mask (ldexp_from): two operations fewer.
 *
 * The polynomials: for double, Taylor series of degree 13 (truncation below
 * 5e-18 relative); for float, degree 5 with constant term 1, the minimax of
 * the relative error on the reduced interval ([-1/2, 1/2] for 2^r,
 * [-ln2/2, ln2/2] for e^r: 9.1e-8), fitted by iteratively reweighted least
 * squares and rounded to float (exact hex literals).  One multiply-add fewer
 * than a degree-6 Taylor series, and more accurate.
 * Measured over 4M points (tests/test_exp_accuracy.py checks every ISA):
 * float exp2 on [-126, 0] and exp on [-87, 0] within 2.1 ulp; double within
 * 1 ulp.  The generic mapping calls the C library instead.
 *
 * tanh(x), for the soft cap of the scores, any x: |x| < TANH_SMALL (0.625)
 * by x + x z R(z), z = x^2 (Cephes' tanhf and tanh: for float R a
 * polynomial of degree 4, for double a rational function P2(z) / Q3(z), Q
 * monic); otherwise (1 - t) / (1 + t) with t = exp(-2|x|), in exp's domain,
 * no cancellation there (t <= e^-1.25), the sign copied from x.  tanh(+-inf)
 * = +-1, NaN gives NaN.  Measured (tests/kernels/test_tanh_accuracy.py checks
 * every ISA): within 1.9 ulp for float, 1.5 for double.
 */
#ifndef FASTATTN_VMATH_H
#define FASTATTN_VMATH_H

#include "runtime/util.h"

/* float: VF_EXP_P<k>, VF_EXP2_P<k>, the coefficients of r^k */
#define VF_DEG 5
#define VF_EXP_LO (-87.3365478515625f) /* below: result 0 (flush, < FLT_MIN) */
#define VF_LOG2E 1.44269504088896341f
#define VF_LN2_HI 0.693359375f
#define VF_LN2_LO (-2.12194440e-4f)
#define VF_EXP_P0 1.0f
#define VF_EXP_P1 0x1.fffff6p-1f
#define VF_EXP_P2 0x1.fffdc6p-2f
#define VF_EXP_P3 0x1.555a6ap-3f
#define VF_EXP_P4 0x1.573a54p-5f
#define VF_EXP_P5 0x1.0fa834p-7f
#define VF_EXP2_MIN (-127.0f)
#define VF_EXP2_MAGIC 8388735.0f /* 2^23 + 127 */
#define VF_EXP2_LO (-126.5f) /* below: 0, as the clamp at EXP2_MIN gives */
#define VF_EXP2_P0 1.0f
#define VF_EXP2_P1 0x1.62e42ap-1f
#define VF_EXP2_P2 0x1.ebf9bcp-3f
#define VF_EXP2_P3 0x1.c6b752p-5f
#define VF_EXP2_P4 0x1.3cea88p-7f
#define VF_EXP2_P5 0x1.5bba14p-10f

/* double: e^r by its Taylor series; 2^r = e^(r ln2): sum_k (ln2)^k / k! r^k */
#define VD_DEG 13
#define VD_EXP_LO (-708.3964185322641)
#define VD_LOG2E 1.4426950408889634
#define VD_LN2_HI 0.693147180369123816490
#define VD_LN2_LO 1.90821492927058770002e-10
#define VD_EXP_P0 1.0
#define VD_EXP_P1 1.0
#define VD_EXP_P2 0.5
#define VD_EXP_P3 (1.0 / 6.0)
#define VD_EXP_P4 (1.0 / 24.0)
#define VD_EXP_P5 (1.0 / 120.0)
#define VD_EXP_P6 (1.0 / 720.0)
#define VD_EXP_P7 (1.0 / 5040.0)
#define VD_EXP_P8 (1.0 / 40320.0)
#define VD_EXP_P9 (1.0 / 362880.0)
#define VD_EXP_P10 (1.0 / 3628800.0)
#define VD_EXP_P11 (1.0 / 39916800.0)
#define VD_EXP_P12 (1.0 / 479001600.0)
#define VD_EXP_P13 (1.0 / 6227020800.0)
#define VD_EXP2_MIN (-1023.0)
#define VD_EXP2_MAGIC 4503599627371519.0 /* 2^52 + 1023 */
#define VD_EXP2_LO (-1022.5)
#define VD_EXP2_P0 1.0
#define VD_EXP2_P1 FA_LN2
#define VD_EXP2_P2 (VD_EXP2_P1 * FA_LN2 / 2)
#define VD_EXP2_P3 (VD_EXP2_P2 * FA_LN2 / 3)
#define VD_EXP2_P4 (VD_EXP2_P3 * FA_LN2 / 4)
#define VD_EXP2_P5 (VD_EXP2_P4 * FA_LN2 / 5)
#define VD_EXP2_P6 (VD_EXP2_P5 * FA_LN2 / 6)
#define VD_EXP2_P7 (VD_EXP2_P6 * FA_LN2 / 7)
#define VD_EXP2_P8 (VD_EXP2_P7 * FA_LN2 / 8)
#define VD_EXP2_P9 (VD_EXP2_P8 * FA_LN2 / 9)
#define VD_EXP2_P10 (VD_EXP2_P9 * FA_LN2 / 10)
#define VD_EXP2_P11 (VD_EXP2_P10 * FA_LN2 / 11)
#define VD_EXP2_P12 (VD_EXP2_P11 * FA_LN2 / 12)
#define VD_EXP2_P13 (VD_EXP2_P12 * FA_LN2 / 13)

/* tanh: VF_TANH_P<k> of r = sum_k P<k> z^k; double: P<k> / Q<k> (Q3 = 1) */
#define VF_TANH_SMALL 0.625f
#define VF_TANH_P0 (-3.33332819422e-1f)
#define VF_TANH_P1 1.33314422036e-1f
#define VF_TANH_P2 (-5.37397155531e-2f)
#define VF_TANH_P3 2.06390887954e-2f
#define VF_TANH_P4 (-5.70498872745e-3f)
#define VD_TANH_SMALL 0.625
#define VD_TANH_P0 (-1.61468768441708447952e3)
#define VD_TANH_P1 (-9.92877231001918586564e1)
#define VD_TANH_P2 (-9.64399179425052238628e-1)
#define VD_TANH_Q0 4.84406305325125486048e3
#define VD_TANH_Q1 2.23548839060100448583e3
#define VD_TANH_Q2 1.12811678491632931402e2
#define VD_TANH_Q3 1.0
/* r = R(z) of tanh's small branch, in the mapping's operations (V: vf, vd):
 * VF_TANH_R, VD_TANH_R */
#define VF_TANH_R(V, r, z) FA_HORNER_4(V, r, z, VF_TANH_P)
#define VD_TANH_R(V, r, z)                                                              \
    do {                                                                                \
        V fa_num_, fa_den_;                                                             \
        FA_HORNER_2(V, fa_num_, z, VD_TANH_P);                                          \
        FA_HORNER_3(V, fa_den_, z, VD_TANH_Q);                                          \
        r = FA_CAT(V, div)(fa_num_, fa_den_);                                           \
    } while (0)

/* p = sum_k P<k> r^k by Horner's rule, in the mapping's V_fma and V_set1
 * (V: vf or vd; P: a coefficient prefix such as VF_EXP_P), one macro per
 * degree: p = P5; p = p * r + P4; ... p = p * r + P0. */
#define FA_HSTEP(V, p, r, P, k) p = FA_CAT(V, fma)(p, r, FA_CAT(V, set1)(FA_PASTE(P, k)))
#define FA_HORNER_2(V, p, r, P)                                                         \
    p = FA_CAT(V, set1)(FA_PASTE(P, 2));                                                \
    FA_HSTEP(V, p, r, P, 1); FA_HSTEP(V, p, r, P, 0)
#define FA_HORNER_3(V, p, r, P)                                                         \
    p = FA_CAT(V, set1)(FA_PASTE(P, 3));                                                \
    FA_HSTEP(V, p, r, P, 2); FA_HSTEP(V, p, r, P, 1); FA_HSTEP(V, p, r, P, 0)
#define FA_HORNER_4(V, p, r, P)                                                         \
    p = FA_CAT(V, set1)(FA_PASTE(P, 4));                                                \
    FA_HSTEP(V, p, r, P, 3); FA_HSTEP(V, p, r, P, 2); FA_HSTEP(V, p, r, P, 1);          \
    FA_HSTEP(V, p, r, P, 0)
#define FA_HORNER_5(V, p, r, P)                                                         \
    p = FA_CAT(V, set1)(FA_PASTE(P, 5));                                                \
    FA_HSTEP(V, p, r, P, 4); FA_HSTEP(V, p, r, P, 3); FA_HSTEP(V, p, r, P, 2);          \
    FA_HSTEP(V, p, r, P, 1); FA_HSTEP(V, p, r, P, 0)
#define FA_HORNER_13(V, p, r, P)                                                        \
    p = FA_CAT(V, set1)(FA_PASTE(P, 13));                                               \
    FA_HSTEP(V, p, r, P, 12); FA_HSTEP(V, p, r, P, 11); FA_HSTEP(V, p, r, P, 10);       \
    FA_HSTEP(V, p, r, P, 9); FA_HSTEP(V, p, r, P, 8); FA_HSTEP(V, p, r, P, 7);          \
    FA_HSTEP(V, p, r, P, 6); FA_HSTEP(V, p, r, P, 5); FA_HSTEP(V, p, r, P, 4);          \
    FA_HSTEP(V, p, r, P, 3); FA_HSTEP(V, p, r, P, 2); FA_HSTEP(V, p, r, P, 1);          \
    FA_HSTEP(V, p, r, P, 0)

#endif
