/* flash16_neon.h -- the vocabulary of the 16-bit matrix kernels
 * (kernels/flash16_*.h) on Armv8.6 Advanced SIMD with FEAT_BF16, for the
 * neon_bf16 mapping: what simd/bf16_tiles.h and simd/flash16_ops.h give
 * those kernels on x86 (the same names and contracts; see there), so that
 * flash16's kernels are written once.  Included by kernels_isa.c after
 * simd.h where the mapping defines FA_SIMD_NEON_BF16.
 *
 * The kernels' 16-lane vectors are four NEON registers each: m16_vf four
 * float32x4_t (lanes 4j .. 4j+3 in v[j]), m16_vi four uint32x4_t (dwords
 * likewise, each a pair of halves).  No tile registers: FT_CONFIG and
 * FT_RELEASE do nothing and the steps accumulate 2 x 2 tiles of C on
 * registers by BFMMLA (below: per element two pair steps, the first pair
 * first, each rounded to odd with flush to zero, simd/bf16_emulate_arm.h;
 * so each C element is one chain over its pairs in order, as on x86);
 * under FA_NEON_SIMDE that instruction is bf16_emulate_arm.h's C, since
 * SIMDe's rounds as plain float32 arithmetic.  Rounding to bfloat16 (the
 * weights P, the output) is the integer round-to-nearest-even of
 * simd_neon.h's vf_store_bf16 (subnormals rounded, not flushed as
 * VCVTNE2PS2BF16 does; P has none: m16_exp2w is 0 below 2^-125).  The
 * weights' 2^x is x86's polynomial and scaling: for the same S^T, the same
 * weights as avx512_bf16.  No float16 path (m16_cvt2 ignores f16; the
 * table's fp16 is 0). */
#ifndef FASTATTN_FLASH16_NEON_H
#define FASTATTN_FLASH16_NEON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd/bf16_emulate_arm.h"

#define FT_ROWS 16 /* rows of a key tile (kernels/flash16_steps.h) */
#define M16_W 16   /* float32 lanes of m16_vf, dwords of m16_vi */
typedef struct { int unused; } fa_tilefile;
#define FT_CONFIG(tf) ((void)(tf))
#define FT_RELEASE(tf) ((void)(tf))

typedef struct { float32x4_t v[4]; } m16_vf;
typedef struct { uint32x4_t v[4]; } m16_vi;

/* The dot-product steps' registers (kernels/flash16_steps.h): m4_vi, 8
 * bfloat16 as a 2 x 4 matrix (row-major: 2 rows of 4), m4_vf its 2 x 2
 * float32 product, as BFMMLA takes them:
 *   m4_load(p)                 8 halves at p
 *   m4f_zero()                 0
 *   fa_bfmmla(acc, a, b)       acc + a b^T (BFMMLA: per element two BFDOT
 *                              pair steps, elements 0-1 first)
 *   m4_load_c(r0, r1, hi)      (r0[0], r0[1], r1[0], r1[1]), or (hi) the
 *                              same of columns 2, 3: 4 columns of two C
 *                              rows as two 2 x 2 tiles
 *   m4_store_c(r0, r1, c0, c1) the reverse
 * and the operands rearranged in place into BFMMLA's layout, after packing
 * (x86: no-ops):
 *   m16_dot_pairs(p, stride, nrows, nh)  rows r, r+1 (r even, nrows even, row
 *          r at p + r stride, nh halves, a multiple of 8): group g = columns
 *          4g .. 4g+3 of both rows as one m4_vi, at row r + (g & 1), column
 *          8 (g >> 1) (K rows, V^T rows: the A operands)
 *   m16_dot_rows(p, nrows)               rows of M16_W dwords (a pair of
 *          halves per query): rows 2i, 2i+1 of queries n, n+1 (n even) as
 *          one m4_vi, at row 2i + (n / 2 & 1), dword 4 (n / 4) (Q^T, P^T:
 *          the B operands) */
