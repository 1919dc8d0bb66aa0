/* kernels.h -- the micro-kernel contract, one table per element type.
 *
 * Each ISA of runtime/isa_list.h (kernels_isa.c, compiled once per ISA with
 * its own flags, instantiating kernels_tmpl.h) fills one fa_kernels_f32 and
 * one fa_kernels_f64 with the same functions: fa_kernels_f32_generic,
 * fa_kernels_f32_avx2, fa_kernels_f32_avx512, fa_kernels_f64_generic, ...
 * runtime/dispatch.c picks the table once (cpuid + xgetbv, or FASTATTN_ISA)
 * and the drivers (driver/) call through it.  Nothing here allocates.
 *
 * Layouts (all sizes and leading dimensions in elements, 64-bit):
 *   qp  packed queries, row-major [rows x E], rows a multiple of mr, already
 *       multiplied by the softmax scale;
 *   kp  packed keys, panel-major: panel p holds keys p*nr .. p*nr+nr-1 as
 *       [E x nr] (key index fastest), zero-padded past the last key;
 *   vp  packed values, panel-major: panel c holds columns c*nr .. c*nr+nr-1
 *       as [keys x nr] at vp + c*pstride, zero-padded past the last column;
 *   s   score tile, row-major with leading dimension lds;
 *   p   probabilities, row-major with leading dimension ldp;
 *   o   output accumulator, row-major with leading dimension ldo.
 *
 * One table per ISA and element type holds every entry that ISA provides:
 * besides the float micro-kernels, the f32 table carries the 16-bit matrix
 * path's kernels (kernels/flash16.h: packing, the tile or VDPBF16PS steps,
 * the softmax step, writing out; driver/flash16.c runs their loops), the
 * 16-bit backward's products (fa_bw16_kernels below; driver/bw16.c), the
 * int8 KV cache's kernel (kernels/decode_q8_tmpl.h, on the f32 kernels of
 * its ISA; on avx2 and the x86 bfloat16 tiers Q.K^T and P.V on integer
 * dot products, VPMADDWD or VPDPWSSD, kernels/decode_q8_dot.h: int16
 * queries, per-block int16 weights, exact int32 sums) and the test hook's native instructions, so runtime/dispatch.c
 * keeps one selector array per element type and nothing else.  They sit in
 * the f32 table because all their arithmetic is float32.
 */
#ifndef FA_KERNELS_TABLE /* the header proper */
#ifndef FASTATTN_KERNELS_H
#define FASTATTN_KERNELS_H

#include <stdint.h>

#include "kernels/blocking.h"
#include "runtime/util.h"

#include "kernels/flash16.h" /* fa_flash16_kernels: the 16-bit matrix kernels */

/* The test hook's native instructions (fastattn.h: fa_bf16_op), an entry
 * of the f32 tables: NULL but for amx and avx512_bf16 in a build with the
 * real instructions (avx512_bf16: the vector instructions only; FA_EINVAL
 * for a tile one); fa_bf16_native_op() gives amx's where the CPU runs amx,
 * else avx512_bf16's where it runs that. */
typedef int (*fa_bf16_op_fn)(int op, const void *a, const void *b, void *c);
fa_bf16_op_fn fa_bf16_native_op(void);
struct fa_q8_item; /* kernels/decode_q8.h */

/* One key block of a decoding step for qk_rows and pv_rows: key j's row
 * at k[j], value j's at v[j], j < n <= FA_KC (any element type; unit
 * column stride); k[n .. n + FA_KC): the next block's key rows (NULL past
 * the last), only prefetched.  The drivers fill it from a block table, so
 * a block is one call whatever the page size.  qk_rows prefetches the
 * value rows (32-64 KiB at Ev = 128 in bfloat16 / float32), which wait in
 * the L2 for pv_rows, and the key rows FA_DIRECT_PF_KEYS ahead (a first
 * block's); pv_rows the next block's key rows, so that the memory is read
 * while this block's products run as well; the rows x FA_KC scores (4 KiB
 * at 8 rows) stay in the L1 between them. */
typedef struct fa_krows {
    const void *k[2 * FA_KC], *v[FA_KC];
    /* kbytes: a key row's bytes (for pv_rows' prefetches); vrun: the bytes
     * over which value rows follow one another (a page's rows of one head;
     * 0 where unknown), for qk_rows' choice of how to ask for them */
    int64_t n, kbytes, vrun;
} fa_krows;

/* pv_rows' prefetch of part `part` of nparts of the next block's key row j
 * (NULL past the last): its cache lines part, part + nparts, ... */
