/* q8_dot_avx2.h -- the integer dot products of the int8 KV cache's kernel
 * (kernels/decode_q8_dot.h) on the avx2 tier, 256 bits wide: the
 * vocabulary of q8_dot_avx512.h (read its list there) with QD_W = 8 int32
 * lanes (16 int16), included by kernels/decode_q8_tmpl.h through
 * FA_SIMD_Q8_DOT (simd_avx2.h).
 *   qd_dp is VPMADDWD then VPADDD (AVX2 alone has no VPDPWSSD):
 *   the pair sums are the same integers as VPDPWSSD's, since VPMADDWD
 *   saturates only for two pairs of -32768 and the callers' levels are
 *   within +-32767 and +-128;
 *   QD_TILE_ROWS is 4 and QD_PV_CHUNKS keeps 2 x rows x chunks at 8:
 *   those accumulators, the pairs of a value chunk and a broadcast weight
 *   fit the 16 ymm registers (8 rows would spill). */
#ifndef FASTATTN_Q8_DOT_H
#define FASTATTN_Q8_DOT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef __m256i qd_vi;
#define QD_W 8
#define QD_PV_CHUNKS(rows) ((rows) <= 1 ? 4 : (rows) <= 2 ? 2 : 1)
#define QD_TILE_ROWS 4

static inline qd_vi qd_zero(void) { return _mm256_setzero_si256(); }
static inline qd_vi qd_load(const int16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void qd_store(int16_t *p, qd_vi x) { _mm256_storeu_si256((__m256i *)p, x); }
static inline qd_vi qd_widen(const int8_t *p)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
}
static inline qd_vi qd_widen_part(const int8_t *p, int64_t n)
{
    int8_t t[16] = {0};
    memcpy(t, p, (size_t)n);
    return qd_widen(t);
}
/* GCC 12 gives each step of an unrolled loop a new register for the sum
 * and copies it back (spilling one of P.V's eight accumulators to the
 * stack); the "+x" operand of the add keeps it in place. */
#if defined(__GNUC__)
static inline qd_vi qd_dp(qd_vi acc, qd_vi a, qd_vi b)
{
    const qd_vi m = _mm256_madd_epi16(a, b);
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(m));
    return acc;
}
#else
static inline qd_vi qd_dp(qd_vi acc, qd_vi a, qd_vi b)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#endif
static inline qd_vi qd_bcast(const int16_t *p)
{
    int32_t w;
    memcpy(&w, p, sizeof w);
    return _mm256_set1_epi32(w);
}
static inline qd_vi qd_pairs_lo(qd_vi a, qd_vi b) { return _mm256_unpacklo_epi16(a, b); }
static inline qd_vi qd_pairs_hi(qd_vi a, qd_vi b) { return _mm256_unpackhi_epi16(a, b); }

/* lo holds columns 0..3 and 8..11, hi 4..7 and 12..15 (one 128-bit lane each) */
static inline void qd_unmix(vf lo, vf hi, vf *o0, vf *o1)
{
    *o0 = _mm256_permute2f128_ps(lo, hi, 0x20);
    *o1 = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* vf_hsum_lanes' steps (simd_avx2.h) in int32: three rounds of horizontal
 * adds, then the 128-bit halves added */
static inline qd_vi qd_hsum_lanes(const qd_vi *x)
{
    const qd_vi g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
    const qd_vi g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(x[4], x[5]), _mm256_hadd_epi32(x[6], x[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                            _mm256_permute2x128_si256(g0, g1, 0x31));
}

static inline vf qd_to_f(qd_vi x) { return _mm256_cvtepi32_ps(x); }
static inline void qd_quant(int16_t *p, vf x, vf s)
{
    const __m256i l = _mm256_cvtps_epi32(_mm256_mul_ps(x, s));
    _mm_storeu_si128((__m128i *)p,
                     _mm_packs_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1)));
}

#endif
