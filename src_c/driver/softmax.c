/* softmax.c -- masked, numerically stable softmax over rows, in place or
 * not, as scipy.special.softmax: subtract the row max, exponentiate, sum,
 * normalise.  Hidden entries (keep == 0) get exactly 0; a row with nothing
 * visible becomes 0.  Also fa_exp and fa_tanh, the kernels' exp and tanh
 * exposed for their tests. */
#include <math.h>
#include <string.h>

#include "fastattn.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

#define FA_SFX f32
#include "driver/softmax_tmpl.h" /* softmax_f32 */
#undef FA_SFX
#define FA_SFX f64
#include "driver/softmax_tmpl.h" /* softmax_f64 */
#undef FA_SFX

int fa_softmax_rows(int dtype, int64_t nrows, int64_t n, const void *x, int64_t x_rs,
                    int64_t x_cs, void *y, int64_t y_rs, int64_t y_cs, const uint8_t *keep,
                    int64_t k_rs, int64_t k_cs, int num_threads)
{
    if (nrows < 0 || n < 0) return FA_EINVAL;
    if (dtype == FA_FLOAT32 || dtype == FA_FLOAT16 || dtype == FA_BFLOAT16)
        return softmax_f32(nrows, n, x, x_rs, x_cs, y, y_rs, y_cs, dtype, keep, k_rs, k_cs,
                           num_threads);
    if (dtype == FA_FLOAT64)
        return softmax_f64(nrows, n, x, x_rs, x_cs, y, y_rs, y_cs, dtype, keep, k_rs, k_cs,
                           num_threads);
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

int fa_tanh(int dtype, int64_t n, const void *x, void *y)
{
    if (n < 0) return FA_EINVAL;
    const size_t size = dtype == FA_FLOAT64 ? sizeof(double) : sizeof(float);
    if (dtype != FA_FLOAT32 && dtype != FA_FLOAT64) return FA_EINVAL;
    if (x != y && n > 0) memmove(y, x, (size_t)n * size);
    if (dtype == FA_FLOAT32)
        fa_kernels_f32_current()->softcap((float *)y, NULL, n, 1.0f);
    else
        fa_kernels_f64_current()->softcap((double *)y, NULL, n, 1.0);
    return FA_OK;
}
