/* kernels.h -- the micro-kernel contract, one table per element type.
 *
 * Each ISA (kernels_generic.c, kernels_avx2.c, kernels_avx512.c) fills one
 * fa_kernels_f32 and one fa_kernels_f64 with the same functions; dispatch.c
 * picks the table once (cpuid + xgetbv, or FASTATTN_ISA) and the drivers in
 * attention.c and softmax.c call through it.  Nothing here allocates.
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
 */
#ifndef FASTATTN_KERNELS_H
#define FASTATTN_KERNELS_H

#include <stdint.h>

#define FA_DECLARE_KERNEL_TABLE(T, SFX)                                              \
    typedef struct fa_kernels_##SFX {                                                \
        const char *isa;                                                             \
        int64_t mr, nr, vw; /* register tile: mr query rows x nr keys; lanes */      \
        /* s[rows x ncols] = qp[rows x E] . kp^T; rows % mr == 0, ncols % nr == 0; */\
        /* vmax NULL or [rows x vw]: each row's lane-wise max over its ncols */     \
        /* scores (NaN ignored), so max_j s[i][j] = max of vmax[i][0..vw) */         \
        void (*qk)(int64_t rows, int64_t ncols, int64_t E, const T *qp,              \
                   const T *kp, T *s, int64_t lds, T *vmax);                         \
        /* o[rows x ncols] += p[rows x nkeys] . vp[nkeys x ncols]; ncols % nr == 0 */\
        void (*pv)(int64_t rows, int64_t nkeys, int64_t ncols, const T *p,           \
                   int64_t ldp, const T *vp, int64_t pstride, T *o, int64_t ldo);    \
        /* decoding (few rows, no packing): s[rows x nkeys] = qp . k^T, key j at */  \
        /* k + j*krs; o[rows x Ev] += p . v, value j at v + j*vrs, 0 weights skipped */\
        void (*qk_direct)(int64_t rows, int64_t nkeys, int64_t E, const T *qp,       \
                          const T *k, int64_t krs, T *s, int64_t lds);               \
        void (*pv_direct)(int64_t rows, int64_t nkeys, int64_t Ev, const T *p,       \
                          int64_t ldp, const T *v, int64_t vrs, T *o, int64_t ldo);  \
        /* max of x[0..n) ignoring NaN (-inf if none); *has_nan |= any NaN */        \
        /* (has_nan may be NULL: no NaN detection) */                                \
        T (*rowmax)(const T *x, int64_t n, int *has_nan);                            \
        /* y[i] = exp(x[i] - m) for i < n (y may equal x); returns the sum */        \
        T (*expsum)(const T *x, T *y, int64_t n, T m);                               \
        /* the same with y[i] = 2^(x[i] - m) (the streaming path's exp2) */          \
        T (*expsum2)(const T *x, T *y, int64_t n, T m);                              \
        /* x[i] *= a for i < n */                                                    \
        void (*scal)(T *x, int64_t n, T a);                                          \
        /* one key block of the streaming softmax, rows i < rows of s[rows x n]: */  \
        /* mn = max(m[i], max_j s[i][j]), a = E(m[i] - mn), s[i][j] = E(s[i][j] - mn),*/\
        /* l[i] = l[i]*a + sum_j s[i][j], o[i][0..ldo) *= a, m[i] = mn; E = 2^x if */ \
        /* base2 (scores pre-multiplied by log2(e)), else e^x; mn = -inf: row 0, */  \
        /* l[i] = NaN if it holds a NaN; vmax NULL or qk's row maxima of s */         \
        void (*online_softmax)(int64_t rows, int64_t n, T *s, int64_t lds, T *m,     \
                               T *l, T *o, int64_t ldo, int base2, const T *vmax);   \
        /* kp[ncols/nr][E][nr] = keys j < nk at k + j*krs (unit column stride), */   \
        /* zero for nk <= j < ncols; ncols % nr == 0 */                              \
        void (*pack_k)(int64_t nk, int64_t ncols, int64_t E, const T *k, int64_t krs,\
                       T *kp);                                                       \
        /* vp panel c (at vp + c*pstride) = [nk x nr] columns c*nr.. of the values */\
        /* j < nk at v + j*vrs (unit column stride), zero past Ev, for the ldv/nr */ \
        /* panels; returns 1 if any value is NaN or +-Inf */                         \
        int (*pack_v)(int64_t nk, int64_t Ev, int64_t ldv, const T *v, int64_t vrs,  \
                      T *vp, int64_t pstride);                                       \
        /* the FMA peak probe: n steps of FA_PROBE_CHAINS independent vector FMA */  \
        /* chains in registers (2 * vw * FA_PROBE_CHAINS * n flops); returns a */    \
        /* value that depends on every chain */                                      \
        T (*fma_probe)(int64_t n);                                                   \
    } fa_kernels_##SFX;

FA_DECLARE_KERNEL_TABLE(float, f32)
FA_DECLARE_KERNEL_TABLE(double, f64)

extern const fa_kernels_f32 fa_kernels_f32_generic, fa_kernels_f32_avx2, fa_kernels_f32_avx512;
extern const fa_kernels_f64 fa_kernels_f64_generic, fa_kernels_f64_avx2, fa_kernels_f64_avx512;

/* The tables in use, set by fa_select_isa() in dispatch.c. */
const fa_kernels_f32 *fa_kernels_f32_current(void);
const fa_kernels_f64 *fa_kernels_f64_current(void);

#endif