static inline void fa_krows_prefetch_part(const fa_krows *t, int64_t j, int64_t part,
                                          int64_t nparts)
{
    const char *k = (const char *)t->k[t->n + j];
    if (k)
        for (int64_t b = part * 64; b < t->kbytes; b += nparts * 64) FA_PREFETCH(k + b);
}
/* ... and of the whole row */
static inline void fa_krows_prefetch_next(const fa_krows *t, int64_t j)
{
    fa_krows_prefetch_part(t, j, 0, 1);
}

/* The 16-bit backward's kernels (driver/bw16.c; kernels/bw16.h), an entry
 * of the f32 tables: on amx and avx512_bf16, NULL elsewhere (there, BFMMLA's
 * neon_bf16 included, the backward widens 16-bit operands into the float
 * kernels).
 * Halves are bfloat16, or float16 where f16 is 1 (amx with AMX-FP16 only).
 *   gemm   c[m x n] (float32, row stride ldc) += a . b over k halves (zero:
 *          c = a . b, c's old contents never read): a row
 *          i at a + i*lda (k halves); b in pair rows, pair row p at b +
 *          p*ldb (n dwords: column j's elements 2p, 2p + 1 side by side,
 *          the VNNI layout); m and n multiples of 16, k of 32, zero padded.
 *          TDPBF16PS / TDPFP16PS tiles (amx: tf the tile state of
 *          flash16.tile_bytes, between flash16.tiles_on and tiles_off) or
 *          VDPBF16PS lanes; each c element's sum depends on its a row, b
 *          column and k alone, never on m, n or the thread.  A zero times
 *          NaN or Inf is NaN: the caller keeps non-finite operands away.
 *   trans  y[j*ldy + i] = x[i*ldx + j] (float32, exact), i < rows, j < n;
 *          rows and n multiples of 16 (the transposed accumulators dK^T,
 *          dV^T back to rows);
 *   grad_pair  P and dS of two rows of a pair, rounded as their operands
 *          (row e's s, ds, f at s + e*ld, ds + e*ld, f + e*ld): where
 *          live[e], P = exp(sc s - l[e]) (sc s the final scores, -inf
 *          where hidden; sc 1 or the scale the caller left to this step),
 *          bfloat16 by flash16's weights' exp2 in base 2 (relative error
 *          under 2^-13, the forward's own P), float16 by the f32 table's
 *          vector exp (expsum's values exactly), and dS = P (dP - d[e])
 *          (ds holds dP; times f[j] where f: the soft cap's derivative),
 *          for j < n; where some dS of the row is NaN or
 *          Inf (or with f), dS = 0 wherever P = 0; P = dS = 0 for n <= j <
 *          npad and on a row not live.  Written, rounded to nearest even,
 *          each skipped where NULL: pp and dsp one pair row (pp[2j + e] =
 *          row e's P_j: the b of a product over the rows), dsr two rows (dsr,
 *          dsr + ldr: the a of a product over the keys); npad a multiple of
 *          32.  s, ds, f are scratch, their contents after the call
 *          unspecified;
 *   inter  y pair row p (at y + p*ldy) = 16-bit rows 2p, 2p + 1 of x (row
 *          stride xs) side by side per column, moved as they are: y[p*ldy +
 *          2c + e] = x[(2p + e)*xs + c], p < rows / 2, c < n; rows even, n a
 *          multiple of 16; 1 if one of them has all the exponent bits eb
 *          (NaN or Inf), else 0;
 *   cols   y[c*ldy + r] = x[r*xs + c] (16-bit rows of stride xs, moved as
 *          they are), r < rows, c < n; rows a multiple of 16, n of 32 (a
 *          of a product over x's rows); 1 if one of them has all the
 *          exponent bits eb (NaN or Inf), else 0;
 *   dots   d[r] = sum over c < n, in order from 0, of x[r*xs + c] y[r*ys + c]
 *          (16-bit, widened exactly; a float32 add after each product), r <
 *          rows, a multiple of 16: the rows' D_i = dO_i . O_i. */
typedef struct fa_bw16_kernels {
    void (*gemm)(void *tf, int f16, int zero, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                 int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc);
    void (*trans)(const float *x, int64_t ldx, int64_t rows, int64_t n, float *y, int64_t ldy);
    void (*grad_pair)(int f16, float *s, float *ds, float *f, int64_t ld, int64_t n, int64_t npad,
                      const int *live, float sc, const float *l, const float *d, uint16_t *pp,
                      uint16_t *dsp, uint16_t *dsr, int64_t ldr);
    int (*inter)(const uint16_t *x, int64_t xs, int64_t rows, int64_t n, uint16_t eb, uint16_t *y,
                 int64_t ldy);
    int (*cols)(const uint16_t *x, int64_t xs, int64_t rows, int64_t n, uint16_t eb, uint16_t *y,
                int64_t ldy);
    void (*dots)(int f16, const uint16_t *x, int64_t xs, const uint16_t *y, int64_t ys,
                 int64_t rows, int64_t n, float *d);
} fa_bw16_kernels;

