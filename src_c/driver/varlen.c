/* varlen.c -- packed sequences in one call (fa_attention_varlen and its
 * backward): each sequence is the call of its own problem (fa_attention,
 * fa_attention_backward, with every driver and ISA path behind them), and
 * this file only decides where each runs.
 *
 * A sequence whose work is more than half a thread's fair share of the
 * call's runs alone on every thread, one after the other, longest first
 * (there are at most 2 nt of them); the others run side by side in ONE
 * parallel region, one thread each, longest first (dynamic schedule), so
 * that a batch of short sequences costs one fork and join instead of one
 * per sequence, and no thread idles inside a call too small to split.  The
 * longest-first greedy order leaves the region at most one sequence (<=
 * half a fair share) past the ideal.  A call's bits never depend on its
 * thread count, so neither do the packed results. */
#include <stdlib.h>

#include "driver/bw_scheme.h"
#include "driver/offsets.h"
#include "driver/window.h"
#include "fastattn.h"
#include "runtime/alloc.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

/* sum over i < L of clamp(i + c, 0, S) (L, S >= 0) */
static int64_t fa_clamped_rows(int64_t L, int64_t c, int64_t S)
{
    c = c < -L ? -L : c > S ? S : c; /* a further c changes no term */
    const int64_t a = c < 0 ? -c : 0;                 /* first i with i + c >= 0 */
    const int64_t b = fa_min64(L, S - c > a ? S - c : a); /* first i with i + c >= S */
    return (b - a) * c + (a + b - 1) * (b - a) / 2 + (L - b) * S;
}

/* The query-key pairs that L rows see of S keys within the limits w
 * (window.h: row i sees keys i + lo <= j <= i + hi). */
static int64_t fa_visible_pairs(const fa_limits *w, int64_t L, int64_t S)
{
    const int64_t hi = w->has_hi ? fa_clamped_rows(L, w->hi + 1, S) : L * S;
    return w->has_lo ? hi - fa_clamped_rows(L, w->lo, S) : hi;
}

/* Row `row` of an operand of the given storage; its `b`th sequence's part
 * (float64, ss apart); NULL for an absent operand. */
static const void *fa_rows_at(const fa_operand *op, int64_t row, int storage)
{
    return op->data ? (const char *)op->data + row * op->rs * fa_storage_bytes(storage) : NULL;
}

static const void *fa_seq_at(const fa_operand *op, int64_t b, int64_t ss)
{
    return op->data ? (const double *)op->data + b * ss : NULL;
}

/* A forward problem of one query row whose grouped query heads (batch
 * (Hkv, g), keys and values broadcast over g) differ by their queries
 * alone (no ALiBi, no sinks) as one problem per key head with the g heads
 * as its rows, against the keys the row sees (its causal bound and window
 * then bound nothing): each key row read once for the group, as
 * fastattn/_gqa.py folds a decoding step.  Left as it is when the row sees
 * no key. */
static void fa_fold_group(fa_attention_args *a)
{
    if (a->L != 1 || a->nbatch_dims != 2 || a->batch_shape[1] < 2 || a->alibi.data ||
        a->sinks.data || a->k.bstride[1] != 0 || a->v.bstride[1] != 0)
        return;
    const fa_limits w = fa_limits_of(a);
    int64_t lo, hi;
    fa_limits_keys(&w, 0, 1, a->S, &lo, &hi);
    if (lo >= hi) return;
    fa_operand *rows[3] = {&a->q, &a->out, &a->lse};
    for (int i = 0; i < 3; i++) rows[i]->rs = rows[i]->bstride[1]; /* the g heads as rows */
    a->L = a->batch_shape[1];
    a->nbatch_dims = 1;
    a->k.data = fa_rows_at(&a->k, lo, a->kv_storage);
    a->v.data = fa_rows_at(&a->v, lo, a->kv_storage);
    a->S = hi - lo;
    a->causal = 0, a->causal_offset = 0;
    a->win_left = a->win_right = FA_UNBOUNDED;
}

/* Sequence b's own problem (fastattn.h: fa_varlen_args); the forward's
 * operands alone unless backward. */
static void fa_varlen_seq(const fa_varlen_args *v, int64_t b, int backward, fa_backward_args *g)
{
    const fa_backward_args *t = &v->t;
    const int64_t r0 = v->cu_q[b], k0 = v->cu_k[b];
    const int st = t->fwd.storage, kst = t->fwd.kv_storage, dt = t->fwd.dtype;
    fa_attention_args *a = &g->fwd;
    *a = t->fwd;
    a->L = v->cu_q[b + 1] - r0;
    a->S = v->cu_k[b + 1] - k0;
    if (v->lower_right) a->causal_offset = a->S - a->L;
    a->q.data = fa_rows_at(&t->fwd.q, r0, st);
    a->out.data = fa_rows_at(&t->fwd.out, r0, st);
    a->lse.data = fa_rows_at(&t->fwd.lse, r0, dt);
    a->k.data = fa_rows_at(&t->fwd.k, k0, kst);
    a->v.data = fa_rows_at(&t->fwd.v, k0, kst);
    a->alibi.data = fa_seq_at(&t->fwd.alibi, b, v->alibi_ss);
    a->sinks.data = fa_seq_at(&t->fwd.sinks, b, v->sinks_ss);
    if (!backward) {
        fa_fold_group(a);
        return;
    }
    g->dout = t->dout, g->glse = t->glse, g->dq = t->dq, g->dk = t->dk, g->dv = t->dv;
    g->dsinks = t->dsinks, g->grad_storage = t->grad_storage;
    g->dmask.data = NULL; /* refused by fa_varlen_check */
    g->dout.data = fa_rows_at(&t->dout, r0, st);
    g->glse.data = fa_rows_at(&t->glse, r0, dt);
    g->dq.data = fa_rows_at(&t->dq, r0, t->grad_storage);
    g->dk.data = fa_rows_at(&t->dk, k0, t->grad_storage);
    g->dv.data = fa_rows_at(&t->dv, k0, t->grad_storage);
    g->dsinks.data = fa_seq_at(&t->dsinks, b, v->dsinks_ss);
}

