/* q8_dot_avx512.h -- the integer dot products of the int8 KV cache's kernel
 * (kernels/decode_q8_dot.h) on the x86 bfloat16 tiers, avx512_bf16 and amx
 * (AVX512-VNNI: every CPU with AVX512-BF16 has it, and their lines in
 * runtime/isa_list.h require it); included by kernels/decode_q8_tmpl.h
 * through FA_SIMD_Q8_DOT (simd_avx512_bf16.h, simd_amx.h).  The vocabulary
 * (q8_dot_avx2.h has the same on 256-bit registers):
 *   QD_W                 int32 lanes of a qd_vi (16; = VF_W): it holds
 *                        2 QD_W int16 (QD_W dword pairs)
 *   QD_TILE_ROWS         the most rows of a P.V register tile (8: 2 x 8
 *                        accumulators of the 32 zmm registers)
 *   QD_PV_CHUNKS(rows)   the column chunks (2 QD_W columns each) of a
 *                        tile of that many rows
 *   qd_zero(), qd_load(p), qd_store(p, x)   2 QD_W int16 at p (unaligned)
 *   qd_widen(p)          2 QD_W int8 at p sign-extended to int16 (VPMOVSXBW)
 *   qd_widen_part(p, n)  the first n (< 2 QD_W) of them, zeros after; reads
 *                        nothing past p + n
 *   qd_dp(acc, a, b)     acc[i] += a.pair[i] . b.pair[i] in int32
 *                        (VPDPWSSD; wraps, so callers bound the sums)
 *   qd_bcast(p)          the int16 pair at p (a dword) in every lane
 *   qd_pairs_lo(a, b), qd_pairs_hi(a, b)   the int16 pairs (a[c], b[c]) of
 *                        the columns c = 8L + 0..3 (lo), 8L + 4..7 (hi) of
 *                        each 128-bit lane L: dword lane 4L + i is column
 *                        8L + i (lo), 8L + 4 + i (hi)
 *   qd_unmix(lo, hi, &o0, &o1)   those two orders back to columns
 *                        0..QD_W (o0) and QD_W..2 QD_W (o1), as floats
 *   qd_hsum_lanes(x)     x[0..QD_W) (int32) -> the vector of their lane
 *                        sums, exact (the transpose-add of vf_hsum_lanes)
 *   qd_to_f(x)           QD_W int32 to float, rounded to nearest
 *   qd_quant(p, x, s)    QD_W floats to int16 at p: rint(x s) in float32,
 *                        ties to even; |x s| < 32767.5 (the caller's s =
 *                        32767 / a for |x| <= a keeps |x s| within 32767
 *                        (1 + 2^-23))
 * and for Q.K^T on bytes, with up to 4 query rows a vector (the byte
 * products' layout in kernels/decode_q8_dot.h):
 *   QD_BYTE_ROWS         4: the most query rows of a vector, a 128-bit
 *                        lane each
 *   qd_load_b(p)         64 bytes at p (unaligned)
 *   qd_load_d(p)         QD_W int32 at p (unaligned)
 *   qd_bytes_bcast(rg, p)  the 64 / rg bytes at p, rg (4, 2 or 1) times
 *   qd_flip(x)           x ^ 0x80 in every byte: an int8 k read as the
 *                        unsigned k + 128
 *   qd_dpbu(acc, u, s)   acc[i] += the 4 products u.u8[4i + m] s.s8[4i + m]
 *                        in int32 (VPDPBUSD; wraps)
 *   qd_shl8_add(h, l)    256 h + l in int32 (wraps)
 *   qd_sub(a, b)         a - b in int32 (wraps)
 *   qd_hsum4(x)          x[0..4) -> dword i of lane L = the sum of x[i]'s
 *                        four dwords in lane L, exact
 *   qd_fold_lanes(rg, x) lane 4g / rg += the other lanes of row g's
 *                        4 / rg (rg 4: x itself)
 *   vf_bcast4(p)         the 4 floats at p in every 128-bit lane
 *   qd_scatter_rows(rg, p, ld, x)  lane 4g / rg's 4 floats to p + g ld,
 *                        g < rg
 * The SIMDe build has no 512-bit int32 <-> float conversions or VPMOVDW:
 * element by element there, the same float32 operations in the same order. */
#ifndef FASTATTN_Q8_DOT_H
#define FASTATTN_Q8_DOT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef __m512i qd_vi;
#define QD_W 16
#define QD_PV_CHUNKS(rows) ((rows) <= 2 ? 4 : (rows) <= 4 ? 2 : 1)
#define QD_TILE_ROWS 8