typedef float32x4_t m4_vf;
typedef uint32x4_t m4_vi;
static inline m4_vi m4_load(const uint16_t *p) { return vreinterpretq_u32_u16(vld1q_u16(p)); }
static inline m4_vf m4f_zero(void) { return vdupq_n_f32(0.0f); }
#if defined(FA_NEON_SIMDE)
static inline m4_vf fa_bfmmla(m4_vf acc, m4_vi a, m4_vi b)
{
    float f[4];
    uint16_t x[8], y[8];
    vst1q_f32(f, acc);
    vst1q_u16(x, vreinterpretq_u16_u32(a));
    vst1q_u16(y, vreinterpretq_u16_u32(b));
    fa_emu_bfmmla(f, x, y);
    return vld1q_f32(f);
}
#else
static inline m4_vf fa_bfmmla(m4_vf acc, m4_vi a, m4_vi b)
{
    return vbfmmlaq_f32(acc, vreinterpretq_bf16_u32(a), vreinterpretq_bf16_u32(b));
}
#endif
static inline m4_vf m4_load_c(const float *r0, const float *r1, int hi)
{
    const float64x2_t x = vreinterpretq_f64_f32(vld1q_f32(r0)), y = vreinterpretq_f64_f32(vld1q_f32(r1));
    return vreinterpretq_f32_f64(hi ? vzip2q_f64(x, y) : vzip1q_f64(x, y));
}
static inline void m4_store_c(float *r0, float *r1, m4_vf c0, m4_vf c1)
{
    const float64x2_t x = vreinterpretq_f64_f32(c0), y = vreinterpretq_f64_f32(c1);
    vst1q_f32(r0, vreinterpretq_f32_f64(vzip1q_f64(x, y)));
    vst1q_f32(r1, vreinterpretq_f32_f64(vzip2q_f64(x, y)));
}
static inline void m16_dot_pairs(uint16_t *p, int64_t stride, int64_t nrows, int64_t nh)
{
    for (int64_t r = 0; r + 1 < nrows; r += 2)
        for (int64_t c = 0; c < nh; c += 8) {
            uint16_t *x = p + r * stride + c, *y = x + stride;
            const uint64x2_t a = vreinterpretq_u64_u16(vld1q_u16(x)), b = vreinterpretq_u64_u16(vld1q_u16(y));
            vst1q_u16(x, vreinterpretq_u16_u64(vzip1q_u64(a, b)));
            vst1q_u16(y, vreinterpretq_u16_u64(vzip2q_u64(a, b)));
        }
}
static inline void m16_dot_rows(uint32_t *p, int64_t nrows)
{
    for (int64_t r = 0; r + 1 < nrows; r += 2)
        for (int c = 0; c < M16_W; c += 4) {
            uint32_t *x = p + r * M16_W + c, *y = x + M16_W;
            const uint32x4_t a = vld1q_u32(x), b = vld1q_u32(y);
            vst1q_u32(x, vzip1q_u32(a, b));
            vst1q_u32(y, vzip2q_u32(a, b));
        }
}

/* the float vectors (simd_neon.h's vf_* per register) */
static inline m16_vf m16f_load(const float *p)
{
    m16_vf r;
    for (int j = 0; j < 4; j++) r.v[j] = vld1q_f32(p + 4 * j);
    return r;
}
static inline void m16f_store(float *p, m16_vf x)
{
    for (int j = 0; j < 4; j++) vst1q_f32(p + 4 * j, x.v[j]);
}
static inline m16_vf m16f_set1(float x)
{
    m16_vf r;
    for (int j = 0; j < 4; j++) r.v[j] = vdupq_n_f32(x);
    return r;
}
static inline m16_vf m16f_zero(void) { return m16f_set1(0.0f); }
/* M16F_BINARY(name, op): m16_vf m16f_<name>(a, b), op per register */
#define M16F_BINARY(name, op)                                                                  \
    static inline m16_vf FA_PASTE(m16f_, name)(m16_vf a, m16_vf b)                             \
    {                                                                                          \
        for (int j = 0; j < 4; j++) a.v[j] = op(a.v[j], b.v[j]);                               \
        return a;                                                                              \
    }
M16F_BINARY(add, vaddq_f32)   /* m16f_add */
M16F_BINARY(mul, vmulq_f32)   /* m16f_mul */
M16F_BINARY(max, vf_max)      /* m16f_max: b where either is NaN */
M16F_BINARY(max_acc, vf_max_acc) /* m16f_max_acc: acc kept where x is NaN */
#undef M16F_BINARY

