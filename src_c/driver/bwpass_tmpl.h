/* bwpass_tmpl.h -- the work items of the backward pass and its entry point.
 * Part of backward_tmpl.h (FA_SFX; FA_T, KT, KCUR): FN(bw_check_item) ->
 * bw_check_item_f32, bw_check_item_f64; likewise bw_dot, bw_delta_item,
 * bw_dq_item, bw_dkv_rows, bw_dkv_item, bw_pass_item, bw_keys, bw_store,
 * backward (which runs the two passes' items or the fused pass's,
 * bwfused_tmpl.h). */

/* The pair t's keys (batch offsets off) packed: K and V as keys; K as
 * values into kv if kv is not NULL (returns 1 if that holds NaN/Inf). */
static int FN(bw_keys)(const FN(bw_plan) *pl, const fa_offsets *off, FN(bw_pair) *t, FA_T *kv)
{
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    FN(pack_k)(a, K, off->k, t->kb, t->nk, t->ncols, K->nr, t->kp);
    FN(pack_k)(&pl->as_vk, K, off->v, t->kb, t->nk, t->ncols, K->nr, t->vkp);
    return kv ? FN(pack_v)(&pl->as_kv, K, off->k, t->kb, t->nk, pl->ldE, K->nr, kv) : 0;
}

/* Is the key block of t all padding (then every P of it is 0)? */
static int FN(bw_all_pad)(const fa_attention_args *a, const fa_offsets *off, const FN(bw_pair) *t)
{
    return a->pad.data && FN(count_pad)(a, off->pad, t->kb, t->nk) == t->nk;
}

/* The pair t for query block qb and key block kb, its tiles in scratch x. */
static FN(bw_pair) FN(bw_pair_of)(const FN(bw_plan) *pl, FA_T *x, int64_t qb, int64_t kb)
{
    const fa_attention_args *a = &pl->b->fwd;
    FN(bw_pair) t;
    t.i0 = qb * pl->bqp;
    t.nq = fa_min64(pl->bqp, a->L - t.i0);
    t.rpad = fa_round_up(t.nq, pl->K->mr);
    t.kb = kb * FA_KC;
    t.nk = fa_min64(FA_KC, a->S - t.kb);
    t.ncols = fa_round_up(t.nk, pl->K->nr);
    t.diag = 0;
    t.qp = x + pl->lay.qp;
    t.dop = x + pl->lay.dop;
    t.kp = x + pl->lay.kp;
    t.vkp = x + pl->lay.vkp;
    t.s = x + pl->lay.s;
    t.dp = x + pl->lay.dp;
    t.f = x + pl->lay.f;
    return t;
}

/* The pair t's query rows packed: scale * Q, and dO if with_dout. */
static void FN(bw_rows)(const FN(bw_plan) *pl, const fa_offsets *off, const fa_bw_offsets *go,
                        const FN(bw_pair) *t, int with_dout)
{
    const fa_attention_args *a = &pl->b->fwd;
    FN(pack_q)(a, off->q, t->i0, t->nq, t->rpad, t->qp, (FA_T)a->scale);
    if (with_dout) FN(pack_q)(&pl->as_dok, go->dout, t->i0, t->nq, t->rpad, t->dop, 1);
}

/* The key blocks [*k0, *k1) some row of query block t sees (window, causal). */
static void FN(bw_key_blocks)(const FN(bw_plan) *pl, const FN(bw_pair) *t, int64_t *k0,
                              int64_t *k1)
{
    int64_t lo, hi;
    fa_limits_keys(&pl->lim, t->i0, t->nq, pl->b->fwd.S, &lo, &hi);
    *k0 = lo / FA_KC;
    *k1 = hi > lo ? fa_div_up(hi, FA_KC) : *k0;
}

/* The pair t cut to the keys its last row sees (causal, the window's right
 * edge): past them every P and dS is 0, so a diagonal pair's products stop
 * there; diagonal if its first row still does not see its last key (then
 * taken in bands, bwtile_tmpl.h).  Called on the pair after its keys were
 * packed whole, so that both schemes see the same packed blocks (and
 * NaN/Inf flags). */
