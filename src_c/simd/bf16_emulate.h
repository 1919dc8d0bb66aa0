/* bf16_emulate.h -- the AMX tile instructions and the AVX512-BF16 ones, in
 * plain C99 with their documented semantics (Intel SDM vol. 2 and the
 * intrinsics guide), for the emulation build (setup.py:
 * FASTATTN_AVX512_EMULATION=simde defines FA_BF16_EMULATED) and the tests
 * that pin it (tests/kernels/test_amx_emulation.py, through the test hook
 * fa_bf16_op of testing/bf16_hooks.c).  Every function is static, on
 * plain arrays; one fa_emu_tiles holds a thread's tile registers.
 *
 *   fa_emu_tile_loadconfig  (LDTILECFG)   the 64-byte configuration: palette,
 *                           start row, colsb[16] at byte 16, rows[16] at 48
 *   fa_emu_tile_loadd       (TILELOADD)   rows x colsb bytes from base + r*stride
 *   fa_emu_tile_stored      (TILESTORED)  the reverse
 *   fa_emu_tile_zero        (TILEZERO), fa_emu_tile_release (TILERELEASE)
 *   fa_emu_tile_dpbf16ps    (TDPBF16PS)   per row m of C and pair column n:
 *       two float32 partial sums (even and odd elements of the pairs), each
 *       accumulated over k by fused multiply-adds of exact bf16 products,
 *       then C[m][n] += even + odd; DAZ on the inputs, FTZ on every result,
 *       round to nearest even, MXCSR ignored;
 *   fa_emu_tile_dpfp16ps    (TDPFP16PS)   the same on float16 pairs;
 *   fa_emu_dpbf16_ps        (VDPBF16PS)   per lane i: acc += a.odd * b.odd,
 *       then acc += a.even * b.even (two roundings), DAZ, FTZ, RNE;
 *   fa_emu_cvtneps_pbh      (VCVTNEPS2BF16)  float32 -> bfloat16, round to
 *       nearest even; denormal inputs become signed zeros; NaN kept, quieted;
 *   fa_emu_cvtne2ps_pbh     (VCVTNE2PS2BF16) 32 results: b's 16 (low) then a's.
 */
#ifndef FASTATTN_BF16_EMULATE_H
#define FASTATTN_BF16_EMULATE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct fa_emu_tiles {
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][16][64]; /* 8 tiles of at most 16 rows x 64 bytes */
} fa_emu_tiles;

static inline float fa_emu_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fa_emu_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* denormals as zero (keeps the sign) */
static inline float fa_emu_daz(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}
#define fa_emu_ftz fa_emu_daz
static inline float fa_emu_bf16_f32(uint16_t h)
{
    return fa_emu_daz(fa_emu_f32((uint32_t)h << 16));
}
/* float16 -> float32, exactly (denormals kept: m 2^-24, exact in float32;
 * a normal 2^(e-15) (1 + m/1024) is its bits rebiased) */
static inline float fa_emu_f16_f32(uint16_t h)
{
    const uint32_t e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? (float)m * 0x1p-24f
                  : e == 31 ? (m ? NAN : INFINITY) : fa_emu_f32(((e + 112) << 23) | (m << 13));
    return (h & 0x8000) ? -v : v;
}
static inline float fa_emu_widen(uint16_t h, int fp16)
{
    return fp16 ? fa_emu_f16_f32(h) : fa_emu_bf16_f32(h);
}