static inline m16_vi m16_load(const void *p)
{
    m16_vi r;
    for (int j = 0; j < 4; j++) r.v[j] = vld1q_u32((const uint32_t *)p + 4 * j);
    return r;
}
static inline void m16_store(void *p, m16_vi x)
{
    for (int j = 0; j < 4; j++) vst1q_u32((uint32_t *)p + 4 * j, x.v[j]);
}
static inline m16_vi m16_zero(void)
{
    m16_vi r;
    for (int j = 0; j < 4; j++) r.v[j] = vdupq_n_u32(0);
    return r;
}
static inline m16_vi m16_or(m16_vi a, m16_vi b)
{
    for (int j = 0; j < 4; j++) a.v[j] = vorrq_u32(a.v[j], b.v[j]);
    return a;
}
static inline m16_vi m16_as_vi(m16_vf x)
{
    m16_vi r;
    for (int j = 0; j < 4; j++) r.v[j] = vreinterpretq_u32_f32(x.v[j]);
    return r;
}
static inline m16_vf m16_as_vf(m16_vi x)
{
    m16_vf r;
    for (int j = 0; j < 4; j++) r.v[j] = vreinterpretq_f32_u32(x.v[j]);
    return r;
}
/* by memcpy: p points into uint16_t rows (C99's aliasing rules) */
static inline m16_vi m16_bcast_pair(const uint16_t *p)
{
    uint32_t d;
    memcpy(&d, p, 4);
    const uint32x4_t b = vdupq_n_u32(d);
    const m16_vi r = {{b, b, b, b}};
    return r;
}

/* 4 x 4 dwords: out[c] = column c of r0 .. r3 (pairs of 32-bit lanes, then
 * of 64-bit ones) */
static inline void m16_transpose4(uint32x4_t r[4])
{
    const uint64x2_t t0 = vreinterpretq_u64_u32(vtrn1q_u32(r[0], r[1]));
    const uint64x2_t t1 = vreinterpretq_u64_u32(vtrn2q_u32(r[0], r[1]));
    const uint64x2_t t2 = vreinterpretq_u64_u32(vtrn1q_u32(r[2], r[3]));
    const uint64x2_t t3 = vreinterpretq_u64_u32(vtrn2q_u32(r[2], r[3]));
    r[0] = vreinterpretq_u32_u64(vtrn1q_u64(t0, t2));
    r[1] = vreinterpretq_u32_u64(vtrn1q_u64(t1, t3));
    r[2] = vreinterpretq_u32_u64(vtrn2q_u64(t0, t2));
    r[3] = vreinterpretq_u32_u64(vtrn2q_u64(t1, t3));
}
/* 16 x 16 dwords: block (row group g, register j) transposed into block (j, g) */
static inline void m16_transpose(m16_vi r[16])
{
    m16_vi t[16];
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < 4; j++) {
            uint32x4_t b[4] = {r[4 * g].v[j], r[4 * g + 1].v[j], r[4 * g + 2].v[j], r[4 * g + 3].v[j]};
            m16_transpose4(b);
            for (int c = 0; c < 4; c++) t[4 * j + c].v[g] = b[c];
        }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* n <= M16_W halves at p as the low (hi 0) or high halves of dwords, zero beyond */
static inline m16_vi m16_widen(const uint16_t *p, int64_t n, int hi)
{
    uint16_t tmp[M16_W] = {0};
    if (n < M16_W) {
        memcpy(tmp, p, (size_t)(n > 0 ? n : 0) * 2);
        p = tmp;
    }
    m16_vi r;
    for (int j = 0; j < 4; j++) {
        const uint16x4_t h = vld1_u16(p + 4 * j);
        r.v[j] = hi ? vshll_n_u16(h, 16) : vmovl_u16(h);
    }
    return r;
}

/* bit 0: some low half of *r had all the exponent bits eb (NaN or Inf),
 * bit 1: some high half; those halves are zeroed */
static inline unsigned m16_clear_nonfinite(m16_vi *r, uint32_t eb)
{
    const uint32x4_t elo = vdupq_n_u32(eb), ehi = vdupq_n_u32(eb << 16);
    uint32x4_t anylo = vdupq_n_u32(0), anyhi = anylo;
    for (int j = 0; j < 4; j++) {
        const uint32x4_t lo = vceqq_u32(vandq_u32(r->v[j], elo), elo);
        const uint32x4_t hi = vceqq_u32(vandq_u32(r->v[j], ehi), ehi);
        r->v[j] = vbicq_u32(r->v[j], vorrq_u32(vandq_u32(lo, vdupq_n_u32(0xffff)),
                                               vandq_u32(hi, vdupq_n_u32(0xffff0000u))));
        anylo = vorrq_u32(anylo, lo);
        anyhi = vorrq_u32(anyhi, hi);
    }
    return (vmaxvq_u32(anylo) ? 1u : 0u) | (vmaxvq_u32(anyhi) ? 2u : 0u);
}

