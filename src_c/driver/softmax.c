/* softmax.c -- masked, numerically stable softmax over rows, in place or
 * not, as scipy.special.softmax: subtract the row max, exponentiate, sum,
 * normalise.  Hidden entries (keep == 0) get exactly 0; a row with nothing
 * visible becomes 0.  Also fa_exp, the kernels' exp exposed for its tests. */
#include <math.h>
#include <string.h>

#include "blocking.h"
#include "common.h"
#include "fastattn.h"
#include "kernels.h"
#include "omp_shim.h"

#define FA_SOFTMAX_TMPL(FA_T, SFX, KCUR)                                                       \
    static void softmax_row_##SFX(const fa_kernels_##SFX *K, int64_t n, const FA_T *x,         \
                                  int64_t xcs, FA_T *y, int64_t ycs, const uint8_t *keep,      \
                                  int64_t kcs, FA_T *buf)                                      \
    {                                                                                          \
        if (!keep && xcs == 1 && ycs == 1) {                                                   \
            int has_nan = 0;                                                                   \
            FA_T m = K->rowmax(x, n, &has_nan);                                                \
            FA_T s = K->expsum(x, y, n, m);                                                    \
            K->scal(y, n, (FA_T)1 / s);                                                        \
            return;                                                                            \
        }                                                                                      \
        int64_t visible = 0;                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                      \
            int k = keep ? keep[j * kcs] != 0 : 1;                                             \
            buf[j] = k ? x[j * xcs] : (FA_T)-INFINITY;                                         \
            visible += k;                                                                      \
        }                                                                                      \
        if (visible == 0) {                                                                    \
            for (int64_t j = 0; j < n; j++) y[j * ycs] = 0;                                    \
            return;                                                                            \
        }                                                                                      \
        int has_nan = 0;                                                                       \
        FA_T m = K->rowmax(buf, n, &has_nan);                                                  \
        if (keep && m == (FA_T)-INFINITY && !has_nan) m = (FA_T)NAN; /* as scipy */           \
        FA_T s = K->expsum(buf, buf, n, m);                                                    \
        K->scal(buf, n, (FA_T)1 / s);                                                          \
        for (int64_t j = 0; j < n; j++)                                                        \
            y[j * ycs] = (keep && !keep[j * kcs]) ? (FA_T)0 : buf[j];                          \
    }                                                                                          \
    static int softmax_##SFX(int64_t nrows, int64_t n, const FA_T *x, int64_t xrs,             \
                             int64_t xcs, FA_T *y, int64_t yrs, int64_t ycs,                   \
                             const uint8_t *keep, int64_t krs, int64_t kcs, int nt)            \
    {                                                                                          \
        const fa_kernels_##SFX *K = KCUR();                                                    \
        if (nrows == 0 || n == 0) return FA_OK;                                                \
        if ((double)nrows * (double)n < 4 * FA_PARALLEL_MIN_WORK || nrows == 1) nt = 1;        \
        nt = fa_resolve_threads(nt);                                                           \
        if (nt > nrows) nt = (int)nrows;                                                       \
        int need_buf = keep || xcs != 1 || ycs != 1;                                           \
        FA_T **bufs = (FA_T **)fa_calloc((size_t)nt, sizeof(FA_T *));                          \
        if (!bufs) return FA_ENOMEM;                                                           \
        for (int t = 0; t < nt && need_buf; t++) {                                             \
            bufs[t] = (FA_T *)fa_malloc((size_t)n * sizeof(FA_T));                             \
            if (!bufs[t]) {                                                                    \
                for (int u = 0; u < t; u++) fa_free(bufs[u]);                                  \
                fa_free(bufs);                                                                 \
                return FA_ENOMEM;                                                              \
            }                                                                                  \
        }                                                                                      \
        if (nt > 1) {                                                                          \
            FA_OMP_PARALLEL_FOR_STATIC(nt)                                                     \
            for (int64_t r = 0; r < nrows; r++)                                                \
                softmax_row_##SFX(K, n, x + r * xrs, xcs, y + r * yrs, ycs,                    \
                                  keep ? keep + r * krs : NULL, kcs, bufs[FA_OMP_THREAD_NUM()]); \
        } else {                                                                               \
            for (int64_t r = 0; r < nrows; r++)                                                \
                softmax_row_##SFX(K, n, x + r * xrs, xcs, y + r * yrs, ycs,                    \
                                  keep ? keep + r * krs : NULL, kcs, bufs[0]);                 \
        }                                                                                      \
        for (int t = 0; t < nt; t++) fa_free(bufs[t]);                                         \
        fa_free(bufs);                                                                         \
        return FA_OK;                                                                          \
    }

#ifdef _OPENMP
#define FA_OMP_PARALLEL_FOR_STATIC(nt) _Pragma("omp parallel for schedule(static) num_threads(nt)")
#else
#define FA_OMP_PARALLEL_FOR_STATIC(nt)
#endif

FA_SOFTMAX_TMPL(float, f32, fa_kernels_f32_current)
FA_SOFTMAX_TMPL(double, f64, fa_kernels_f64_current)

int fa_softmax_rows(int dtype, int64_t nrows, int64_t n, const void *x, int64_t x_rs,
                    int64_t x_cs, void *y, int64_t y_rs, int64_t y_cs, const uint8_t *keep,
                    int64_t k_rs, int64_t k_cs, int num_threads)
{
    if (nrows < 0 || n < 0) return FA_EINVAL;
    if (dtype == FA_FLOAT32)
        return softmax_f32(nrows, n, (const float *)x, x_rs, x_cs, (float *)y, y_rs, y_cs, keep,
                           k_rs, k_cs, num_threads);
    if (dtype == FA_FLOAT64)
        return softmax_f64(nrows, n, (const double *)x, x_rs, x_cs, (double *)y, y_rs, y_cs,
                           keep, k_rs, k_cs, num_threads);
    return FA_EINVAL;
}

int fa_exp(int dtype, int base2, int64_t n, const void *x, void *y)
{
    if (n < 0) return FA_EINVAL;
    if (dtype == FA_FLOAT32) {
        const fa_kernels_f32 *K = fa_kernels_f32_current();
        (void)(base2 ? K->expsum2 : K->expsum)((const float *)x, (float *)y, n, 0.0f);
        return FA_OK;
    }
    if (dtype == FA_FLOAT64) {
        const fa_kernels_f64 *K = fa_kernels_f64_current();
        (void)(base2 ? K->expsum2 : K->expsum)((const double *)x, (double *)y, n, 0.0);
        return FA_OK;
    }
    return FA_EINVAL;
}
