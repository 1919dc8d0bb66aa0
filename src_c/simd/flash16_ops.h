/* flash16_ops.h -- the vector operations of the 16-bit matrix path
 * (kernels/flash16_*.h), on the AVX-512 registers of the amx and
 * avx512_bf16 mappings.  Included by kernels/kernels_isa.c after simd.h and
 * bf16_tiles.h where the mapping defines FA_SIMD_BF16.
 *
 * A query block's 32 query lanes are two float vectors m16_vf of M16_W
 * lanes, acted on by m16f_load, m16f_store, m16f_set1, m16f_zero, m16f_add,
 * m16f_mul, m16f_max, m16f_max_acc (here simd_avx512.h's vf_* of the same
 * names); 16-bit data moves as m16_vi, M16_W dwords = 2 M16_W halves, one
 * pair (two keys, or two E columns) per dword:
 *   m16_load, m16_store, m16_zero, m16_or     unaligned 64 bytes, 0, a | b
 *   m16_as_vi, m16_as_vf                      the same bits as the other type
 *   m16_bcast_pair(p)                         the pair at p in every dword
 *   m16_transpose(r)                          16 x 16 dwords transposed
 *   m16_widen(p, n, hi)                       n <= M16_W halves at p as the
 *                                             low (hi 0) or high halves of dwords
 *   m16_store_half(p, x, hi)                  the low (hi 0) or high halves of
 *                                             x's dwords as M16_W halves at p
 *   m16_clear_nonfinite(r, eb)                halves with all exponent bits eb
 *                                             set zeroed; which halves had one
 *   m16_cvt2(f16, hi, lo)                     32 halves, nearest even, lo's first
 *   m16_pairs(f16, p1, p0)                    m16_cvt2 with lane i's p0, p1
 *                                             side by side (a dword per lane)
 *   m16_mulsub(a, b, c)                       a b rounded, minus c (the weights'
 *                                             exponent: 0 at the maximum, so never
 *                                             the product's rounding error, which
 *                                             2^ turns into an overflow at large
 *                                             scores)
 *   m16_exp2w(x)                              2^x for the weights (below)
 *   m16_fmsub(a, b, c), m16_nonpos(x)         a b - c in one rounding; min(x, 0),
 *                                             NaN kept (bw16.h's P, never above
 *                                             1; x86 only)
 *   m16_zero_ninf(x), m16_above(a, b)         x with -inf lanes 0; a > b lanes
 *   m16_alpha(mold, mnew)                     2^(mold - mnew), 1 where mnew = -inf
 *   m16_keep_lanes(s, lmin, lmax)             lanes outside [lmin, lmax] -inf
 *   m16_recip_or_zero(l)                      1 / l, 0 where l = 0
 *   m16_store_halves(o, cs, ne, x, tmp)       ne halves at stride cs
 *   m16_dot_pairs, m16_dot_rows               no-ops (simd/flash16_neon.h) */
#ifndef FASTATTN_FLASH16_OPS_H
#define FASTATTN_FLASH16_OPS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define M16_W 16 /* float32 lanes of m16_vf, dwords of m16_vi, rows of a tile */
typedef __m512i m16_vi;
/* the 32 query lanes' float vectors: here the avx512 mapping's vf, one zmm
 * register (simd/flash16_neon.h: four NEON registers) */
typedef vf m16_vf;
#define m16f_load vf_load
#define m16f_store vf_store
#define m16f_set1 vf_set1
#define m16f_zero vf_zero
#define m16f_add vf_add
#define m16f_mul vf_mul
#define m16f_max vf_max
#define m16f_max_acc vf_max_acc
/* the operands in the dot products' own layout after packing (simd/flash16_neon.h:
 * BFMMLA's); VDPBF16PS and the tiles take them as packed */
static inline void m16_dot_pairs(uint16_t *p, int64_t stride, int64_t nrows, int64_t nh)
{
    (void)p, (void)stride, (void)nrows, (void)nh;
}
static inline void m16_dot_rows(uint32_t *p, int64_t nrows) { (void)p, (void)nrows; }