/* float32 rounded to bfloat16, nearest even, in the high half of each
 * dword (NaN stays a quiet NaN): vf_store_bf16's rounding */
static inline uint32x4_t m16_round_bf16(float32x4_t x)
{
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb));
    return vbslq_u32(vceqq_f32(x, x), r, vorrq_u32(u, vdupq_n_u32(0x400000)));
}
/* 32 bfloat16: lo's 16 first, then hi's (f16: no float16 path here) */
static inline m16_vi m16_cvt2(int f16, m16_vf hi, m16_vf lo)
{
    (void)f16;
    m16_vi r;
    for (int j = 0; j < 2; j++) {
        r.v[j] = vreinterpretq_u32_u16(vcombine_u16(vshrn_n_u32(m16_round_bf16(lo.v[2 * j]), 16),
                                                    vshrn_n_u32(m16_round_bf16(lo.v[2 * j + 1]), 16)));
        r.v[2 + j] = vreinterpretq_u32_u16(vcombine_u16(vshrn_n_u32(m16_round_bf16(hi.v[2 * j]), 16),
                                                        vshrn_n_u32(m16_round_bf16(hi.v[2 * j + 1]), 16)));
    }
    return r;
}
/* lane i's bfloat16 p0 (low half) and p1 side by side in dword i */
static inline m16_vi m16_pairs(int f16, m16_vf p1, m16_vf p0)
{
    (void)f16;
    m16_vi r;
    for (int j = 0; j < 4; j++)
        r.v[j] = vorrq_u32(vshrq_n_u32(m16_round_bf16(p0.v[j]), 16),
                           vandq_u32(m16_round_bf16(p1.v[j]), vdupq_n_u32(0xffff0000u)));
    return r;
}

/* a b rounded, minus c (flash16_ops.h's m16_mulsub) */
static inline m16_vf m16_mulsub(m16_vf a, m16_vf b, m16_vf c)
{
    for (int j = 0; j < 4; j++) a.v[j] = vsubq_f32(vmulq_f32(a.v[j], b.v[j]), c.v[j]);
    return a;
}

/* 2^x for the weights: flash16_ops.h's m16_exp2w (its polynomial and
 * constants, the same roundings: n = round(x), p(x - n) by three fused
 * multiply-adds, times 2^n exactly, 0 below 2^M16_EXP2_NORMAL, NaN kept) */
#define M16_EXP2_NORMAL (-125.0f)
#define M16_EXP2_P0 1.0f
#define M16_EXP2_P1 0x1.62f5fcp-1f
#define M16_EXP2_P2 0x1.f00c50p-3f
#define M16_EXP2_P3 0x1.c2a20ap-5f
static inline float32x4_t m16_exp2w_q(float32x4_t x)
{
    const uint32x4_t big = vorrq_u32(vcgeq_f32(x, vdupq_n_f32(M16_EXP2_NORMAL)),
                                     vmvnq_u32(vceqq_f32(x, x))); /* not below, or NaN */
    const float32x4_t n = vbslq_f32(big, vrndnq_f32(x), vdupq_n_f32(0.0f));
    const float32x4_t r = vsubq_f32(x, n);
    float32x4_t p = vfmaq_f32(vdupq_n_f32(M16_EXP2_P2), vdupq_n_f32(M16_EXP2_P3), r);
    p = vfmaq_f32(vdupq_n_f32(M16_EXP2_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(M16_EXP2_P0), p, r);
    /* 2^n from its exponent bits: n in [-125, 128] (128: inf, as the
     * scaling overflows on x86; NaN converts to 0 and p is NaN already) */
    const int32x4_t ni = vminq_s32(vcvtq_s32_f32(n), vdupq_n_s32(128));
    const float32x4_t s = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(ni, vdupq_n_s32(127)), 23));
    return vbslq_f32(big, vmulq_f32(p, s), vdupq_n_f32(0.0f));
}
static inline m16_vf m16_exp2w(m16_vf x)
{
    for (int j = 0; j < 4; j++) x.v[j] = m16_exp2w_q(x.v[j]);
    return x;
}

