/* decode_q8.c -- the int8 KV cache's entry points (fastattn.h):
 * fa_decode_q8 (checks, the per-thread scratch, the (batch, kv head) work
 * items over the threads, each computed by the decode_q8 kernel of the ISA
 * in use, kernels/decode_q8_tmpl.h) and fa_quantize_q8 (the rows appended
 * to the cache: checked here, quantised by the quantize_q8 kernel of the
 * ISA in use, kernels/quantize_q8_tmpl.h). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "fastattn.h"
#include "kernels/decode_q8.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"

typedef void (*fa_q8_kernel)(const fa_q8_item *it);

typedef struct fa_q8_job {
    const fa_decode_q8_args *a;
    fa_q8_kernel kernel;
    float *scratch; /* per thread: fa_q8_scratch_floats(Ev) floats */
} fa_q8_job;

/* Work item w = b * Hkv + h: the G * L query rows of kv head h in batch b. */
static void fa_q8_run_item(void *ctx, int64_t w, int tid)
{
    const fa_q8_job *job = (const fa_q8_job *)ctx;
    const fa_decode_q8_args *a = job->a;
    const int64_t b = w / a->Hkv, h = w % a->Hkv, G = a->Hq / a->Hkv, hq = h * G;
    fa_q8_item it;
    memset(&it, 0, sizeof it); /* no block table, no key split */
    it.rows = G * a->L;
    it.L = a->L;
    it.S = a->S;
    it.E = a->E;
    it.Ev = a->Ev;
    it.q = a->q + b * a->q_bs + hq * a->q_hs;
    it.q_hs = a->q_hs;
    it.q_rs = a->q_rs;
    it.k = a->k + b * a->k_bs + h * a->k_hs;
    it.v = a->v + b * a->v_bs + h * a->v_hs;
    it.k_rs = a->k_rs;
    it.v_rs = a->v_rs;
    it.k_scale = a->k_scale + b * a->ks_bs + h * a->ks_hs;
    it.v_scale = a->v_scale + b * a->vs_bs + h * a->vs_hs;
    it.ks_rs = it.vs_rs = 1;
    it.out = a->out + b * a->o_bs + hq * a->o_hs;
    it.o_hs = a->o_hs;
    it.o_rs = a->o_rs;
    it.lse = a->lse ? a->lse + (b * a->Hq + hq) * a->L : NULL;
    it.lse_hs = a->L;
    it.pad = a->pad ? a->pad + b * a->S : NULL;
    it.scale = (float)a->scale;
    it.softcap = (float)a->softcap;
    it.alibi = a->alibi ? a->alibi + b * a->Hq + hq : NULL;
    it.sinks = a->sinks ? a->sinks + b * a->Hq + hq : NULL;
    it.causal = a->causal;
    it.causal_offset = a->causal_offset;
    it.win_left = a->win_left;
    it.win_right = a->win_right;
    it.scratch = job->scratch + (int64_t)tid * fa_q8_scratch_floats(a->Ev);
    job->kernel(&it);
}

static int fa_q8_args_ok(const fa_decode_q8_args *a)
{
    if (a->B < 0 || a->Hq < 1 || a->Hkv < 1 || a->Hq % a->Hkv != 0 || a->L < 0 || a->S < 0 ||
        a->E < 1 || a->Ev < 1 || a->win_left < 0 || a->win_right < 0 ||
        !isfinite(a->scale) || !(a->softcap <= 0 || isfinite(a->softcap)))
        return 0;
    if (a->B * a->L == 0) return 1; /* nothing to read or write */
    return a->q && a->out && (a->S == 0 || (a->k && a->v && a->k_scale && a->v_scale));
}

int fa_decode_q8(const fa_decode_q8_args *a)
{
    if (!fa_q8_args_ok(a)) return FA_EINVAL;
    const int64_t items = a->B * a->Hkv;
    if (items == 0 || a->L == 0) return FA_OK;
    const fa_q8_kernel kernel = fa_kernels_f32_current()->decode_q8;
    if (!kernel) return FA_EINVAL;
    /* threads: at most one per item, one for a small problem (the FLOP
     * count of Q.K^T and P.V) */
    int nt = fa_resolve_threads(a->num_threads);
    const double work = (double)a->B * (double)a->Hq * (double)a->L * (double)a->S *
                        (double)(a->E + a->Ev);
    if (work < FA_PARALLEL_MIN_WORK) nt = 1;
    if (nt > items) nt = (int)items;
    if (nt < 1) nt = 1;
    /* every allocation before any output is written */
    fa_q8_job job = {a, kernel, NULL};
    job.scratch = (float *)fa_malloc((size_t)nt * (size_t)fa_q8_scratch_floats(a->Ev) *
                                     sizeof(float));
    if (!job.scratch) return FA_ENOMEM;
    fa_parallel_for(nt, FA_SCHED_DYNAMIC, items, fa_q8_run_item, &job);
    fa_free(job.scratch);
    return FA_OK;
}

int fa_quantize_q8(int64_t rows, int64_t n, const float *x, int64_t x_rs, int8_t *y,
                   int64_t y_rs, float *scale)
{
    if (rows < 0 || n < 0 || (rows > 0 && n > 0 && (!x || !y || !scale))) return FA_EINVAL;
    for (int64_t r = 0; r < rows; r++) /* nothing written unless all is finite */
        if (!fa_all_finite_f32(x + r * x_rs, n)) return FA_EINVAL;
    if (rows > 0) fa_kernels_f32_current()->quantize_q8(rows, n, x, x_rs, y, y_rs, scale);
    return FA_OK;
}
