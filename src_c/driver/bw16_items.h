/* bw16_items.h -- the 16-bit backward's work items and entry point; part
 * of bw16.c (after its plan and bw16_pair.h).  The items are the float32
 * backward's (backward_tmpl.h, bwpass_tmpl.h, bwfused_tmpl.h): checks per
 * (batch index, query block), D_i - g_i per batch index, then the fused
 * items (one per key head) or the two passes' (dQ per batch index and query
 * block, dK and dV per key head and key block), the same pairs in the same
 * orders. */

/* The pair of query block qb and key block kb, whole. */
static bw16_pair bw16_pair_of(const bw16_plan *pl, int64_t qb, int64_t kb)
{
    const fa_attention_args *a = &pl->b->fwd;
    bw16_pair t;
    t.i0 = qb * BW16_BQ;
    t.nq = fa_min64(BW16_BQ, a->L - t.i0);
    t.qpad = fa_round_up(t.nq, 32);
    t.kb = kb * BW16_KB;
    t.nk = fa_min64(BW16_KB, a->S - t.kb);
    t.kpad = fa_round_up(t.nk, 32);
    return t;
}

/* t cut to the keys its last row sees (causal, the window's right edge),
 * after its keys were packed whole (bwpass_tmpl.h's bw_trim) */
static void bw16_trim(const bw16_plan *pl, bw16_pair *t)
{
    int64_t lo, hi;
    fa_limits_keys(&pl->lim, t->i0, t->nq, pl->b->fwd.S, &lo, &hi);
    if (hi - t->kb > 0 && hi - t->kb < t->nk) {
        t->nk = hi - t->kb;
        t->kpad = fa_round_up(t->nk, 32);
    }
}

/* the key blocks [*k0, *k1) some row of t's query block sees */
static void bw16_key_blocks(const bw16_plan *pl, const bw16_pair *t, int64_t *k0, int64_t *k1)
{
    int64_t lo, hi;
    fa_limits_keys(&pl->lim, t->i0, t->nq, pl->b->fwd.S, &lo, &hi);
    *k0 = lo / BW16_KB;
    *k1 = hi > lo ? fa_div_up(hi, BW16_KB) : *k0;
}

/* Does t's pair compute nothing (no row sees its keys, or all padding)? */
static int bw16_skip(const bw16_plan *pl, const fa_offsets *off, const bw16_pair *t)
{
    const fa_attention_args *a = &pl->b->fwd;
    return fa_limits_none(&pl->lim, t->i0, t->nq, t->kb, t->nk) ||
           (a->pad.data && count_pad_f32(a, off->pad, t->kb, t->nk) == t->nk);
}

/* t's key block into o's kt, vt and (kk_too) kk; returns 1 if K holds NaN/Inf */
static int bw16_keys(const bw16_plan *pl, const fa_offsets *off, const bw16_pair *t,
                     const bw16_ops *o, int kk_too)
{
    const fa_attention_args *a = &pl->b->fwd;
    bw16_pairs_t(pl->M, &a->k, off->k, t->kb, t->nk, a->E, t->kpad, pl->ep, o->kt,
                 2 * BW16_KB);
    bw16_pairs_t(pl->M, &a->v, off->v, t->kb, t->nk, a->Ev, t->kpad, pl->evp, o->vt,
                 2 * BW16_KB);
    if (!kk_too) return 0;
    return bw16_pairs_r(pl->M, &a->k, off->k, t->kb, t->nk, a->E, t->kpad, pl->e16, pl->eb,
                        o->kk, 2 * pl->e16);
}

/* o's key pointers at key block slot */
static void bw16_slot(const bw16_plan *pl, bw16_ops *o, const bw16_ops *base, int64_t slot)
{
    o->kt = base->kt + slot * pl->lay.kt_n;
    o->vt = base->vt + slot * pl->lay.vt_n;
    o->kk = base->kk + slot * pl->lay.kk_n;
}