static inline m16_vi m16_load(const void *p) { return _mm512_loadu_si512(p); }
static inline void m16_store(void *p, m16_vi x) { _mm512_storeu_si512(p, x); }
static inline m16_vi m16_zero(void) { return _mm512_setzero_si512(); }
static inline m16_vi m16_or(m16_vi a, m16_vi b) { return _mm512_or_si512(a, b); }
static inline m16_vi m16_as_vi(vf x) { return _mm512_castps_si512(x); }
static inline vf m16_as_vf(m16_vi x) { return _mm512_castsi512_ps(x); }
/* by memcpy: p points into uint16_t rows, which C99's aliasing rules do not
 * let us read as uint32_t (one broadcast load all the same) */
static inline m16_vi m16_bcast_pair(const uint16_t *p)
{
    uint32_t d;
    memcpy(&d, p, 4);
    return _mm512_set1_epi32((int)d);
}

/* unpack 32, 64 bits, then the 128-bit lanes: row j of the result is
 * column j of the input */
static inline void m16_transpose(m16_vi r[16])
{
    m16_vi t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    m16_vi u[16]; /* u[4g + c]: lane l holds column 4l + c of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const m16_vi a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        const m16_vi b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const m16_vi d = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const m16_vi e = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(a, d, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(a, d, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(b, e, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(b, e, 0xDD);
    }
}

#if defined(FA_AVX512_SIMDE) /* SIMDe lacks the masked 16-bit load and store */
static inline m16_vi m16_widen(const uint16_t *p, int64_t n, int hi)
{
    uint32_t w[M16_W] = {0};
    for (int64_t e = 0; e < n && e < M16_W; e++) w[e] = (uint32_t)p[e] << (hi ? 16 : 0);
    return _mm512_loadu_si512((const void *)w);
}
#else
static inline m16_vi m16_widen(const uint16_t *p, int64_t n, int hi)
{
    const __m256i h = n >= M16_W ? _mm256_loadu_si256((const __m256i *)(const void *)p)
                                 : _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(
                                       ((__mmask32)1 << n) - 1, p));
    const m16_vi w = _mm512_cvtepu16_epi32(h);
    return hi ? _mm512_slli_epi32(w, 16) : w;
}
#endif

static inline void m16_store_half(uint16_t *p, m16_vi x, int hi)
{
    fa_store_lo16(p, hi ? _mm512_srli_epi32(x, 16) : x);
}

/* bit 0: some low half of *r had all the exponent bits eb (NaN or Inf),
 * bit 1: some high half; those halves are zeroed */
static inline unsigned m16_clear_nonfinite(m16_vi *r, uint32_t eb)
{
    const m16_vi elo = _mm512_set1_epi32((int)eb), ehi = _mm512_set1_epi32((int)(eb << 16));
    const __mmask16 blo = _mm512_cmpeq_epi32_mask(_mm512_and_si512(*r, elo), elo);
    const __mmask16 bhi = _mm512_cmpeq_epi32_mask(_mm512_and_si512(*r, ehi), ehi);
    if (!(blo | bhi)) return 0;
    *r = _mm512_mask_and_epi32(*r, blo, *r, _mm512_set1_epi32((int)0xffff0000u));
    *r = _mm512_mask_and_epi32(*r, bhi, *r, _mm512_set1_epi32(0xffff));
    return (blo ? 1u : 0u) | (bhi ? 2u : 0u);
}

/* the call's 16-bit type: float16 where f16 (amx with AMX-FP16), else bfloat16 */
static inline m16_vi m16_cvt2(int f16, vf hi, vf lo)
{
#if defined(FA_AMX_FP16)
    if (f16) return fa_cvt2f16(hi, lo);
#else
    (void)f16;
#endif
    return fa_cvt2bf16(hi, lo);
}
static inline m16_vi m16_pairs(int f16, vf p1, vf p0)
{
    const m16_vi inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                          24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                          1, 16, 0);
    return _mm512_permutexvar_epi16(inter, m16_cvt2(f16, p1, p0));
}

