/* bwfused_tmpl.h -- the fused backward pass (chosen by bw_scheme.h):
 * one work item per key head, over its batch indices in order, each over
 * its query blocks in order, each over its key blocks in order, every
 * pair's S, dP, dQ, dV and dK computed once.
 * Part of backward_tmpl.h (FA_SFX; FA_T, KT), after bwpass_tmpl.h's helpers:
 * FN(bw_fused_keys) -> bw_fused_keys_f32, bw_fused_keys_f64; likewise
 * bw_fused_at, bw_fused_acc, bw_fused_block, bw_fused_item.
 *
 * The sums are those of the two passes, in their order: a dQ element over
 * the key blocks in order (the tile of its query block, then stored), a dK
 * or dV element over the key head's batch indices and their query blocks
 * in order (the item's accumulators: the output itself where its rows lie
 * contiguous at the accumulators' width, else scratch, stored once at the
 * end); so the gradients are bitwise those of the two passes.  The keys
 * are packed once per item (again only for a batch index that reads other
 * keys), not once per pair: K and V as keys, K as values, every block at a
 * stride of one block's piece. */

/* Key block kb of the item's packed keys in pair t (bw_pair_of's t.kp and
 * t.vkp point at block 0). */
static void FN(bw_fused_at)(const FN(bw_plan) *pl, FN(bw_pair) *t, int64_t kb)
{
    t->kp += kb * FA_KC * pl->b->fwd.E;
    t->vkp += kb * FA_KC * pl->b->fwd.Ev;
}

/* Every key block of the item packed into scratch x; kbad[kb] = -1 if the
 * block is all padding (not packed: no pair uses it), else 1 if K holds
 * NaN/Inf (then dQ += dS K skips zero weights), else 0. */
static void FN(bw_fused_keys)(const FN(bw_plan) *pl, const fa_offsets *off, FA_T *x, int *kbad)
{
    const fa_attention_args *a = &pl->b->fwd;
    for (int64_t kb = 0; kb < pl->nkb; kb++) {
        FN(bw_pair) t = FN(bw_pair_of)(pl, x, 0, kb);
        FN(bw_fused_at)(pl, &t, kb);
        if (FN(bw_all_pad)(a, off, &t)) {
            kbad[kb] = -1;
            continue;
        }
        kbad[kb] = FN(bw_keys)(pl, off, &t, x + pl->lay.kv + kb * pl->ldE * FA_KC);
    }
}

/* The item's dK and dV accumulators (S x ldE, S x ldEv): the outputs
 * themselves where the plan says so, else the thread's scratch x. */
static void FN(bw_fused_acc)(const FN(bw_plan) *pl, const fa_bw_offsets *go, FA_T *x, FA_T **dk,
                             FA_T **dv)
{
    *dk = pl->dk_out ? (FA_T *)pl->b->dk.data + go->dk : x + pl->lay.acc1;
    *dv = pl->dv_out ? (FA_T *)pl->b->dv.data + go->dv : x + pl->lay.acc2;
}

/* Query block qb of the item: its rows packed (Q, dO as rows and as
 * values), then over its key blocks in order: the pair's P and dS
 * (bw_tile), dQ += dS K into the block's tile, dV += P^T dO and dK += dS^T Q
 * into the item's accumulators; dQ then stored times scale. */
static void FN(bw_fused_block)(const FN(bw_plan) *pl, const fa_offsets *off,
                               const fa_bw_offsets *go, FA_T *x, const int *kbad, int64_t qb)
{
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    FA_T *dq = x + pl->lay.dq, *dk, *dv;
    FN(bw_fused_acc)(pl, go, x, &dk, &dv);
    FA_T *qv = x + pl->lay.qv, *dov = x + pl->lay.dov, *pt = x + pl->lay.pt;
    FN(bw_pair) t = FN(bw_pair_of)(pl, x, qb, 0);
    memset(dq, 0, (size_t)(t.nq * pl->ldE) * sizeof(FA_T));
    int64_t k0, k1;
    FN(bw_key_blocks)(pl, &t, &k0, &k1);
    FN(bw_rows)(pl, off, go, &t, 1);
    const int bad_q = FN(pack_v)(&pl->as_qv, K, off->q, t.i0, t.nq, pl->ldE, K->nr, qv);
    const int bad_do = FN(pack_v)(&pl->as_dov, K, go->dout, t.i0, t.nq, pl->ldEv, K->nr, dov);
    for (int64_t kb = k0; kb < k1; kb++) {
        t = FN(bw_pair_of)(pl, x, qb, kb);
        if (fa_limits_none(&pl->lim, t.i0, t.nq, t.kb, t.nk) || kbad[kb] < 0) continue;
        FN(bw_fused_at)(pl, &t, kb);
        FN(bw_trim)(pl, &t);
        FN(bw_tile)(pl, off, go, &t, 1);
        const FA_T *kv = x + pl->lay.kv + kb * pl->ldE * FA_KC;
        FN(bw_pair_dq)(pl, &t, kbad[kb], kv, dq);
        FA_T *dvb = dv + t.kb * pl->ldEv, *dkb = dk + t.kb * pl->ldE;
        FN(bw_pair_kv)(pl, &t, bad_do, t.s, dov, pl->ldEv, dvb, pl->ldEv, pt);
        FN(bw_pair_kv)(pl, &t, bad_q, t.dp, qv, pl->ldE, dkb, pl->ldE, pt);
    }
    FN(bw_store)(&pl->b->dq, go->dq, t.i0, t.nq, a->E, dq, pl->ldE, (FA_T)a->scale);
}

/* Fused item (key head bk: batch indices bk grp .. bk grp + grp - 1): dQ
 * of each index's rows; dK and dV of its keys summed over the indices in
 * order, times scale once at the end.  The keys are packed again only where
 * an index reads other keys than the last one packed. */
static void FN(bw_fused_item)(void *ctx, int64_t bk, int tid)
{
    const FN(bw_plan) *pl = (const FN(bw_plan) *)ctx;
    const fa_attention_args *a = &pl->b->fwd;
    FA_T *x = FN(bw_base)(pl, tid), *dk, *dv;
    int *kbad = pl->kbad + (int64_t)tid * pl->nkb;
    fa_offsets off, packed;
    fa_bw_offsets go, go0; /* go.dk, go.dv are the same for every index of the head */
    fa_bw_offsets_of(pl->b, bk * pl->grp, &go0);
    FN(bw_fused_acc)(pl, &go0, x, &dk, &dv);
    memset(dk, 0, (size_t)(a->S * pl->ldE) * sizeof(FA_T));
    memset(dv, 0, (size_t)(a->S * pl->ldEv) * sizeof(FA_T));
    for (int64_t h = 0; h < pl->grp; h++) {
        const int64_t b = bk * pl->grp + h;
        fa_batch_offsets(a, b, &off);
        fa_bw_offsets_of(pl->b, b, &go);
        if (h == 0 || !fa_same_keys(&off, &packed)) FN(bw_fused_keys)(pl, &off, x, kbad);
        packed = off;
        for (int64_t qb = 0; qb < pl->nqb; qb++) FN(bw_fused_block)(pl, &off, &go, x, kbad, qb);
    }
    FN(bw_store)(&pl->b->dk, go0.dk, 0, a->S, a->E, dk, pl->ldE, (FA_T)a->scale); /* in place */
    if (!pl->dv_out) FN(bw_store)(&pl->b->dv, go0.dv, 0, a->S, a->Ev, dv, pl->ldEv, 1);
}