static inline void fa_emu_tile_loadconfig(fa_emu_tiles *st, const void *cfg)
{
    const uint8_t *c = (const uint8_t *)cfg;
    memset(st, 0, sizeof(*st));
    for (int t = 0; t < 8; t++) {
        st->colsb[t] = (uint16_t)(c[16 + 2 * t] | (c[17 + 2 * t] << 8));
        st->rows[t] = c[48 + t];
    }
}
static inline void fa_emu_tile_release(fa_emu_tiles *st) { memset(st, 0, sizeof(*st)); }
static inline void fa_emu_tile_zero(fa_emu_tiles *st, int t)
{
    memset(st->data[t], 0, sizeof st->data[t]);
}
static inline void fa_emu_tile_loadd(fa_emu_tiles *st, int t, const void *base, int64_t stride)
{
    fa_emu_tile_zero(st, t); /* bytes beyond rows x colsb read as zero */
    for (int r = 0; r < st->rows[t]; r++)
        memcpy(st->data[t][r], (const uint8_t *)base + r * stride, st->colsb[t]);
}
static inline void fa_emu_tile_stored(const fa_emu_tiles *st, int t, void *base, int64_t stride)
{
    for (int r = 0; r < st->rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, st->data[t][r], st->colsb[t]);
}
static inline uint16_t fa_emu_half(const fa_emu_tiles *st, int t, int r, int i)
{
    uint16_t h;
    memcpy(&h, &st->data[t][r][2 * i], 2);
    return h;
}
/* C += A B on pairs; fp16: 0 bfloat16, 1 float16.  B and each row of A are
 * widened once, not once per multiply (the test suites' float16 tile calls
 * spent most of their time in the conversions). */
static inline void fa_emu_tile_dp(fa_emu_tiles *st, int c, int a, int b, int fp16)
{
    const int kn = st->colsb[a] / 4, nn = st->colsb[c] / 4;
    float bw[16][32];
    for (int k = 0; k < kn; k++)
        for (int i = 0; i < 2 * nn; i++) bw[k][i] = fa_emu_widen(fa_emu_half(st, b, k, i), fp16);
    for (int m = 0; m < st->rows[c]; m++) {
        float aw[32], t[32] = {0};
        for (int i = 0; i < 2 * kn; i++) aw[i] = fa_emu_widen(fa_emu_half(st, a, m, i), fp16);
        for (int k = 0; k < kn; k++)
            for (int n = 0; n < nn; n++)
                for (int e = 0; e < 2; e++)
                    t[2 * n + e] = fa_emu_ftz(fmaf(aw[2 * k + e], bw[k][2 * n + e], t[2 * n + e]));
        for (int n = 0; n < nn; n++) {
            float cv;
            memcpy(&cv, &st->data[c][m][4 * n], 4);
            cv = fa_emu_ftz(fa_emu_daz(cv) + fa_emu_ftz(t[2 * n] + t[2 * n + 1]));
            memcpy(&st->data[c][m][4 * n], &cv, 4);
        }
    }
}
static inline void fa_emu_tile_dpbf16ps(fa_emu_tiles *st, int c, int a, int b)
{
    fa_emu_tile_dp(st, c, a, b, 0);
}
static inline void fa_emu_tile_dpfp16ps(fa_emu_tiles *st, int c, int a, int b)
{
    fa_emu_tile_dp(st, c, a, b, 1);
}

/* VDPBF16PS on 16 lanes: acc[i] += a.bf16[2i+1] b.bf16[2i+1], then the even pair */
static inline void fa_emu_dpbf16_ps(float acc[16], const uint16_t a[32], const uint16_t b[32])
{
    for (int i = 0; i < 16; i++) {
        float s = fa_emu_daz(acc[i]);
        s = fa_emu_ftz(fmaf(fa_emu_bf16_f32(a[2 * i + 1]), fa_emu_bf16_f32(b[2 * i + 1]), s));
        acc[i] = fa_emu_ftz(fmaf(fa_emu_bf16_f32(a[2 * i]), fa_emu_bf16_f32(b[2 * i]), s));
    }
}
static inline uint16_t fa_emu_cvt_bf16(float x)
{
    const uint32_t u = fa_emu_u32(x);
    if (fpclassify(x) == FP_SUBNORMAL || x == 0) return (uint16_t)((u >> 16) & 0x8000);
    if (isinf(x)) return (uint16_t)(u >> 16);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16); /* nearest, ties to even */
}
static inline void fa_emu_cvtneps_pbh(uint16_t out[16], const float a[16])
{
    for (int i = 0; i < 16; i++) out[i] = fa_emu_cvt_bf16(a[i]);
}
static inline void fa_emu_cvtne2ps_pbh(uint16_t out[32], const float a[16], const float b[16])
{
    fa_emu_cvtneps_pbh(out, b);
    fa_emu_cvtneps_pbh(out + 16, a);
}

#endif