static inline qd_vi qd_zero(void) { return _mm512_setzero_si512(); }
static inline qd_vi qd_load(const int16_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline void qd_store(int16_t *p, qd_vi x) { _mm512_storeu_si512((void *)p, x); }
static inline qd_vi qd_widen(const int8_t *p)
{
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
}
static inline qd_vi qd_widen_part(const int8_t *p, int64_t n)
{
    int8_t t[32] = {0};
    memcpy(t, p, (size_t)n);
    return qd_widen(t);
}
/* A dot-product step acc += a . b: QD_DOT_STEP(qd_dp, vpdpwssd,
 * _mm512_dpwssd_epi32) defines qd_dp.  GCC 12 copies the intrinsic's
 * accumulator into a new register and back around each step of an unrolled
 * loop (two moves per dot product); the "+v" operand of the same
 * instruction keeps it in place. */
#if defined(__GNUC__) && !defined(FA_AVX512_SIMDE)
#define QD_DOT_STEP(name, insn, intrinsic)                                  \
    static inline qd_vi name(qd_vi acc, qd_vi a, qd_vi b)                   \
    {                                                                       \
        __asm__(#insn " %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));         \
        return acc;                                                         \
    }
#else
#define QD_DOT_STEP(name, insn, intrinsic) \
    static inline qd_vi name(qd_vi acc, qd_vi a, qd_vi b) { return intrinsic(acc, a, b); }
#endif
QD_DOT_STEP(qd_dp, vpdpwssd, _mm512_dpwssd_epi32)
QD_DOT_STEP(qd_dpbu, vpdpbusd, _mm512_dpbusd_epi32) /* a: unsigned bytes, b: signed */
#undef QD_DOT_STEP
static inline qd_vi qd_bcast(const int16_t *p)
{
    int32_t w;
    memcpy(&w, p, sizeof w);
    return _mm512_set1_epi32(w);
}
static inline qd_vi qd_pairs_lo(qd_vi a, qd_vi b) { return _mm512_unpacklo_epi16(a, b); }
static inline qd_vi qd_pairs_hi(qd_vi a, qd_vi b) { return _mm512_unpackhi_epi16(a, b); }

static inline void qd_unmix(vf lo, vf hi, vf *o0, vf *o1)
{
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    *o0 = _mm512_permutex2var_ps(lo, i0, hi);
    *o1 = _mm512_permutex2var_ps(lo, i1, hi);
}

/* vf_hsum_lanes' steps (simd_avx512.h) in int32: 256-bit halves, then
 * 128-bit quarters, then a 4 x 4 transpose-add; x[4m + k] -> slot 4k + m. */
static inline qd_vi qd_hsum_lanes(const qd_vi *x)
{
    qd_vi y[8], z[4];
    for (int i = 0; i < 8; i++) {
        const qd_vi a = x[(2 * i) % 4 * 4 + (2 * i) / 4], b = x[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
        y[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xee));
    }
    for (int i = 0; i < 4; i++)
        z[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(y[2 * i], y[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(y[2 * i], y[2 * i + 1], 0xdd));
    const vf t0 = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]),
                                                       _mm512_unpackhi_epi32(z[0], z[1])));
    const vf t1 = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]),
                                                       _mm512_unpackhi_epi32(z[2], z[3])));
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(t0, t1, 0x44)),
                            _mm512_castps_si512(_mm512_shuffle_ps(t0, t1, 0xee)));
}

#define QD_BYTE_ROWS 4
static inline qd_vi qd_load_b(const void *p) { return _mm512_loadu_si512(p); }
static inline qd_vi qd_load_d(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline qd_vi qd_bytes_bcast(int rg, const int8_t *p)
{
    if (rg == 4) return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    if (rg == 2) return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_loadu_si512((const void *)p);
}
static inline qd_vi qd_flip(qd_vi x) { return _mm512_xor_si512(x, _mm512_set1_epi8((char)0x80)); }
static inline qd_vi qd_shl8_add(qd_vi h, qd_vi l)
{
    return _mm512_add_epi32(_mm512_slli_epi32(h, 8), l);
}
static inline qd_vi qd_sub(qd_vi a, qd_vi b) { return _mm512_sub_epi32(a, b); }
/* the 4 x 4 transpose-add of each 128-bit lane */
static inline qd_vi qd_hsum4(const qd_vi *x)
{
    const qd_vi a = _mm512_add_epi32(_mm512_unpacklo_epi32(x[0], x[1]),
                                     _mm512_unpackhi_epi32(x[0], x[1]));
    const qd_vi b = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2], x[3]),
                                     _mm512_unpackhi_epi32(x[2], x[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
static inline qd_vi qd_fold_lanes(int rg, qd_vi x)
{
    if (rg <= 2) x = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
    if (rg == 1) x = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    return x;
}
static inline vf vf_bcast4(const float *p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }
static inline void qd_scatter_rows(int rg, float *p, int64_t ld, vf x)
{
    _mm_storeu_ps(p, _mm512_castps512_ps128(x));
    if (rg == 4) {
        _mm_storeu_ps(p + ld, _mm512_extractf32x4_ps(x, 1));
        _mm_storeu_ps(p + 2 * ld, _mm512_extractf32x4_ps(x, 2));
        _mm_storeu_ps(p + 3 * ld, _mm512_extractf32x4_ps(x, 3));
    } else if (rg == 2) {
        _mm_storeu_ps(p + ld, _mm512_extractf32x4_ps(x, 2));
    }
}

#if !defined(FA_AVX512_SIMDE)
static inline vf qd_to_f(qd_vi x) { return _mm512_cvtepi32_ps(x); }
static inline void qd_quant(int16_t *p, vf x, vf s)
{
    const __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(x, s));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(l));
}
#else
static inline vf qd_to_f(qd_vi x)
{
    int32_t t[16];
    float f[16];
    _mm512_storeu_si512((void *)t, x);
    for (int i = 0; i < 16; i++) f[i] = (float)t[i];
    return _mm512_loadu_ps(f);
}
static inline void qd_quant(int16_t *p, vf x, vf s)
{
    float xs[16], ss[16];
    _mm512_storeu_ps(xs, x);
    _mm512_storeu_ps(ss, s);
    for (int i = 0; i < 16; i++) p[i] = (int16_t)rintf(xs[i] * ss[i]);
}
#endif

#endif
