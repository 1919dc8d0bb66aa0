/* half.h -- scalar conversions between float32 and the 16-bit storage
 * types (IEEE binary16 "float16" and bfloat16, the upper half of a
 * float32), in portable C on the bit patterns: exact widening, and
 * narrowing rounded to nearest, ties to even (overflow to +-inf, NaN stays
 * a quiet NaN of the same sign).  The vector paths widen with F16C /
 * AVX-512 (float16) or a 16-bit shift (bfloat16): simd/simd_<isa>.h. */
#ifndef FASTATTN_HALF_H
#define FASTATTN_HALF_H

#include <stdint.h>
#include <string.h>

static inline float fa_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t fa_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Are the n float32 at x all finite?  On the bit patterns (an all-ones
 * exponent is an infinity or a NaN), so that the loop vectorises. */
static inline int fa_all_finite_f32(const float *x, int64_t n)
{
    uint32_t bad = 0;
    for (int64_t c = 0; c < n; c++) bad |= (fa_f32_bits(x[c]) & 0x7f800000u) == 0x7f800000u;
    return !bad;
}

static inline float fa_bf16_to_f32(uint16_t h) { return fa_bits_f32((uint32_t)h << 16); }

static inline uint16_t fa_f32_to_bf16(float f)
{
    const uint32_t u = fa_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float fa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) /* zero or subnormal: m 2^-24, exact in float */
        return fa_bits_f32(sign | fa_f32_bits((float)m * 5.9604644775390625e-8f));
    if (e == 31) return fa_bits_f32(sign | 0x7f800000u | (m << 13));
    return fa_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t fa_f32_to_f16(float f)
{
    const uint32_t u = fa_f32_bits(f), sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: +-inf */
    if (a < 0x38800000u) {
        /* below 2^-14, a float16 subnormal (or zero): adding 0.5 leaves
         * round(|f| 2^24) in the low mantissa bits, rounded by the FPU */
        const float t = fa_bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (fa_f32_bits(t) - 0x3f000000u));
    }
    /* normal: rebias the exponent (-112 << 23), round the 13 dropped bits */
    a += 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

#endif