/* One sequence to run: its index and its work (visible pairs plus its rows
 * and keys, for the order). */
typedef struct fa_varlen_job {
    int64_t b, work;
} fa_varlen_job;

static int fa_varlen_longest_first(const void *x, const void *y)
{
    const fa_varlen_job *p = (const fa_varlen_job *)x, *q = (const fa_varlen_job *)y;
    if (p->work != q->work) return p->work > q->work ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

typedef struct fa_varlen_run {
    const fa_varlen_args *v;
    const fa_varlen_job *jobs; /* the side-by-side ones */
    int backward;
    int *rc; /* per sequence */
} fa_varlen_run;

static void fa_varlen_call(const fa_varlen_run *r, int64_t b, int nt)
{
    fa_backward_args g;
    fa_varlen_seq(r->v, b, r->backward, &g);
    g.fwd.num_threads = nt;
    r->rc[b] = r->backward ? fa_attention_backward(&g) : fa_attention(&g.fwd);
}

static void fa_varlen_item(void *ctx, int64_t i, int tid)
{
    (void)tid;
    const fa_varlen_run *r = (const fa_varlen_run *)ctx;
    fa_varlen_call(r, r->jobs[i].b, 1);
}

static int fa_varlen_check(const fa_varlen_args *v, int backward)
{
    const fa_attention_args *a = &v->t.fwd;
    if (v->n < 0 || !v->cu_q || !v->cu_k || v->cu_q[0] != 0 || v->cu_k[0] != 0 ||
        v->cu_q[v->n] != a->L || v->cu_k[v->n] != a->S || a->bool_mask.data ||
        a->add_mask.data || a->pad.data || a->weights || v->t.dmask.data ||
        (backward && a->L > 0 && a->S > 0 && fa_bw_group(&v->t) < 1))
        return FA_EINVAL;
    for (int64_t b = 0; b < v->n; b++)
        if (v->cu_q[b + 1] < v->cu_q[b] || v->cu_k[b + 1] < v->cu_k[b]) return FA_EINVAL;
    return FA_OK;
}

/* The sequences to run, longest first, into jobs (*njobs of them); returns
 * how many lead: the wide ones, each to run on all nt threads. */
static int64_t fa_varlen_plan(const fa_varlen_args *v, int backward, int nt, fa_varlen_job *jobs,
                              int64_t *njobs)
{
    const fa_attention_args *a = &v->t.fwd;
    int64_t n = 0, total = 0;
    for (int64_t b = 0; b < v->n; b++) {
        const int64_t L = v->cu_q[b + 1] - v->cu_q[b], S = v->cu_k[b + 1] - v->cu_k[b];
        if (L == 0 || (backward && S == 0)) continue;
        jobs[n].b = b;
        const int64_t off = v->lower_right ? S - L : a->causal_offset;
        const fa_limits w = fa_limits_at(a->causal, off, a->win_left, a->win_right, L, S);
        jobs[n].work = fa_visible_pairs(&w, L, S) + L + S;
        total += jobs[n++].work;
    }
    qsort(jobs, (size_t)n, sizeof *jobs, fa_varlen_longest_first);
    int64_t wide = 0;
    while (nt > 1 && wide < n && (double)jobs[wide].work * 2.0 * nt > (double)total) wide++;
    *njobs = n;
    return wide;
}

static int fa_varlen_run_all(const fa_varlen_args *v, int backward)
{
    int rc = fa_varlen_check(v, backward);
    if (rc != FA_OK || v->n == 0) return rc;
    fa_varlen_job *jobs = (fa_varlen_job *)fa_malloc((size_t)v->n * sizeof *jobs);
    int *st = (int *)fa_calloc((size_t)v->n, sizeof *st);
    if (!jobs || !st) {
        fa_free(jobs);
        fa_free(st);
        return FA_ENOMEM;
    }
    const int nt = fa_resolve_threads(v->t.fwd.num_threads);
    int64_t njobs;
    const int64_t wide = fa_varlen_plan(v, backward, nt, jobs, &njobs);
    fa_varlen_run r = {v, jobs + wide, backward, st};
    for (int64_t i = 0; i < wide; i++) fa_varlen_call(&r, jobs[i].b, nt);
    const int64_t side = njobs - wide;
    fa_parallel_for(nt < side ? nt : (int)side, FA_SCHED_DYNAMIC, side, fa_varlen_item, &r);
    for (int64_t b = 0; b < v->n && rc == FA_OK; b++) rc = st[b]; /* the first, in order */
    fa_free(jobs);
    fa_free(st);
    return rc;
}

int fa_attention_varlen(const fa_varlen_args *v) { return fa_varlen_run_all(v, 0); }

int fa_attention_backward_varlen(const fa_varlen_args *v) { return fa_varlen_run_all(v, 1); }