static inline m16_vf m16_zero_ninf(m16_vf x)
{
    for (int j = 0; j < 4; j++)
        x.v[j] = vbslq_f32(vceqq_f32(x.v[j], vdupq_n_f32(-INFINITY)), vdupq_n_f32(0.0f), x.v[j]);
    return x;
}
/* the lanes where a > b, as bits */
static inline unsigned m16_above(m16_vf a, m16_vf b)
{
    const uint32_t w[4] = {1, 2, 4, 8};
    const uint32x4_t bit = vld1q_u32(w);
    unsigned m = 0;
    for (int j = 0; j < 4; j++)
        m |= (unsigned)vaddvq_u32(vandq_u32(vcgtq_f32(a.v[j], b.v[j]), bit)) << (4 * j);
    return m;
}
/* 2^(mold - mnew), 1 where mnew = -inf */
static inline m16_vf m16_alpha(m16_vf mold, m16_vf mnew)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), one = vdupq_n_f32(1.0f);
    for (int j = 0; j < 4; j++) {
        const uint32x4_t dead = vceqq_f32(mnew.v[j], ninf);
        const float32x4_t e = vf_exp2(vsubq_f32(mold.v[j], vbslq_f32(dead, vdupq_n_f32(0.0f), mnew.v[j])));
        mold.v[j] = vbslq_f32(dead, one, e);
    }
    return mold;
}
/* lanes outside [lmin, lmax] (each in [-1, M16_W]) set to -inf */
static inline m16_vf m16_keep_lanes(m16_vf s, int64_t lmin, int64_t lmax)
{
    const int32_t w[4] = {0, 1, 2, 3};
    const int32x4_t lo = vdupq_n_s32((int32_t)lmin), hi = vdupq_n_s32((int32_t)lmax);
    for (int j = 0; j < 4; j++) {
        const int32x4_t iota = vaddq_s32(vld1q_s32(w), vdupq_n_s32(4 * j));
        const uint32x4_t vis = vandq_u32(vcgeq_s32(iota, lo), vcleq_s32(iota, hi));
        s.v[j] = vbslq_f32(vis, s.v[j], vdupq_n_f32(-INFINITY));
    }
    return s;
}
static inline m16_vf m16_recip_or_zero(m16_vf l) /* NaN stays NaN */
{
    for (int j = 0; j < 4; j++)
        l.v[j] = vbslq_f32(vceqq_f32(l.v[j], vdupq_n_f32(0.0f)), vdupq_n_f32(0.0f),
                           vdivq_f32(vdupq_n_f32(1.0f), l.v[j]));
    return l;
}
/* o[e * cs] = half e of x for e < ne <= M16_W; tmp: 2 M16_W halves of scratch */
static inline void m16_store_halves(uint16_t *o, int64_t cs, int64_t ne, m16_vi x, uint16_t *tmp)
{
    m16_store(tmp, x);
    if (cs == 1) {
        memcpy(o, tmp, (size_t)ne * 2);
        return;
    }
    for (int64_t e = 0; e < ne; e++) o[e * cs] = tmp[e];
}

#if !defined(FA_NEON_SIMDE)
#include "fastattn.h"
/* the test hook's native instructions (fastattn.h: fa_bf16_op): BFDOT and
 * BFMMLA on one register each; FA_CAT(bf16_native_op, FA_ISA_NAME) ->
 * bf16_native_op_neon_bf16 */
static int FA_CAT(bf16_native_op, FA_ISA_NAME)(int op, const void *a, const void *b, void *c)
{
    const bfloat16x8_t x = vreinterpretq_bf16_u16(vld1q_u16((const uint16_t *)a));
    const bfloat16x8_t y = vreinterpretq_bf16_u16(vld1q_u16((const uint16_t *)b));
    const float32x4_t acc = vld1q_f32((const float *)c);
    if (op == FA_BF16_OP_BFDOT)
        vst1q_f32((float *)c, vbfdotq_f32(acc, x, y));
    else if (op == FA_BF16_OP_BFMMLA)
        vst1q_f32((float *)c, vbfmmlaq_f32(acc, x, y));
    else
        return FA_EINVAL;
    return FA_OK;
}
#endif

#endif