/* The table types fa_kernels_f32 (float) and fa_kernels_f64 (double): the
 * struct at the end of this file, included here once per element type. */
#define FA_KERNELS_TABLE 1
#define FA_SFX f32
#include "kernels/kernels.h"
#undef FA_SFX
#define FA_SFX f64
#include "kernels/kernels.h"
#undef FA_SFX
#undef FA_KERNELS_TABLE

/* fa_kernels_f32_<name>, fa_kernels_f64_<name> for every ISA of the list
 * (defined by kernels_isa.c where the ISA is built for the target).  In the
 * SIMDe test build of the aarch64 lines (FA_NEON_EMULATED) only those with
 * a `simde:` flags line are compiled: theirs are weak there, so a table
 * left out is NULL (not built) in runtime/dispatch.c. */
#if defined(FA_NEON_EMULATED)
#define FA_WEAK_aarch64 __attribute__((weak))
#else
#define FA_WEAK_aarch64
#endif
#define FA_WEAK_any
#define FA_WEAK_x86
#define FA_ISA(name, NAME, arch, required)                                          \
    extern FA_WEAK_##arch const fa_kernels_f32 fa_kernels_f32_##name;                \
    extern FA_WEAK_##arch const fa_kernels_f64 fa_kernels_f64_##name;
#include "runtime/isa_list.h"
#undef FA_ISA

/* The tables in use, chosen by runtime/dispatch.c. */
const fa_kernels_f32 *fa_kernels_f32_current(void);
/* The 16-bit matrix kernels the current path runs: its own, or, where it has
 * none, those of the best supported path below it in the list and of its
 * architecture (so sve, whose
 * tables are SVE float kernels, runs bfloat16 on neon_bf16's BFMMLA kernels on
 * a CPU that has both; on x86 no path below one without them has them). */
const fa_flash16_kernels *fa_flash16_current(void);
const fa_kernels_f64 *fa_kernels_f64_current(void);


#endif /* FASTATTN_KERNELS_H */

#else /* FA_KERNELS_TABLE: the table of element type FA_SFX:
       FA_CAT(fa_kernels, FA_SFX) -> fa_kernels_f32, fa_kernels_f64 */