static inline vf m16_mulsub(vf a, vf b, vf c) { return _mm512_sub_ps(_mm512_mul_ps(a, b), c); }
static inline vf m16_fmsub(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }
/* VMINPS returns its second operand where either is NaN */
static inline vf m16_nonpos(vf x) { return _mm512_min_ps(_mm512_setzero_ps(), x); }

/* 2^x for the softmax weights that P.V rounds to 16 bits (relative error
 * 2^-9 in bfloat16): n = round(x), 2^(x - n) by a degree-3 polynomial with
 * constant term 1 (relative error 1.02e-4 < 2^-13 on [-1/2, 1/2]: the
 * minimax of the relative error, fitted like vmath.h's), scaled by 2^n with
 * VSCALEFPS; below 2^-125 the result is exactly 0 (so exp2(-inf) = 0;
 * VCVTNE2PS2BF16 flushes float32 subnormals to 0 anyway).  Four operations
 * fewer per vector than vf_exp2, whose degree 5 (9e-8) the rounding of P
 * does not need. */
#define M16_EXP2_NORMAL (-125.0f) /* from here on 2^x is a float32 normal */
#define M16_EXP2_P0 1.0f /* exactly 1: equal scores give equal weights of exactly 1 */
#define M16_EXP2_P1 0x1.62f5fcp-1f
#define M16_EXP2_P2 0x1.f00c50p-3f
#define M16_EXP2_P3 0x1.c2a20ap-5f
static inline vf m16_exp2w(vf x)
{
    /* a result below the float32 normals would cost a microcode assist in
     * VSCALEFPS (tens of cycles per vector: every hidden score is one);
     * those lanes are zeroed instead.  NaN is kept (unordered: true).  Their
     * n is 0, so r = x there: -inf gives +-inf through the polynomial, never
     * inf - inf (no NaN from a hidden score). */
    const __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(M16_EXP2_NORMAL), _CMP_NLT_UQ);
    const vf n = _mm512_maskz_roundscale_ps(big, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf r = _mm512_sub_ps(x, n);
    vf p = _mm512_fmadd_ps(_mm512_set1_ps(M16_EXP2_P3), r, _mm512_set1_ps(M16_EXP2_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(M16_EXP2_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(M16_EXP2_P0));
    return _mm512_maskz_scalef_ps(big, p, n);
}

static inline vf m16_zero_ninf(vf x)
{
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ), x);
}
static inline unsigned m16_above(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline vf m16_alpha(vf mold, vf mnew)
{
    const __mmask16 live = _mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    return _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), live,
                              vf_exp2(_mm512_sub_ps(mold, _mm512_maskz_mov_ps(live, mnew))));
}
/* lmin, lmax in [-1, M16_W] */
static inline vf m16_keep_lanes(vf s, int64_t lmin, int64_t lmax)
{
    const m16_vi iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __mmask16 vis = _mm512_cmpge_epi32_mask(iota, _mm512_set1_epi32((int)lmin)) &
                          _mm512_cmple_epi32_mask(iota, _mm512_set1_epi32((int)lmax));
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, s);
}
static inline vf m16_recip_or_zero(vf l) /* NaN stays NaN */
{
    const __mmask16 z = _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_EQ_OQ);
    return _mm512_maskz_div_ps((__mmask16)~z, _mm512_set1_ps(1.0f), l);
}
/* o[e * cs] = half e of x for e < ne <= M16_W; tmp: 2 M16_W halves of scratch */
static inline void m16_store_halves(uint16_t *o, int64_t cs, int64_t ne, m16_vi x, uint16_t *tmp)
{
#if !defined(FA_AVX512_SIMDE)
    if (cs == 1 && ne == M16_W) { /* a plain store: masked ones are slow on AMD */
        _mm256_storeu_si256((__m256i *)(void *)o, _mm512_castsi512_si256(x));
        return;
    }
    if (cs == 1) {
        _mm512_mask_storeu_epi16(o, (__mmask32)((1u << ne) - 1), x);
        return;
    }
#endif
    _mm512_storeu_si512((void *)tmp, x);
    for (int64_t e = 0; e < ne; e++) o[e * cs] = tmp[e];
}

#endif
