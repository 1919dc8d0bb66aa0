/* dp16_rows.h -- the vocabulary of the bfloat16 decoding kernels
 * (kernels/decode_dp16.h: on VDPBF16PS on the avx512_bf16 tier, widening to
 * float32 on amx); included by kernels_isa.c after simd/bf16_tiles.h.  A
 * dd_vi holds 32 bfloat16 (16 dword pairs); the vf are simd_avx512.h's.
 *   dd_load(p), dd_store(p, x)   32 bfloat16 at p (64 bytes, unaligned)
 *   dd_dp(acc, a, b)      acc[i] += a.pair[i] . b.pair[i], odd element
 *                         first, each step rounded (VDPBF16PS; DAZ, FTZ)
 *   dd_round(hi, lo)      32 floats to bfloat16 nearest even, lo's first
 *                         (fa_cvt2bf16 of bf16_tiles.h)
 *   dd_pairs_lo(a, b), dd_pairs_hi(a, b)   the pairs (a[c], b[c]) of the
 *                         columns c = 8L + 0..3 (lo), 8L + 4..7 (hi) of
 *                         each 128-bit lane L: dword lane 4L + i is
 *                         column 8L + i (lo), 8L + 4 + i (hi)
 *   dd_mix(o0, o1, &lo, &hi)  columns 0..15 (o0) and 16..31 (o1) of a float
 *                         row into that order; dd_unmix the inverse
 *   dd_bcast(w)           the dword w in every lane
 *   dd_keep(x, m)         x & m per dword (a pair with one key dropped)
 *   dd_put4(p, x, i)      float lanes 4i .. 4i + 3 of x to p[0 .. 4)
 *   dd_nonzero(x)         bit i set where bfloat16 lane i of x is not +0
 * and, for the widening kernels (amx):
 *   dd_wlo(x), dd_whi(x)  the float32 values (exact) of x's bfloat16 in
 *                         dd_mix's lo and hi orders (the columns of
 *                         dd_pairs_lo and dd_pairs_hi)
 *   dd_zeros(x)           bit i set where float lane i of x is +-0
 * The SIMDe build (FA_BF16_EMULATED) takes VDPBF16PS from
 * simd/bf16_emulate.h, with the hardware's roundings. */
#ifndef FASTATTN_DP16_ROWS_H
#define FASTATTN_DP16_ROWS_H

#include <stdint.h>

#include "simd/bf16_emulate.h"
#include "simd/bf16_tiles.h"

typedef __m512i dd_vi;

static inline dd_vi dd_load(const uint16_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline void dd_store(uint16_t *p, dd_vi x) { _mm512_storeu_si512((void *)p, x); }

static inline vf dd_dp(vf acc, dd_vi a, dd_vi b) { return fa_dpbf16(acc, a, b); }

static inline dd_vi dd_round(vf hi, vf lo) { return fa_cvt2bf16(hi, lo); }
static inline dd_vi dd_pairs_lo(dd_vi a, dd_vi b) { return _mm512_unpacklo_epi16(a, b); }
static inline dd_vi dd_pairs_hi(dd_vi a, dd_vi b) { return _mm512_unpackhi_epi16(a, b); }
static inline dd_vi dd_bcast(uint32_t w) { return _mm512_set1_epi32((int)w); }
static inline dd_vi dd_keep(dd_vi x, uint32_t m) { return _mm512_and_si512(x, _mm512_set1_epi32((int)m)); }

static inline uint32_t dd_nonzero(dd_vi x) { return (uint32_t)_mm512_test_epi16_mask(x, x); }

/* each bfloat16 the high half of a dword */
static inline vf dd_wlo(dd_vi x)
{
    return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
}
static inline vf dd_whi(dd_vi x)
{
    return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
}
static inline uint32_t dd_zeros(vf x)
{
    return (uint32_t)_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ);
}

static inline void dd_put4(float *p, vf x, int i)
{
    const __m512i at = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                                        _mm512_set1_epi32(4 * i));
    _mm_storeu_ps(p, _mm512_castps512_ps128(_mm512_permutexvar_ps(at, x)));
}

static inline void dd_mix(vf o0, vf o1, vf *lo, vf *hi)
{
    const __m512i il = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i ih = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    *lo = _mm512_permutex2var_ps(o0, il, o1);
    *hi = _mm512_permutex2var_ps(o0, ih, o1);
}

static inline void dd_unmix(vf lo, vf hi, vf *o0, vf *o1)
{
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    *o0 = _mm512_permutex2var_ps(lo, i0, hi);
    *o1 = _mm512_permutex2var_ps(lo, i1, hi);
}

#endif
