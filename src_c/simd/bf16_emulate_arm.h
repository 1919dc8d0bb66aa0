/* bf16_emulate_arm.h -- the Armv8.6 bfloat16 dot products BFDOT and BFMMLA
 * (Advanced SIMD, FEAT_BF16) in plain C99, for the SIMDe build of the
 * neon_bf16 tier (FA_NEON_SIMDE: SIMDe's vbfdotq_f32 / vbfmmlaq_f32 round as
 * plain float32 arithmetic, the hardware does not) and the test hook
 * fa_bf16_op (testing/bf16_hooks.c, tests/kernels/test_neon_bf16.py).
 *
 * The Arm ARM's BFDotAdd with FPCR.EBF = 0 (the reset value; Linux leaves
 * it so, and qemu's -cpu max, which has FEAT_EBF16, runs this way unless a
 * program sets it): FPCR is ignored and
 *   result = addend + (a0 b0 + a1 b1)
 * where each product and each of the two sums is rounded to float32 by
 * round to odd (truncate, then set the last mantissa bit if anything was
 * cut off), a result above the float32 range is +-inf, inputs and results
 * below the normals (tininess before rounding) are flushed to signed zero,
 * and any NaN result is the default NaN 0x7fc00000.  A bfloat16 product
 * has at most 16 significant bits, so the products are exact unless they
 * leave the float32 range.
 *
 *   fa_emu_bfdotadd(sum, e1, e2)  BFDotAdd: e1, e2 hold a pair of bfloat16
 *                                 each (element 0 in the low half)
 *   fa_emu_bfdot(acc, a, b)       BFDOT Vd.4S, Vn.8H, Vm.8H: lane i of acc
 *                                 += the pair dot product of lane i
 *   fa_emu_bfmmla(acc, a, b)      BFMMLA Vd.4S, Vn.8H, Vm.8H: the 2 x 2
 *                                 matrix acc (row-major) += A B^T, A and B
 *                                 2 x 4 bfloat16 row-major; per element two
 *                                 BFDotAdd, elements 0-1 first, then 2-3
 *                                 (BFMatMulAdd's order). */
#ifndef FASTATTN_BF16_EMULATE_ARM_H
#define FASTATTN_BF16_EMULATE_ARM_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fa_arm_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fa_arm_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* subnormal inputs as signed zero */
static inline float fa_arm_fiz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

/* Does err (a nonzero rest) pull the exact value s + err towards zero? */
static inline int fa_arm_below(double s, double err) { return err != 0 && (err < 0) != (s < 0); }

/* x = s + err exactly (s = x rounded to double, err the rest: TwoSum) to
 * float32, round to odd, flush to zero, overflow to inf, default NaN */
static inline float fa_arm_round_odd(double s, double err)
{
    const double a = fabs(s);
    if (isnan(s)) return fa_arm_f32(0x7fc00000u);
    if (s == 0) return (float)s;
    if (a < 0x1p-126 || (a == 0x1p-126 && fa_arm_below(s, err))) return s < 0 ? -0.0f : 0.0f;
    if (a > 0x1p128 || (a == 0x1p128 && !fa_arm_below(s, err))) return s < 0 ? -INFINITY : INFINITY;
    float f = (float)s; /* nearest; then towards zero if it went past x */
    if (fabs((double)f) > a) f = nextafterf(f, 0.0f);
    if ((double)f == s && fa_arm_below(s, err)) f = nextafterf(f, 0.0f);
    if ((double)f != s || err != 0) f = fa_arm_f32(fa_arm_u32(f) | 1u);
    return f;
}

/* a + b to float32 by round to odd: s and its rest by TwoSum (exact in
 * double for any finite float32 operands) */
static inline float fa_arm_add_odd(float a, float b)
{
    const double x = a, y = b, s = x + y;
    if (!isfinite(s)) return fa_arm_round_odd(s, 0);
    const double bb = s - x, err = (x - (s - bb)) + (y - bb);
    return fa_arm_round_odd(s, err);
}

static inline float fa_arm_mul_odd(float a, float b) { return fa_arm_round_odd((double)a * b, 0); }

static inline float fa_emu_bfdotadd(float sum, uint32_t e1, uint32_t e2)
{
    const float a0 = fa_arm_fiz(fa_arm_f32(e1 << 16)), a1 = fa_arm_fiz(fa_arm_f32(e1 & 0xffff0000u));
    const float b0 = fa_arm_fiz(fa_arm_f32(e2 << 16)), b1 = fa_arm_fiz(fa_arm_f32(e2 & 0xffff0000u));
    const float p = fa_arm_add_odd(fa_arm_mul_odd(a0, b0), fa_arm_mul_odd(a1, b1));
    return fa_arm_add_odd(fa_arm_fiz(sum), p);
}

static inline uint32_t fa_arm_pair(const uint16_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 16; }

static inline void fa_emu_bfdot(float acc[4], const uint16_t a[8], const uint16_t b[8])
{
    for (int i = 0; i < 4; i++) acc[i] = fa_emu_bfdotadd(acc[i], fa_arm_pair(a + 2 * i), fa_arm_pair(b + 2 * i));
}

static inline void fa_emu_bfmmla(float acc[4], const uint16_t a[8], const uint16_t b[8])
{
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++)
                acc[2 * i + j] = fa_emu_bfdotadd(acc[2 * i + j], fa_arm_pair(a + 4 * i + 2 * k),
                                                 fa_arm_pair(b + 4 * j + 2 * k));
}

#endif