#define FA_T FA_TYPE(FA_SFX)
typedef struct FA_CAT(fa_kernels, FA_SFX) {
    const char *isa;
    int64_t mr, nr, vw; /* register tile: mr query rows x nr keys; lanes */
    /* s[rows x ncols] = qp[rows x E] . kp^T; rows % mr == 0, ncols % nr == 0; */
    /* vmax NULL or [rows x vw]: each row's lane-wise max over its ncols */
    /* scores (NaN ignored), so max_j s[i][j] = max of vmax[i][0..vw) */
    void (*qk)(int64_t rows, int64_t ncols, int64_t E, const FA_T *qp,
               const FA_T *kp, FA_T *s, int64_t lds, FA_T *vmax);
    /* o[rows x ncols] += p[rows x nkeys] . vp[nkeys x ncols]; ncols % nr == 0 */
    void (*pv)(int64_t rows, int64_t nkeys, int64_t ncols, const FA_T *p,
               int64_t ldp, const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo);
    /* decoding (few rows, no packing): s[rows x nkeys] = qp . k^T, key j at */
    /* k + j*krs; o[rows x Ev] += p . v, value j at v + j*vrs, 0 weights skipped */
    void (*qk_direct)(int64_t rows, int64_t nkeys, int64_t E, const FA_T *qp,
                      const FA_T *k, int64_t krs, FA_T *s, int64_t lds);
    void (*pv_direct)(int64_t rows, int64_t nkeys, int64_t Ev, const FA_T *p,
                      int64_t ldp, const FA_T *v, int64_t vrs, FA_T *o, int64_t ldo);
    /* max of x[0..n) ignoring NaN (-inf if none); *has_nan |= any NaN */
    /* (has_nan may be NULL: no NaN detection) */
    FA_T (*rowmax)(const FA_T *x, int64_t n, int *has_nan);
    /* y[i] = exp(x[i] - m) for i < n (y may equal x); returns the sum */
    FA_T (*expsum)(const FA_T *x, FA_T *y, int64_t n, FA_T m);
    /* the same with y[i] = 2^(x[i] - m) (the streaming path's exp2) */
    FA_T (*expsum2)(const FA_T *x, FA_T *y, int64_t n, FA_T m);
    /* x[i] *= a for i < n */
    void (*scal)(FA_T *x, int64_t n, FA_T a);
    /* one key block of the streaming softmax, rows i < rows of s[rows x n]: */
    /* mn = max(m[i], max_j s[i][j]), a = E(m[i] - mn), s[i][j] = E(s[i][j] - mn),*/
    /* lv[i] = lv[i]*a + the vw lane sums of the s[i][j], o[i][0..ldo) *= a, */
    /* m[i] = mn; lv [rows x vw]: the row sums kept lane-wise across blocks; */
    /* E = 2^x if base2 (scores pre-multiplied by log2(e)), else e^x; mn = */
    /* -inf: row 0, lv[i] NaN if it holds a NaN; vmax NULL or qk's row maxima */
    void (*online_softmax)(int64_t rows, int64_t n, FA_T *s, int64_t lds, FA_T *m,
                           FA_T *lv, FA_T *o, int64_t ldo, int base2, const FA_T *vmax);
    /* l[i] = the sum of lv[i][0..vw) (online_softmax's lanes), i < rows */
    void (*lane_sums)(int64_t rows, const FA_T *lv, FA_T *l);
    /* kp[ncols/nr][E][nr] = keys j < nk at k + j*krs (unit column stride), */
    /* zero for nk <= j < ncols; ncols % nr == 0 */
    void (*pack_k)(int64_t nk, int64_t ncols, int64_t E, const FA_T *k, int64_t krs,
                   FA_T *kp);
    /* vp panel c (at vp + c*pstride) = [nk x nr] columns c*nr.. of the values */
    /* j < nk at v + j*vrs (unit column stride), zero past Ev, for the ldv/nr */
    /* panels; returns 1 if any value is NaN or +-Inf */
    int (*pack_v)(int64_t nk, int64_t Ev, int64_t ldv, const FA_T *v, int64_t vrs,
                  FA_T *vp, int64_t pstride);
    /* the FMA peak probe: n steps of FA_PROBE_CHAINS independent vector FMA */
    /* chains in registers (2 * vw * FA_PROBE_CHAINS * n flops); returns a */
    /* value that depends on every chain */
    FA_T (*fma_probe)(int64_t n);
    /* x[i] = cap * tanh(x[i] / cap) for i < n, cap > 0 (the soft cap of the */
    /* scores; tanh by simd/vmath_tmpl.h: +-inf -> +-cap, NaN stays NaN); */
    /* f, where not NULL: the cap's derivative f[i] = 1 - t * t, t = x[i] * */
    /* (1 / cap) of the capped x[i] (the backward's) */
    void (*softcap)(FA_T *x, FA_T *f, int64_t n, FA_T cap);
    /* the score options of one row, in one pass: x[j] = cap * tanh(x[j] / */
    /* cap) if cap > 0, then x[j] -= slope * |p - j| if slope != 0 (ALiBi, p */
    /* the row's position relative to the first key; p integral, |p| + n < */
    /* 2^24 (float) or 2^53 (double): exact distances), for j < n; vmax NULL */
    /* or [vw]: the lane-wise max of the results, NaN ignored (as qk's) */
    void (*score_row)(FA_T *x, int64_t n, FA_T cap, FA_T p, FA_T slope, FA_T *vmax);
    /* 16-bit storage (kernels_half_tmpl.h), read in float32: the same */
    /* contracts as pack_k, pack_v, qk_direct and pv_direct with the keys or */
    /* values (k, v) in float16 ([0]) or bfloat16 ([1]), index storage - */
    /* FA_FLOAT16, widened exactly as they are loaded; the packed panels, */
    /* queries, scores and outputs are float.  NULL in the f64 tables. */
    void (*pack_k_h[2])(int64_t nk, int64_t ncols, int64_t E, const uint16_t *k, int64_t krs,
                        float *kp);
    int (*pack_v_h[2])(int64_t nk, int64_t Ev, int64_t ldv, const uint16_t *v, int64_t vrs,
                       float *vp, int64_t pstride);
    void (*qk_direct_h[2])(int64_t rows, int64_t nkeys, int64_t E, const float *qp,
                           const uint16_t *k, int64_t krs, float *s, int64_t lds);
    void (*pv_direct_h[2])(int64_t rows, int64_t nkeys, int64_t Ev, const float *p,
                           int64_t ldp, const uint16_t *v, int64_t vrs, float *o, int64_t ldo);
    /* dst[i] = src[i] widened (exact); dst[i] = a * src[i] rounded to nearest */
    /* even (overflow to +-inf), for i < n */
    void (*widen_h[2])(const uint16_t *src, float *dst, int64_t n);
    void (*narrow_h[2])(const float *src, float a, uint16_t *dst, int64_t n);
    /* decoding over one key block through row pointers (fa_krows t): */
    /* s[rows x t->n] = qp . k^T (qp packed [rows x E]) and o[rows x Ev] += */
    /* p . v, zero weights skipped: the sums of qk_direct and pv_direct; qk_rows */
    /* prefetches the values' rows too.  [0]: rows of FA_T, [1] float16, [2] */
    /* bfloat16 widened exactly (NULL in the f64 tables) */
    void (*qk_rows[3])(int64_t rows, int64_t E, int64_t Ev, const FA_T *qp, const fa_krows *t,
                       FA_T *s, int64_t lds);
    void (*pv_rows[3])(int64_t rows, int64_t Ev, const FA_T *p, int64_t ldp, const fa_krows *t,
                       FA_T *o, int64_t ldo);
    /* bfloat16 rows (NULL but on the x86 bfloat16 tiers, and in the f64 */
    /* tables), for E % 32 == 0, E <= FA_FLASH16_MAX_E, Ev % 32 == 0, rows */
    /* <= FA_DIRECT_MAX_ROWS, p's rows readable up to FA_KC; each score and */
    /* output element summed in a fixed order, float32 accumulation: */
    /* qk_rows_dp16 s[i][j] = c (q_i . k_j), q float [rows x E] (the */
    /* queries passed unscaled), pv_rows_dp16 = pv_rows[2] (a zero weight's */
    /* key skipped); kernels/decode_dp16.h.  avx512_bf16: on VDPBF16PS, q */
    /* and the weights rounded to bfloat16 nearest even (exact for bfloat16 */
    /* queries; dp16_f32q 0); amx: the rows widened to float32, nothing */
    /* rounded (dp16_f32q 1: float32 queries exactly) */
    void (*qk_rows_dp16)(int64_t rows, int64_t E, int64_t Ev, FA_T c, const FA_T *q,
                         const fa_krows *t, FA_T *s, int64_t lds);
    void (*pv_rows_dp16)(int64_t rows, int64_t Ev, const FA_T *p, int64_t ldp, const fa_krows *t,
                         FA_T *o, int64_t ldo);
    int dp16_f32q;
#if !FA_IS_F64(FA_SFX)
    /* the 16-bit matrix path (kernels/flash16.h; its .pack_kv NULL on an */
    /* ISA without bfloat16 dot products), the test hook's native */
    /* instructions (NULL where none), the int8 KV cache's kernel (one */
    /* work item, kernels/decode_q8.h) and its quantiser (the rows of */
    /* fa_quantize_q8, already checked finite: kernels/quantize_q8_tmpl.h) */
    fa_flash16_kernels flash16;
    fa_bf16_op_fn native_op16;
    void (*decode_q8)(const struct fa_q8_item *it);
    void (*quantize_q8)(int64_t rows, int64_t n, const float *x, int64_t x_rs, int8_t *y,
                        int64_t y_rs, float *scale);
    fa_bw16_kernels bw16; /* the 16-bit backward's products (above) */
#endif
    /* o[rows x ncols] += pt^T . vp: pv with the weights transposed, pt */
    /* [nkeys x rows] (ld ldp), bitwise pv of the transpose (the backward's */
    /* dV += P^T dO and dK += dS^T Q from the P and dS tiles as Q.K^T */
    /* lays them out, queries on rows) */
    void (*pvt)(int64_t rows, int64_t nkeys, int64_t ncols, const FA_T *pt, int64_t ldp,
                const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo);
    /* one row of a backward pair: s[j] = P = exp(min(s[j], l) - l) */
    /* (expsum's values of the scores clamped to the row's lse l, finite: */
    /* P never above 1, NaN kept), ds[j] = P (ds[j] - d) (ds holding dP), */
    /* for j < n; without f returns 1 if some dS is NaN or +-Inf; with f */
    /* (a soft cap's factor) ds[j] = P (ds[j] - d) f[j] where P is not 0, */
    /* else exactly 0, and returns 0 */
    int (*grad_row)(FA_T *s, FA_T *ds, const FA_T *f, int64_t n, FA_T l, FA_T d);
} FA_CAT(fa_kernels, FA_SFX);
#undef FA_T
#endif
