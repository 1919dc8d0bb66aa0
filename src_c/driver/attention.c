/* attention.c -- the attention entry points: fa_attention (the drivers of
 * attention_tmpl.h, once per element type: work split over the threads,
 * per-thread scratch, the streaming loop and the weights path) and the FMA
 * probe's thread team.  The arithmetic goes through the micro-kernel table
 * of the ISA in use. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/flash16.h"
#include "driver/mask_summary.h"
#include "driver/offsets.h"
#include "driver/scratch.h"
#include "driver/window.h"
#include "fastattn.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

#define FA_SFX f32
#include "driver/attention_tmpl.h" /* attention_f32 */
#undef FA_SFX
#define FA_SFX f64
#include "driver/attention_tmpl.h" /* attention_f64 */
#undef FA_SFX

int fa_attention(const fa_attention_args *a)
{
    if (a->nbatch_dims < 0 || a->nbatch_dims > FA_MAX_BATCH_DIMS || a->L < 0 || a->S < 0 ||
        a->E < 0 || a->Ev < 0 || a->win_left < 0 || a->win_right < 0 ||
        !(a->softcap <= 0 || isfinite(a->softcap)))
        return FA_EINVAL;
    const int half = a->storage == FA_FLOAT16 || a->storage == FA_BFLOAT16;
    const int kv_half = a->kv_storage == FA_FLOAT16 || a->kv_storage == FA_BFLOAT16;
    if ((a->storage != a->dtype && !(a->dtype == FA_FLOAT32 && half)) ||
        (a->kv_storage != a->storage && !(a->storage == FA_FLOAT32 && kv_half)))
        return FA_EINVAL;
    if (half) {
        /* the 16-bit matrix driver, where the ISA in use has one and the
         * call is one it takes (flash16.h) */
        const int rc = fa_flash16(a);
        if (rc != FA_FLASH16_DECLINED) return rc;
    }
    if (a->dtype == FA_FLOAT32) return attention_f32(a);
    if (a->dtype == FA_FLOAT64) return attention_f64(a);
    return FA_EINVAL;
}

typedef struct fa_probe_job {
    int dtype;
    int64_t n;
} fa_probe_job;

static void fa_probe_thread(void *ctx)
{
    const fa_probe_job *j = (const fa_probe_job *)ctx;
    if (j->dtype == FA_FLOAT32)
        (void)fa_kernels_f32_current()->fma_probe(j->n);
    else
        (void)fa_kernels_f64_current()->fma_probe(j->n);
}

int fa_fma_probe(int dtype, int64_t n, int num_threads, double *flops)
{
    if (n < 0 || (dtype != FA_FLOAT32 && dtype != FA_FLOAT64)) return FA_EINVAL;
    const int nt = fa_resolve_threads(num_threads);
    const int64_t per = dtype == FA_FLOAT32
                            ? 2 * fa_kernels_f32_current()->vw * FA_PROBE_CHAINS
                            : 2 * fa_kernels_f64_current()->vw * FA_PROBE_CHAINS;
    fa_probe_job job = {dtype, n};
    const int team = fa_parallel_team(nt, fa_probe_thread, &job); /* the threads it got */
    *flops = (double)team * (double)n * (double)per;
    return FA_OK;
}

/* The read-bandwidth probe: nt threads each read one slice of p (8-byte
 * words) as four sequential streams side by side (as a decoding step reads
 * its keys and values), OR chains the compiler vectorises; *sink gets a
 * value that depends on every word. */
typedef struct fa_read_job {
    const uint64_t *p;
    int64_t n, nt;
    uint64_t *acc; /* per slice */
} fa_read_job;

static void fa_read_slice(void *ctx, int64_t s, int tid)
{
    (void)tid;
    const fa_read_job *j = (const fa_read_job *)ctx;
    const int64_t lo = j->n * s / j->nt, hi = j->n * (s + 1) / j->nt, q = (hi - lo) / 4;
    const uint64_t *p0 = j->p + lo, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int64_t i = 0; i < q; i++) {
        a0 |= p0[i];
        a1 |= p1[i];
        a2 |= p2[i];
        a3 |= p3[i];
    }
    for (int64_t i = lo + 4 * q; i < hi; i++) a0 |= j->p[i];
    j->acc[s] = a0 | a1 | a2 | a3;
}

int fa_read_probe(const void *p, int64_t nbytes, int num_threads, uint64_t *sink)
{
    if (nbytes < 0 || (nbytes > 0 && p == NULL)) return FA_EINVAL;
    uint64_t acc[256] = {0};
    int nt = fa_resolve_threads(num_threads);
    if (nt > 256) nt = 256;
    fa_read_job job = {(const uint64_t *)p, nbytes / 8, nt, acc};
    fa_parallel_for(nt, FA_SCHED_STATIC, nt, fa_read_slice, &job);
    uint64_t r = 0;
    for (int s = 0; s < nt; s++) r |= acc[s];
    *sink = r;
    return FA_OK;
}