static void FN(bw_trim)(const FN(bw_plan) *pl, FN(bw_pair) *t)
{
    int64_t lo, hi;
    fa_limits_keys(&pl->lim, t->i0, t->nq, pl->b->fwd.S, &lo, &hi);
    if (hi - t->kb > 0 && hi - t->kb < t->nk) {
        t->nk = hi - t->kb;
        t->ncols = fa_round_up(t->nk, pl->K->nr);
    }
    t->diag = pl->lim.has_hi && t->kb + t->nk - 1 > t->i0 + pl->lim.hi;
}

/* Check item (batch, query block): flags it if a row whose lse is -inf
 * sees a key (a visible score, NaN included). */
static void FN(bw_check_item)(void *ctx, int64_t it, int tid)
{
    FN(bw_plan) *pl = (FN(bw_plan) *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    const int64_t b = it / pl->nqb, qb = it % pl->nqb;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(pl->b, b, &go);
    FN(bw_pair) t = FN(bw_pair_of)(pl, FN(bw_base)(pl, tid), qb, 0);
    const FA_T *lse = (const FA_T *)a->lse.data + go.lse;
    int any = 0;
    for (int64_t i = 0; i < t.nq; i++) any |= lse[(t.i0 + i) * a->lse.rs] == (FA_T)-INFINITY;
    if (!any) return;
    int64_t k0, k1;
    FN(bw_key_blocks)(pl, &t, &k0, &k1);
    FN(bw_rows)(pl, &off, &go, &t, 0);
    for (int64_t kb = k0; kb < k1 && !pl->flags[it]; kb++) {
        t = FN(bw_pair_of)(pl, FN(bw_base)(pl, tid), qb, kb);
        if (fa_limits_none(&pl->lim, t.i0, t.nq, t.kb, t.nk) || FN(bw_all_pad)(a, &off, &t))
            continue;
        FN(bw_keys)(pl, &off, &t, NULL);
        FN(bw_scores)(pl, &off, &t, 0, t.nq, t.nk);
        for (int64_t i = 0; i < t.nq; i++) {
            if (lse[(t.i0 + i) * a->lse.rs] != (FA_T)-INFINITY) continue;
            for (int64_t j = 0; j < t.nk; j++)
                if (t.s[i * FA_KC + j] != (FA_T)-INFINITY) pl->flags[it] = 1;
        }
    }
}

/* x . y over n elements, x at offset x0 of operand xo, y at y0 of yo
 * (storage st): eight partial sums, element c in sum c % 8, added pairwise
 * in a fixed order at the end, so that the chain of dependent additions is
 * an eighth as long and every storage and stride gives the same bits (the
 * contiguous FA_T rows read directly). */
static FA_T FN(bw_dot)(const fa_operand *xo, int64_t x0, const fa_operand *yo, int64_t y0,
                       int64_t n, int st)
{
    FA_T acc[8] = {0};
    int64_t c = 0;
    if (st != FA_FLOAT16 && st != FA_BFLOAT16 && xo->cs == 1 && yo->cs == 1) {
        const FA_T *x = (const FA_T *)xo->data + x0, *y = (const FA_T *)yo->data + y0;
        for (; c + 8 <= n; c += 8)
            for (int u = 0; u < 8; u++) acc[u] += x[c + u] * y[c + u];
    }
    for (; c < n; c++)
        acc[c % 8] +=
            FN(ld)(xo->data, x0 + c * xo->cs, st) * FN(ld)(yo->data, y0 + c * yo->cs, st);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* Delta item (batch index b): the plan's delta row D_i - g_i, D_i = dO_i .
 * O_i in FA_T (bw_dot), for every row in order; with a sink t, its gradient
 * sum_i exp(t - lse_i) (g_i - D_i) over the rows with lse_i > -inf, in
 * double, in row order. */
static void FN(bw_delta_item)(void *ctx, int64_t b, int tid)
{
    (void)tid;
    const FN(bw_plan) *pl = (const FN(bw_plan) *)ctx;
    const fa_backward_args *g = pl->b;
    const fa_attention_args *a = &g->fwd;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(g, b, &go);
    FA_T *delta = pl->delta + go.delta;
    const FA_T *lse = (const FA_T *)a->lse.data + go.lse;
    const double t = a->sinks.data ? ((const double *)a->sinks.data)[off.sk] : 0;
    double dt = 0;
    for (int64_t i = 0; i < a->L; i++) {
        FA_T d = FN(bw_dot)(&g->dout, go.dout + i * g->dout.rs, &a->out, off.o + i * a->out.rs,
                            a->Ev, a->storage);
        if (g->glse.data) d -= ((const FA_T *)g->glse.data)[go.glse + i * g->glse.rs];
        delta[i] = d;
        const FA_T l = lse[i * a->lse.rs];
        if (a->sinks.data && l != (FA_T)-INFINITY) dt -= exp(t - (double)l) * (double)d;
    }
    if (a->sinks.data) ((double *)g->dsinks.data)[go.dsinks] = dt;
}

/* rows x cols of acc (ld lda) times sc into the operand y at offset yo, rows
 * r0.. (its own row and column strides). */
static void FN(bw_store)(const fa_operand *y, int64_t yo, int64_t r0, int64_t rows, int64_t cols,
                         const FA_T *acc, int64_t lda, FA_T sc)
{
    FA_T *base = (FA_T *)y->data + yo;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            base[(r0 + r) * y->rs + c * y->cs] = acc[r * lda + c] * sc;
}

/* dQ item (batch index b, query block qb): dQ = scale sum over key blocks
 * of dS K. */
static void FN(bw_dq_item)(const FN(bw_plan) *pl, int64_t b, int64_t qb, int tid)
{
    const fa_attention_args *a = &pl->b->fwd;
    FA_T *x = FN(bw_base)(pl, tid), *acc = x + pl->lay.acc1, *kv = x + pl->lay.kv;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(pl->b, b, &go);
    FN(bw_pair) t = FN(bw_pair_of)(pl, x, qb, 0);
    memset(acc, 0, (size_t)(t.nq * pl->ldE) * sizeof(FA_T));
    int64_t k0, k1;
    FN(bw_key_blocks)(pl, &t, &k0, &k1);
    FN(bw_rows)(pl, &off, &go, &t, 1);
    for (int64_t kb = k0; kb < k1; kb++) {
        t = FN(bw_pair_of)(pl, x, qb, kb);
        if (fa_limits_none(&pl->lim, t.i0, t.nq, t.kb, t.nk) || FN(bw_all_pad)(a, &off, &t))
            continue;
        const int bad = FN(bw_keys)(pl, &off, &t, kv);
        FN(bw_trim)(pl, &t);
        FN(bw_tile)(pl, &off, &go, &t, 1);
        FN(bw_pair_dq)(pl, &t, bad, kv, acc);
    }
    FN(bw_store)(&pl->b->dq, go.dq, t.i0, t.nq, a->E, acc, pl->ldE, (FA_T)a->scale);
}

/* One batch index's part of a dK/dV item (key block kb, packed in the
 * thread's scratch x): over its query blocks in order, dV += P^T dO and
 * dK += dS^T Q into the scratch's accumulators. */
static void FN(bw_dkv_rows)(const FN(bw_plan) *pl, const fa_offsets *off,
                            const fa_bw_offsets *go, int64_t kb, FA_T *x)
{
    const KT *K = pl->K;
    FA_T *dk = x + pl->lay.acc1, *dv = x + pl->lay.acc2;
    FA_T *qv = x + pl->lay.qv, *dov = x + pl->lay.dov, *pt = x + pl->lay.pt;
    for (int64_t qb = 0; qb < pl->nqb; qb++) {
        FN(bw_pair) t = FN(bw_pair_of)(pl, x, qb, kb);
        if (fa_limits_none(&pl->lim, t.i0, t.nq, t.kb, t.nk)) continue;
        FN(bw_rows)(pl, off, go, &t, 1);
        const int bad_q = FN(pack_v)(&pl->as_qv, K, off->q, t.i0, t.nq, pl->ldE, K->nr, qv);
        const int bad_do = FN(pack_v)(&pl->as_dov, K, go->dout, t.i0, t.nq, pl->ldEv, K->nr, dov);
        FN(bw_trim)(pl, &t);
        FN(bw_tile)(pl, off, go, &t, 0); /* the dQ pass emits the mask's gradient */
        FN(bw_pair_kv)(pl, &t, bad_do, t.s, dov, pl->ldEv, dv, pl->ldEv, pt);
        FN(bw_pair_kv)(pl, &t, bad_q, t.dp, qv, pl->ldE, dk, pl->ldE, pt);
    }
}

/* dK/dV item (key head bk, key block kb): over the head's batch indices
 * and their query blocks in order, dV += P^T dO and dK += dS^T Q; dK then
 * times scale.  The block is packed again only for a batch index that
 * reads other keys (fa_same_keys). */
static void FN(bw_dkv_item)(const FN(bw_plan) *pl, int64_t bk, int64_t kb, int tid)
{
    const fa_attention_args *a = &pl->b->fwd;
    FA_T *x = FN(bw_base)(pl, tid), *dk = x + pl->lay.acc1, *dv = x + pl->lay.acc2;
    fa_offsets off, packed;
    fa_bw_offsets go, go0; /* go.dk, go.dv are the same for every index of the head */
    fa_bw_offsets_of(pl->b, bk * pl->grp, &go0);
    FN(bw_pair) t = FN(bw_pair_of)(pl, x, 0, kb);
    memset(dk, 0, (size_t)(t.nk * pl->ldE) * sizeof(FA_T));
    memset(dv, 0, (size_t)(t.nk * pl->ldEv) * sizeof(FA_T));
    int have = 0;
    for (int64_t h = 0; h < pl->grp; h++) {
        fa_batch_offsets(a, bk * pl->grp + h, &off);
        fa_bw_offsets_of(pl->b, bk * pl->grp + h, &go);
        if (FN(bw_all_pad)(a, &off, &t)) continue;
        if (!have || !fa_same_keys(&off, &packed)) FN(bw_keys)(pl, &off, &t, NULL);
        packed = off, have = 1;
        FN(bw_dkv_rows)(pl, &off, &go, kb, x);
    }
    FN(bw_store)(&pl->b->dk, go0.dk, t.kb, t.nk, a->E, dk, pl->ldE, (FA_T)a->scale);
    FN(bw_store)(&pl->b->dv, go0.dv, t.kb, t.nk, a->Ev, dv, pl->ldEv, 1);
}

/* Two-pass item it of nkh x nkb + nbatch x nqb, the two passes in one loop
 * (they are independent: each reads only the operands and delta) and in an
 * order of about decreasing cost under the causal and window limits, so
 * that on a dynamic schedule the threads finish together: the dK/dV items
 * by key block from the first (seen by the most query rows), the key heads
 * interleaved, then the dQ items by query block from the last (seeing the
 * most keys), the batch indices interleaved.  Any order gives the same
 * bits: an item writes only its own gradients, summed in its own fixed
 * order. */
static void FN(bw_pass_item)(void *ctx, int64_t it, int tid)
{
    const FN(bw_plan) *pl = (const FN(bw_plan) *)ctx;
    const int64_t nkv = pl->nkh * pl->nkb, nb = pl->nbatch;
    if (it < nkv)
        FN(bw_dkv_item)(pl, it % pl->nkh, it / pl->nkh, tid);
    else
        FN(bw_dq_item)(pl, (it - nkv) % nb, pl->nqb - 1 - (it - nkv) / nb, tid);
}

#include "driver/bwfused_tmpl.h" /* the fused pass's work item */

/* The backward call: FA_OK, FA_ENOMEM or FA_ELSE (nothing written). */
static int FN(backward)(const fa_backward_args *g)
{
    FN(bw_plan) pl;
    if (!FN(bw_make)(&pl, g, KCUR())) return FA_OK; /* the caller zeroes empty problems */
    const int status = FN(bw_alloc)(&pl);
    if (status != FA_OK) return status;
    const int64_t nq_items = pl.nbatch * pl.nqb;
    fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, nq_items, FN(bw_check_item), &pl);
    int bad = 0;
    for (int64_t i = 0; i < nq_items; i++) bad |= pl.flags[i];
    if (!bad) {
        fa_parallel_for(pl.nt, FA_SCHED_STATIC, pl.nbatch, FN(bw_delta_item), &pl);
        if (pl.fused) {
            fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, pl.nkh, FN(bw_fused_item), &pl);
        } else {
            fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, pl.nkh * pl.nkb + pl.nbatch * pl.nqb,
                            FN(bw_pass_item), &pl);
        }
    }
    FN(bw_free)(&pl);
    return bad ? FA_ELSE : FA_OK;
}