/* t's query rows: Q and dO as rows, and (with_t) as columns, noting NaN/Inf */
static void bw16_rows(const bw16_plan *pl, const fa_offsets *off, const fa_bw_offsets *go,
                      const bw16_pair *t, bw16_ops *o, int with_t)
{
    const fa_backward_args *g = pl->b;
    const fa_attention_args *a = &g->fwd;
    bw16_rows_of(&a->q, off->q, t->i0, t->nq, a->E, t->qpad, o->qr, pl->ep);
    bw16_rows_of(&g->dout, go->dout, t->i0, t->nq, a->Ev, t->qpad, o->dor, pl->evp);
    if (!with_t) return;
    o->qbad = bw16_cols_of(pl->M, &a->q, off->q, t->i0, t->nq, a->E, t->qpad, pl->e16, pl->eb,
                           o->qt, BW16_BQ);
    o->dobad = bw16_cols_of(pl->M, &g->dout, go->dout, t->i0, t->nq, a->Ev, t->qpad, pl->ev16,
                            pl->eb, o->dot, BW16_BQ);
}

/* Check item (batch, query block): flags it if a row whose lse is -inf
 * sees a key (a visible score, NaN included). */
static void bw16_check_item(void *ctx, int64_t it, int tid)
{
    bw16_plan *pl = (bw16_plan *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    const int64_t b = it / pl->nqb, qb = it % pl->nqb;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(pl->b, b, &go);
    bw16_ops o = bw16_ops_of(pl, tid);
    bw16_pair t = bw16_pair_of(pl, qb, 0);
    const float *lse = (const float *)a->lse.data + go.lse;
    int any = 0;
    for (int64_t i = 0; i < t.nq; i++) any |= lse[(t.i0 + i) * a->lse.rs] == -INFINITY;
    if (!any) return;
    int64_t k0, k1;
    bw16_key_blocks(pl, &t, &k0, &k1);
    bw16_rows(pl, &off, &go, &t, &o, 0);
    pl->T->tiles_on(o.tf);
    for (int64_t kb = k0; kb < k1 && !pl->flags[it]; kb++) {
        t = bw16_pair_of(pl, qb, kb);
        if (bw16_skip(pl, &off, &t)) continue;
        (void)bw16_keys(pl, &off, &t, &o, 0);
        bw16_scores(pl, &off, &t, &o);
        for (int64_t i = 0; i < t.nq; i++) {
            if (lse[(t.i0 + i) * a->lse.rs] != -INFINITY) continue;
            for (int64_t j = 0; j < t.nk; j++)
                if (o.s[i * BW16_KB + j] != -INFINITY) pl->flags[it] = 1;
        }
    }
    pl->T->tiles_off(o.tf);
}

/* Delta item (batch index b): D_i - g_i, D_i = dO_i . O_i in float32, row
 * by row; with a sink t, its gradient sum_i exp(t - lse_i) (g_i - D_i) over
 * the rows with lse_i > -inf, in double (bwpass_tmpl.h's bw_delta_item). */
static void bw16_delta_item(void *ctx, int64_t b, int tid)
{
    (void)tid;
    const bw16_plan *pl = (const bw16_plan *)ctx;
    const fa_backward_args *g = pl->b;
    const fa_attention_args *a = &g->fwd;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(g, b, &go);
    float *delta = pl->delta + go.delta;
    const float *lse = (const float *)a->lse.data + go.lse;
    const double t = a->sinks.data ? ((const double *)a->sinks.data)[off.sk] : 0;
    double dt = 0;
    const int64_t nv = g->dout.cs == 1 && a->out.cs == 1 ? a->L / 16 * 16 : 0;
    if (nv > 0) /* the same sums, 16 rows at a time */
        pl->M->dots(pl->f16, (const uint16_t *)g->dout.data + go.dout, g->dout.rs,
                    (const uint16_t *)a->out.data + off.o, a->out.rs, nv, a->Ev, delta);
    for (int64_t i = 0; i < a->L; i++) {
        const int64_t o0 = off.o + i * a->out.rs, d0 = go.dout + i * g->dout.rs;
        float d = 0;
        if (i < nv)
            d = delta[i];
        else
            for (int64_t c = 0; c < a->Ev; c++)
                d += ld_f32(g->dout.data, d0 + c * g->dout.cs, a->storage) *
                     ld_f32(a->out.data, o0 + c * a->out.cs, a->storage);
        if (g->glse.data) d -= ((const float *)g->glse.data)[go.glse + i * g->glse.rs];
        delta[i] = d;
        const float l = lse[i * a->lse.rs];
        if (a->sinks.data && l != -INFINITY) dt -= exp(t - (double)l) * (double)d;
    }
    if (a->sinks.data) ((double *)g->dsinks.data)[go.dsinks] = dt;
}

/* n elements x[c] times sc into the gradient row at element yo of y:
 * rounded once to 16 bits (the narrowing of fa_round_half) where the plan
 * says so, else float32 */
static void bw16_put_row(const bw16_plan *pl, const fa_operand *y, int64_t yo, const float *x,
                         int64_t n, float sc)
{
    const int st = pl->b->fwd.storage;
    if (!pl->g16) {
        float *d = (float *)y->data + yo;
        for (int64_t c = 0; c < n; c++) d[c * y->cs] = x[c] * sc;
    } else if (y->cs == 1) {
        pl->K->narrow_h[st - FA_FLOAT16](x, sc, (uint16_t *)y->data + yo, n);
    } else {
        uint16_t *d = (uint16_t *)y->data + yo;
        for (int64_t c = 0; c < n; c++)
            d[c * y->cs] = st == FA_FLOAT16 ? fa_f32_to_f16(x[c] * sc) : fa_f32_to_bf16(x[c] * sc);
    }
}

/* rows x cols of acc (ld lda) times sc into the gradient y at yo, rows
 * r0..; tr: acc is cols (padded to 16, all written) x rows, brought back to
 * rows BW16_KB at a time through o->tr */
static void bw16_store(const bw16_plan *pl, const bw16_ops *o, const fa_operand *y, int64_t yo,
                       int64_t r0, int64_t rows, int64_t cols, const float *acc, int64_t lda,
                       int tr, float sc)
{
    const int64_t cpad = fa_round_up(cols, 16);
    for (int64_t q0 = 0; q0 < rows; q0 += BW16_KB) {
        const int64_t n = fa_min64(BW16_KB, rows - q0);
        const float *x = acc + q0 * lda;
        int64_t ld = lda;
        if (tr) {
            pl->M->trans(acc + q0, lda, cpad, fa_round_up(n, 16), o->tr, cpad);
            x = o->tr;
            ld = cpad;
        }
        for (int64_t r = 0; r < n; r++)
            bw16_put_row(pl, y, yo + (r0 + q0 + r) * y->rs, x + r * ld, cols, sc);
    }
}

/* dQ item (batch, query block): dQ = scale sum over key blocks of dS K. */
static void bw16_dq_item(void *ctx, int64_t it, int tid)
{
    const bw16_plan *pl = (const bw16_plan *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    const int64_t b = it / pl->nqb, qb = it % pl->nqb;
    fa_offsets off;
    fa_bw_offsets go;
    fa_batch_offsets(a, b, &off);
    fa_bw_offsets_of(pl->b, b, &go);
    bw16_ops o = bw16_ops_of(pl, tid);
    bw16_pair t = bw16_pair_of(pl, qb, 0);
    memset(o.dq, 0, (size_t)(t.qpad * pl->e16) * sizeof(float));
    int64_t k0, k1;
    bw16_key_blocks(pl, &t, &k0, &k1);
    bw16_rows(pl, &off, &go, &t, &o, 0);
    pl->T->tiles_on(o.tf);
    for (int64_t kb = k0; kb < k1; kb++) {
        t = bw16_pair_of(pl, qb, kb);
        if (bw16_skip(pl, &off, &t)) continue;
        o.kbad = bw16_keys(pl, &off, &t, &o, 1);
        bw16_trim(pl, &t);
        bw16_pair_run(pl, &off, &go, &t, &o, 1);
    }
    pl->T->tiles_off(o.tf);
    bw16_store(pl, &o, &pl->b->dq, go.dq, t.i0, t.nq, a->E, o.dq, pl->e16, 0, (float)a->scale);
}

/* dK/dV item (key head, key block): over the head's batch indices and their
 * query blocks in order, dV^T += dO^T P and dK^T += Q^T dS; dK then times
 * scale.  The block is packed again only for a batch index that reads
 * other keys (fa_same_keys). */
static void bw16_dkv_item(void *ctx, int64_t it, int tid)
{
    const bw16_plan *pl = (const bw16_plan *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    const int64_t bk = it / pl->nkb, kb = it % pl->nkb;
    fa_offsets off, packed;
    fa_bw_offsets go, go0; /* go.dk, go.dv are the same for every index of the head */
    fa_bw_offsets_of(pl->b, bk * pl->grp, &go0);
    bw16_ops o = bw16_ops_of(pl, tid);
    bw16_pair t = bw16_pair_of(pl, 0, kb);
    memset(o.dkt, 0, (size_t)(pl->e16 * pl->ldt) * sizeof(float));
    memset(o.dvt, 0, (size_t)(pl->ev16 * pl->ldt) * sizeof(float));
    int have = 0;
    for (int64_t h = 0; h < pl->grp; h++) {
        fa_batch_offsets(a, bk * pl->grp + h, &off);
        fa_bw_offsets_of(pl->b, bk * pl->grp + h, &go);
        if (a->pad.data && count_pad_f32(a, off.pad, t.kb, t.nk) == t.nk) continue;
        if (!have || !fa_same_keys(&off, &packed)) (void)bw16_keys(pl, &off, &t, &o, 0);
        packed = off, have = 1;
        pl->T->tiles_on(o.tf);
        for (int64_t qb = 0; qb < pl->nqb; qb++) {
            bw16_pair u = bw16_pair_of(pl, qb, kb);
            if (fa_limits_none(&pl->lim, u.i0, u.nq, u.kb, u.nk)) continue;
            bw16_rows(pl, &off, &go, &u, &o, 1);
            bw16_trim(pl, &u);
            bw16_pair_run(pl, &off, &go, &u, &o, 2);
        }
        pl->T->tiles_off(o.tf);
    }
    bw16_store(pl, &o, &pl->b->dk, go0.dk, t.kb, t.nk, a->E, o.dkt, pl->ldt, 1, (float)a->scale);
    bw16_store(pl, &o, &pl->b->dv, go0.dv, t.kb, t.nk, a->Ev, o.dvt, pl->ldt, 1, 1);
}

/* Query block qb of a fused item (keys packed in o's slots, kbad per key
 * block: -1 all padding): over its key blocks in order, the pair's three
 * products; dQ stored times scale. */
static void bw16_fused_block(const bw16_plan *pl, const fa_offsets *off, const fa_bw_offsets *go,
                             bw16_ops *o, const int *kbad, int64_t qb)
{
    const fa_attention_args *a = &pl->b->fwd;
    bw16_pair t = bw16_pair_of(pl, qb, 0);
    memset(o->dq, 0, (size_t)(t.qpad * pl->e16) * sizeof(float));
    int64_t k0, k1;
    bw16_key_blocks(pl, &t, &k0, &k1);
    bw16_rows(pl, off, go, &t, o, 1);
    for (int64_t kb = k0; kb < k1; kb++) {
        t = bw16_pair_of(pl, qb, kb);
        if (fa_limits_none(&pl->lim, t.i0, t.nq, t.kb, t.nk) || kbad[kb] < 0) continue;
        bw16_ops u = *o;
        bw16_slot(pl, &u, o, kb);
        u.kbad = kbad[kb];
        u.dkt += t.kb;
        u.dvt += t.kb;
        bw16_trim(pl, &t);
        bw16_pair_run(pl, off, go, &t, &u, 3);
    }
    bw16_store(pl, o, &pl->b->dq, go->dq, t.i0, t.nq, a->E, o->dq, pl->e16, 0, (float)a->scale);
}

/* Every key block of a fused item packed into o's slots; kbad[kb] = -1 if
 * the block is all padding (not packed), else 1 if K holds NaN/Inf. */
static void bw16_fused_keys(const bw16_plan *pl, const fa_offsets *off, const bw16_ops *o,
                            int *kbad)
{
    const fa_attention_args *a = &pl->b->fwd;
    for (int64_t kb = 0; kb < pl->nkb; kb++) {
        bw16_pair t = bw16_pair_of(pl, 0, kb);
        bw16_ops u = *o;
        bw16_slot(pl, &u, o, kb);
        kbad[kb] = a->pad.data && count_pad_f32(a, off->pad, t.kb, t.nk) == t.nk
                       ? -1 : bw16_keys(pl, off, &t, &u, 1);
    }
}

/* Fused item (key head bk): its keys packed (again only for a batch index
 * that reads other keys), then each batch index's query blocks in order. */
static void bw16_fused_item(void *ctx, int64_t bk, int tid)
{
    const bw16_plan *pl = (const bw16_plan *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    int *kbad = pl->kbad + (int64_t)tid * pl->nkb;
    fa_offsets off, packed;
    fa_bw_offsets go, go0; /* go.dk, go.dv are the same for every index of the head */
    fa_bw_offsets_of(pl->b, bk * pl->grp, &go0);
    bw16_ops o = bw16_ops_of(pl, tid);
    memset(o.dkt, 0, (size_t)(pl->e16 * pl->ldt) * sizeof(float));
    memset(o.dvt, 0, (size_t)(pl->ev16 * pl->ldt) * sizeof(float));
    for (int64_t h = 0; h < pl->grp; h++) {
        fa_batch_offsets(a, bk * pl->grp + h, &off);
        fa_bw_offsets_of(pl->b, bk * pl->grp + h, &go);
        if (h == 0 || !fa_same_keys(&off, &packed)) bw16_fused_keys(pl, &off, &o, kbad);
        packed = off;
        pl->T->tiles_on(o.tf);
        for (int64_t qb = 0; qb < pl->nqb; qb++) bw16_fused_block(pl, &off, &go, &o, kbad, qb);
        pl->T->tiles_off(o.tf);
    }
    bw16_store(pl, &o, &pl->b->dk, go0.dk, 0, a->S, a->E, o.dkt, pl->ldt, 1, (float)a->scale);
    bw16_store(pl, &o, &pl->b->dv, go0.dv, 0, a->S, a->Ev, o.dvt, pl->ldt, 1, 1);
}

int fa_backward16_runs(const fa_attention_args *a)
{
    const fa_kernels_f32 *K = fa_kernels_f32_current();
    if (!K->bw16.gemm || a->kv_storage != a->storage) return 0;
    return a->storage == FA_BFLOAT16 ||
           (a->storage == FA_FLOAT16 && K->flash16.fp16 && fa_amx_fp16());
}

int fa_backward_rounds(int storage)
{
    fa_attention_args a;
    memset(&a, 0, sizeof a);
    a.storage = a.kv_storage = storage;
    return (storage == FA_FLOAT16 || storage == FA_BFLOAT16) && fa_backward16_runs(&a);
}

int fa_backward16(const fa_backward_args *g)
{
    bw16_plan pl;
    if (!bw16_make(&pl, g, g->fwd.storage == FA_FLOAT16)) return FA_OK;
    const int status = bw16_alloc(&pl);
    if (status != FA_OK) return status;
    const int64_t nq_items = pl.nbatch * pl.nqb;
    fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, nq_items, bw16_check_item, &pl);
    int bad = 0;
    for (int64_t i = 0; i < nq_items; i++) bad |= pl.flags[i];
    if (!bad) {
        fa_parallel_for(pl.nt, FA_SCHED_STATIC, pl.nbatch, bw16_delta_item, &pl);
        if (pl.fused) {
            fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, pl.nkh, bw16_fused_item, &pl);
        } else {
            fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, nq_items, bw16_dq_item, &pl);
            fa_parallel_for(pl.nt, FA_SCHED_DYNAMIC, pl.nkh * pl.nkb, bw16_dkv_item, &pl);
        }
    }
    bw16_free(&pl);
    return bad ? FA_ELSE : FA_OK;
}
