/* paged_append.c -- rows written into paged KV caches (fa_paged_append,
 * fastattn.h): every check first (slots inside the pool, an int8 pool's
 * rows finite), then each token's rows converted once and stored at its
 * slot, tokens spread over the threads (each slot written by one token,
 * so the result is the same for any thread count). */
#include <string.h>

#include "fastattn.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/half.h"
#include "runtime/parallel.h"

static int64_t fa_append_size(int st)
{
    return st == FA_FLOAT64 ? 8 : st == FA_FLOAT32 ? 4 : st == FA_INT8 ? 1 : 2;
}

/* The type pairs written: a pool's own type copied; float32 rows into a
 * float16, bfloat16 or int8 pool. */
static int fa_append_types_ok(int src, int kv)
{
    if (kv == FA_FLOAT32 || kv == FA_FLOAT64) return src == kv;
    if (kv == FA_FLOAT16 || kv == FA_BFLOAT16) return src == kv || src == FA_FLOAT32;
    return kv == FA_INT8 && src == FA_FLOAT32;
}

static int fa_append_args_ok(const fa_paged_append_args *a)
{
    if (a->T < 0 || a->Hkv < 1 || a->E < 1 || a->Ev < 1 || a->num_blocks < 0 ||
        a->block_size < 1 || !fa_append_types_ok(a->src_storage, a->kv_storage))
        return 0;
    if (a->T == 0) return 1;
    if (!a->key || !a->value || !a->k || !a->v || !a->slots) return 0;
    if (a->kv_storage == FA_INT8 && (!a->k_scale || !a->v_scale)) return 0;
    const int64_t slots = a->num_blocks * a->block_size;
    for (int64_t t = 0; t < a->T; t++)
        if (a->slots[t] >= slots) return 0;
    return 1;
}

/* Every row an int8 pool would get is finite (fa_quantize_q8 could store it). */
static int fa_append_rows_finite(const fa_paged_append_args *a)
{
    const float *key = (const float *)a->key, *value = (const float *)a->value;
    for (int64_t t = 0; t < a->T; t++) {
        if (a->slots[t] < 0) continue;
        for (int64_t g = 0; g < a->Hkv; g++)
            if (!fa_all_finite_f32(key + t * a->key_ts + g * a->key_hs, a->E) ||
                !fa_all_finite_f32(value + t * a->value_ts + g * a->value_hs, a->Ev))
                return 0;
    }
    return 1;
}

/* A call and the kernels of the ISA in use that convert its rows, looked
 * up once. */
typedef struct fa_append_job {
    const fa_paged_append_args *a;
    const fa_kernels_f32 *K;
} fa_append_job;

/* One row of n elements from x (src type) to y (the pool's type kv); an
 * int8 row's scale to *scale (the rows already checked finite). */
static void fa_append_row(const fa_append_job *job, int64_t n, const void *x, void *y,
                          float *scale)
{
    const int src = job->a->src_storage, kv = job->a->kv_storage;
    if (src == kv)
        memcpy(y, x, (size_t)(n * fa_append_size(kv)));
    else if (kv == FA_INT8)
        job->K->quantize_q8(1, n, (const float *)x, n, (int8_t *)y, n, scale);
    else /* the vector narrowing: runtime/half.h's rounding */
        job->K->narrow_h[kv - FA_FLOAT16]((const float *)x, 1.0f, (uint16_t *)y, n);
}

/* Token t's key and value rows to their slot (nothing for a negative one). */
static void fa_append_token(void *ctx, int64_t t, int tid)
{
    const fa_append_job *job = (const fa_append_job *)ctx;
    const fa_paged_append_args *a = job->a;
    const int64_t s = a->slots[t], ssz = fa_append_size(a->src_storage);
    const int64_t dsz = fa_append_size(a->kv_storage);
    (void)tid;
    if (s < 0) return;
    const int64_t blk = s / a->block_size, off = s % a->block_size;
    const int q8 = a->kv_storage == FA_INT8;
    for (int64_t g = 0; g < a->Hkv; g++) {
        const char *kx = (const char *)a->key + (t * a->key_ts + g * a->key_hs) * ssz;
        const char *vx = (const char *)a->value + (t * a->value_ts + g * a->value_hs) * ssz;
        char *ky = (char *)a->k + (blk * a->k_bs + off * a->k_ps + g * a->k_hs) * dsz;
        char *vy = (char *)a->v + (blk * a->v_bs + off * a->v_ps + g * a->v_hs) * dsz;
        fa_append_row(job, a->E, kx, ky,
                      q8 ? a->k_scale + blk * a->ks_bs + off * a->ks_ps + g * a->ks_hs : NULL);
        fa_append_row(job, a->Ev, vx, vy,
                      q8 ? a->v_scale + blk * a->vs_bs + off * a->vs_ps + g * a->vs_hs : NULL);
    }
}

int fa_paged_append(const fa_paged_append_args *a)
{
    if (!a || !fa_append_args_ok(a)) return FA_EINVAL;
    if (a->T == 0) return FA_OK;
    if (a->kv_storage == FA_INT8 && !fa_append_rows_finite(a)) return FA_EINVAL;
    /* threads: a copy is cheap, so only for many rows (the elements moved
     * against FA_PARALLEL_MIN_WORK, the kernels' bound for a small call) */
    int nt = fa_resolve_threads(a->num_threads);
    if ((double)a->T * (double)a->Hkv * (double)(a->E + a->Ev) < 4.0 * FA_PARALLEL_MIN_WORK)
        nt = 1;
    if ((int64_t)nt > a->T) nt = (int)a->T;
    fa_append_job job = {a, fa_kernels_f32_current()};
    fa_parallel_for(nt, FA_SCHED_STATIC, a->T, fa_append_token, &job);
    return FA_OK;
}
