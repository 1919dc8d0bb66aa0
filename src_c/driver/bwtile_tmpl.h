/* bwtile_tmpl.h -- one (query block, key block) pair of the backward pass:
 * the scores recomputed as the forward builds them (Q.K^T, the soft cap,
 * ALiBi and the masks by the forward's own code, tiles_tmpl.h and
 * scoreopts_tmpl.h), the weights P from the forward's lse, dP = dO.V^T and
 * dS.  Part of backward_tmpl.h (FA_SFX; FA_T, KT): FN(bw_scores) ->
 * bw_scores_f32, bw_scores_f64; likewise bw_ds_row, bw_tile, bw_transpose,
 * bw_pv, bw_pvt. */

/* Packed operands of one pair and the tiles it fills (all ld FA_KC). */
typedef struct FN(bw_pair) {
    int64_t i0, nq, rpad;     /* query rows i0 .. i0 + nq, padded to rpad (MR) */
    int64_t kb, nk, ncols;    /* keys kb .. kb + nk, padded to ncols (NR) */
    FA_T *qp, *dop;           /* [rpad x E] scale * Q, [rpad x Ev] dO */
    FA_T *kp, *vkp;           /* K and V packed as keys (panel-major) */
    FA_T *s, *dp, *f;         /* scores, then P; dP, then dS; the soft cap's factor */
} FN(bw_pair);

/* s = the final logits of the pair, hidden positions exactly -inf (rows <
 * nq, keys < nk); with a soft cap, f = its derivative 1 - tanh^2. */
static void FN(bw_scores)(const FN(bw_plan) *pl, const fa_offsets *off, const FN(bw_pair) *t)
{
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    K->qk(t->rpad, t->ncols, a->E, t->qp, t->kp, t->s, FA_KC, NULL);
    if (a->softcap > 0) {
        const FA_T cap = (FA_T)a->softcap, inv = (FA_T)1 / cap;
        for (int64_t i = 0; i < t->nq; i++) {
            FA_T *row = t->s + i * FA_KC, *fr = t->f + i * FA_KC;
            K->softcap(row, t->nk, cap);
            for (int64_t j = 0; j < t->nk; j++) fr[j] = 1 - (row[j] * inv) * (row[j] * inv);
        }
    }
    if (a->alibi.data) /* ALiBi alone: the cap is applied above */
        (void)FN(score_opts)(&pl->nocap, K, off, t->s, FA_KC, t->i0, t->nq, t->kb, t->nk, 0,
                             NULL);
    const int cut = fa_limits_cut(&pl->lim, t->i0, t->nq, t->kb, t->nk);
    FN(apply_masks)(a, off, t->s, FA_KC, t->i0, t->nq, t->kb, t->nk, cut ? &pl->lim : NULL,
                    a->pad.data != NULL, a->bool_mask.data != NULL);
}

/* dS = P (dP - d) (times f) over a row's n keys, exactly 0 where P is.
 * Without a soft cap, the plain product (which the compiler vectorises) in
 * one pass that also notes a NaN or Inf result; only then can a hidden P of
 * 0 have met a NaN or Inf (a hidden value's, an overflow, a non-finite d),
 * and those positions are set back to 0: the plain product is the careful
 * one wherever P is not 0.  With a soft cap, f is -inf where the score is
 * hidden, so the select is made throughout. */
static void FN(bw_ds_row)(FA_T *restrict ds, const FA_T *restrict p, const FA_T *restrict f,
                          int64_t n, FA_T d)
{
    if (f) {
        for (int64_t j = 0; j < n; j++) ds[j] = p[j] != 0 ? p[j] * (ds[j] - d) * f[j] : 0;
        return;
    }
    const FA_UINT(FA_SFX) expo = FA_EXP_MASK(FA_SFX);
    FA_UINT(FA_SFX) bad = 0;
    for (int64_t j = 0; j < n; j++) {
        const FA_T r = p[j] * (ds[j] - d);
        FA_UINT(FA_SFX) u;
        memcpy(&u, &r, sizeof u);
        bad |= (FA_UINT(FA_SFX))((u & expo) == expo);
        ds[j] = r;
    }
    if (bad)
        for (int64_t j = 0; j < n; j++) ds[j] = p[j] != 0 ? ds[j] : 0;
}

/* The pair's P (in s) and dS (in dp), zero outside rows < nq, keys < nk:
 * P = exp(s - lse) where visible, exactly 0 where hidden or the row's lse
 * is -inf; dS by bw_ds_row. */
static void FN(bw_tile)(const FN(bw_plan) *pl, const fa_offsets *off, const FN(bw_offsets) *go,
                        const FN(bw_pair) *t)
{
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    const FA_T *lse = (const FA_T *)a->lse.data + go->lse;
    const FA_T *delta = pl->delta + go->delta;
    FN(bw_scores)(pl, off, t);
    K->qk(t->rpad, t->ncols, a->Ev, t->dop, t->vkp, t->dp, FA_KC, NULL);
    for (int64_t i = 0; i < t->rpad; i++) {
        FA_T *p = t->s + i * FA_KC, *ds = t->dp + i * FA_KC;
        const FA_T l = i < t->nq ? lse[(t->i0 + i) * a->lse.rs] : (FA_T)-INFINITY;
        const int64_t n = l == (FA_T)-INFINITY ? 0 : t->nk;
        if (n > 0) {
            (void)K->expsum(p, p, n, l);
            FN(bw_ds_row)(ds, p, a->softcap > 0 ? t->f + i * FA_KC : NULL, n, delta[t->i0 + i]);
        }
        for (int64_t j = n; j < t->ncols; j++) p[j] = ds[j] = 0;
    }
}

/* y[j][i] = x[i][j] for i < ni, j < nj (x ld FA_KC, y ld ldy). */
static void FN(bw_transpose)(const FA_T *x, int64_t ni, int64_t nj, FA_T *y, int64_t ldy)
{
    for (int64_t i = 0; i < ni; i++)
        for (int64_t j = 0; j < nj; j++) y[j * ldy + i] = x[i * FA_KC + j];
}

/* o[ni x ncols] += p[ni x nk] . vp: the fast kernel, or, when the packed
 * values hold NaN/Inf (bad), the one that skips zero weights, so that a
 * hidden position's 0 never meets them. */
static void FN(bw_pv)(const KT *K, int bad, int64_t ni, int64_t nk, int64_t ncols, const FA_T *p,
                      int64_t ldp, const FA_T *vp, FA_T *o, int64_t ldo)
{
    if (bad)
        FN(pv_careful)(K, ni, nk, ncols, p, ldp, vp, o, ldo);
    else
        K->pv(ni, nk, ncols, p, ldp, vp, FA_KC * K->nr, o, ldo);
}

/* o[nk x ncols] += x^T . vp for the pair's tile x (P or dS, nq rows by nk
 * keys, ld FA_KC) and the query block's rows packed as values vp: the
 * table's pvt reads x as it lies; where vp holds NaN/Inf (bad), x^T is
 * written to xt (ld ldt) for bw_pv's careful kernel.  Bitwise the same. */
static void FN(bw_pvt)(const KT *K, int bad, int64_t nk, int64_t nq, int64_t ncols, const FA_T *x,
                       const FA_T *vp, FA_T *o, int64_t ldo, FA_T *xt, int64_t ldt)
{
    if (bad) {
        FN(bw_transpose)(x, nq, nk, xt, ldt);
        FN(bw_pv)(K, 1, nk, nq, ncols, xt, ldt, vp, o, ldo);
    } else {
        K->pvt(nk, nq, ncols, x, FA_KC, vp, FA_KC * K->nr, o, ldo);
    }
}
