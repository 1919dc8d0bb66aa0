/* softmax_tmpl.h -- masked, stable softmax over rows, written once over the
 * element type: included twice by softmax.c with FA_SFX (f32, f64) defined.
 * FN(softmax) -> softmax_f32, softmax_f64; likewise softmax_row,
 * softmax_item, fa_softmax_job. */
#define FN(name) FA_CAT(name, FA_SFX)
#define FA_T FA_TYPE(FA_SFX)                      /* float, double */
#define KT FA_CAT(fa_kernels, FA_SFX)             /* fa_kernels_f32, _f64 */
#define KCUR FA_CAT3(fa_kernels, FA_SFX, current) /* fa_kernels_f32_current */

#include "driver/storage_tmpl.h" /* FN(ld), FN(st): elements of any storage type */

/* One row: x and y of storage type st (FA_T, or 16-bit widened into buf and
 * rounded once when written). */
static void FN(softmax_row)(const KT *K, int64_t n, const void *xv, int64_t xcs, void *yv,
                            int64_t ycs, int st, const uint8_t *keep, int64_t kcs, FA_T *buf)
{
    const int native = st == FA_FLOAT32 || st == FA_FLOAT64;
    if (!keep && xcs == 1 && ycs == 1 && native) {
        const FA_T *x = (const FA_T *)xv;
        FA_T *y = (FA_T *)yv;
        int has_nan = 0;
        FA_T m = K->rowmax(x, n, &has_nan);
        FA_T s = K->expsum(x, y, n, m);
        K->scal(y, n, (FA_T)1 / s);
        return;
    }
    int64_t visible = 0;
    for (int64_t j = 0; j < n; j++) {
        int k = keep ? keep[j * kcs] != 0 : 1;
        buf[j] = k ? FN(ld)(xv, j * xcs, st) : (FA_T)-INFINITY;
        visible += k;
    }
    if (visible == 0) {
        for (int64_t j = 0; j < n; j++) FN(st)(yv, j * ycs, st, 0);
        return;
    }
    int has_nan = 0;
    FA_T m = K->rowmax(buf, n, &has_nan);
    if (keep && m == (FA_T)-INFINITY && !has_nan) m = (FA_T)NAN; /* as scipy */
    FA_T s = K->expsum(buf, buf, n, m);
    K->scal(buf, n, (FA_T)1 / s);
    for (int64_t j = 0; j < n; j++)
        FN(st)(yv, j * ycs, st, (keep && !keep[j * kcs]) ? (FA_T)0 : buf[j]);
}

/* One call, shared read-only by the threads. */
typedef struct FN(fa_softmax_job) {
    const KT *K;
    int64_t n;
    const char *x; /* bytes: elements of size esize */
    int64_t xrs, xcs;
    char *y;
    int64_t yrs, ycs;
    int st;
    int64_t esize;
    const uint8_t *keep;
    int64_t krs, kcs;
    FA_T **bufs; /* per thread: n elements, or NULL where no row needs one */
} FN(fa_softmax_job);

static void FN(softmax_item)(void *ctx, int64_t r, int tid)
{
    const FN(fa_softmax_job) *j = (const FN(fa_softmax_job) *)ctx;
    FN(softmax_row)(j->K, j->n, j->x + r * j->xrs * j->esize, j->xcs,
                    j->y + r * j->yrs * j->esize, j->ycs, j->st,
                    j->keep ? j->keep + r * j->krs : NULL, j->kcs, j->bufs[tid]);
}

/* st: the storage type of x and y (FA_T's, or 16-bit with FA_T float) */
static int FN(softmax)(int64_t nrows, int64_t n, const void *x, int64_t xrs, int64_t xcs,
                       void *y, int64_t yrs, int64_t ycs, int st, const uint8_t *keep,
                       int64_t krs, int64_t kcs, int nt)
{
    const int64_t esize = st == FA_FLOAT16 || st == FA_BFLOAT16 ? 2 : (int64_t)sizeof(FA_T);
    FN(fa_softmax_job) job = {KCUR(), n, (const char *)x, xrs, xcs, (char *)y, yrs, ycs,
                              st, esize, keep, krs, kcs, NULL};
    if (nrows == 0 || n == 0) return FA_OK;
    if ((double)nrows * (double)n < 4 * FA_PARALLEL_MIN_WORK || nrows == 1) nt = 1;
    nt = fa_resolve_threads(nt);
    if (nt > nrows) nt = (int)nrows;
    const int need_buf = keep || xcs != 1 || ycs != 1 || esize == 2;
    job.bufs = (FA_T **)fa_calloc((size_t)nt, sizeof(FA_T *));
    if (!job.bufs) return FA_ENOMEM;
    for (int t = 0; t < nt && need_buf; t++) {
        job.bufs[t] = (FA_T *)fa_malloc((size_t)n * sizeof(FA_T));
        if (!job.bufs[t]) {
            for (int u = 0; u < t; u++) fa_free(job.bufs[u]);
            fa_free(job.bufs);
            return FA_ENOMEM;
        }
    }
    fa_parallel_for(nt, FA_SCHED_STATIC, nrows, FN(softmax_item), &job);
    for (int t = 0; t < nt; t++) fa_free(job.bufs[t]);
    fa_free(job.bufs);
    return FA_OK;
}

#undef FN
#undef FA_T
#undef KT
#undef KCUR
