/* bwtile_tmpl.h -- one (query block, key block) pair of the backward pass:
 * the scores recomputed as the forward builds them (Q.K^T, the soft cap,
 * ALiBi and the masks by the forward's own code, tiles_tmpl.h and
 * scoreopts_tmpl.h), the weights P from the forward's lse, dP = dO.V^T, dS,
 * and the pair's products dQ += dS K, dV += P^T dO, dK += dS^T Q.  Part of
 * backward_tmpl.h (FA_SFX; FA_T, KT): FN(bw_scores) -> bw_scores_f32,
 * bw_scores_f64; likewise bw_band_keys, bw_grad_row, bw_tile,
 * bw_transpose, bw_pv, bw_pvt, bw_pair_dq, bw_pair_kv.
 *
 * A pair that the causal diagonal or the window's right edge crosses (a
 * diagonal pair) is taken in bands of mr query rows, as the forward's
 * stream_tile takes its tiles: each band's scores, weights and dQ stop at
 * the last key its last row sees, and dV, dK start each group of mr keys
 * at the first query row that sees it, so the pair's hidden triangle is
 * neither computed nor multiplied.  The terms left out are exact zeros
 * (hidden weights), so every sum keeps its order over the terms that
 * remain, and both schemes run the same pairs this way. */

/* Packed operands of one pair and the tiles it fills (all ld FA_KC). */
typedef struct FN(bw_pair) {
    int64_t i0, nq, rpad;     /* query rows i0 .. i0 + nq, padded to rpad (MR) */
    int64_t kb, nk, ncols;    /* keys kb .. kb + nk, padded to ncols (NR) */
    int diag;                 /* a diagonal pair: taken in bands of mr rows (bw_trim) */
    FA_T *qp, *dop;           /* [rpad x E] scale * Q, [rpad x Ev] dO */
    FA_T *kp, *vkp;           /* K and V packed as keys (panel-major) */
    FA_T *s, *dp, *f;         /* scores, then P; dP, then dS; the soft cap's factor */
} FN(bw_pair);

/* The keys of pair t that some row of its rows [g, g + nb) sees: up to the
 * last row's right limit (causal, the window's right edge), at most t->nk. */
static int64_t FN(bw_band_keys)(const FN(bw_plan) *pl, const FN(bw_pair) *t, int64_t g,
                                int64_t nb)
{
    if (!pl->lim.has_hi) return t->nk;
    const int64_t lim = t->i0 + g + nb + pl->lim.hi - t->kb; /* keys < lim */
    return lim <= 0 ? 0 : fa_min64(lim, t->nk);
}

/* Rows [g, g + nb) of pair t (nb real rows, padded to a multiple of mr by
 * Q.K^T) against its first nk keys: s = the final logits, hidden positions
 * exactly -inf; with a soft cap, f = its derivative 1 - tanh^2. */
static void FN(bw_scores)(const FN(bw_plan) *pl, const fa_offsets *off, const FN(bw_pair) *t,
                          int64_t g, int64_t nb, int64_t nk)
{
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    FA_T *s = t->s + g * FA_KC;
    K->qk(fa_round_up(nb, K->mr), fa_round_up(nk, K->nr), a->E, t->qp + g * a->E, t->kp, s, FA_KC,
          NULL);
    if (a->softcap > 0)
        for (int64_t i = 0; i < nb; i++)
            K->softcap(s + i * FA_KC, t->f + (g + i) * FA_KC, nk, (FA_T)a->softcap);
    if (a->alibi.data) /* ALiBi alone: the cap is applied above */
        (void)FN(score_opts)(&pl->nocap, K, off, s, FA_KC, t->i0 + g, nb, t->kb, nk, 0, NULL);
    const int cut = fa_limits_cut(&pl->lim, t->i0 + g, nb, t->kb, nk);
    FN(apply_masks)(a, off, s, FA_KC, t->i0 + g, nb, t->kb, nk, cut ? &pl->lim : NULL,
                    a->pad.data != NULL, a->bool_mask.data != NULL);
}

/* A row's P (in s, which holds its final scores) and dS (in ds, which holds
 * dP) over n keys, l its lse (finite), d its D, f the soft cap's factor or
 * NULL; dm (stride cs) where not NULL: the mask's gradient, the logits'
 * (dS before f).  P = exp(s - l) of the scores clamped to l: s <= l but for
 * rounding, which at scores of ~1e9 exceeds 1 and would overflow P; so P is
 * never above 1 (NaN kept).  dS is 0 wherever P is, so that a NaN or Inf
 * of a hidden position (a hidden value's, an overflow, a non-finite d)
 * reaches no gradient: with f the table's grad_row selects throughout;
 * without, it forms the plain product and says whether some result is NaN
 * or Inf, and only then are the positions where P is 0 set back to 0 (the
 * plain product is the careful one wherever P is not 0).  Where dm asks for
 * the logits' dS, f is applied after it is written. */
static void FN(bw_grad_row)(const KT *K, FA_T *restrict s, FA_T *restrict ds,
                            const FA_T *restrict f, int64_t n, FA_T l, FA_T d, FA_T *dm,
                            int64_t cs)
{
    if (K->grad_row(s, ds, dm ? NULL : f, n, l, d))
        for (int64_t j = 0; j < n; j++) ds[j] = s[j] != 0 ? ds[j] : 0;
    if (dm) {
        for (int64_t j = 0; j < n; j++) dm[j * cs] = ds[j];
        if (f)
            for (int64_t j = 0; j < n; j++) ds[j] = s[j] != 0 ? ds[j] * f[j] : 0;
    }
}

/* The pair's P (in s) and dS (in dp) on its rows < nq, band by band (a
 * diagonal pair's bands of mr rows, else one), zero from each band's keys
 * (bw_band_keys) to ncols: P = exp(s - lse) where visible, exactly 0 where
 * hidden or the row's lse is -inf; dS by bw_grad_row.  With emit, the mask's
 * gradient where asked for (fa_backward_args.dmask) at the keys computed:
 * one of the passes that meet a pair emits it. */
static void FN(bw_tile)(const FN(bw_plan) *pl, const fa_offsets *off, const fa_bw_offsets *go,
                        const FN(bw_pair) *t, int emit)
{
    const fa_operand *dmo = &pl->b->dmask;
    FA_T *dm = emit && dmo->data ? (FA_T *)dmo->data + go->dmask + t->kb * dmo->cs : NULL;
    const fa_attention_args *a = &pl->b->fwd;
    const KT *K = pl->K;
    const FA_T *lse = (const FA_T *)a->lse.data + go->lse;
    const FA_T *delta = pl->delta + go->delta;
    const int64_t band = t->diag ? K->mr : t->rpad;
    for (int64_t g = 0; g < t->nq; g += band) {
        const int64_t nb = fa_min64(band, t->nq - g), nk = FN(bw_band_keys)(pl, t, g, nb);
        if (nk > 0) {
            FN(bw_scores)(pl, off, t, g, nb, nk);
            K->qk(fa_round_up(nb, K->mr), fa_round_up(nk, K->nr), a->Ev, t->dop + g * a->Ev,
                  t->vkp, t->dp + g * FA_KC, FA_KC, NULL);
        }
        for (int64_t i = g; i < g + nb; i++) {
            FA_T *p = t->s + i * FA_KC, *ds = t->dp + i * FA_KC;
            const FA_T l = lse[(t->i0 + i) * a->lse.rs];
            const int64_t n = l == (FA_T)-INFINITY ? 0 : nk;
            if (n > 0)
                FN(bw_grad_row)(K, p, ds, a->softcap > 0 ? t->f + i * FA_KC : NULL, n, l,
                                delta[t->i0 + i], dm ? dm + (t->i0 + i) * dmo->rs : NULL,
                                dmo->cs);
            for (int64_t j = n; j < t->ncols; j++) p[j] = ds[j] = 0;
        }
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

/* acc[nq x ldE] += dS K for pair t, band by band (each band's keys), kv its
 * key block packed as values (bad: they hold NaN/Inf). */
static void FN(bw_pair_dq)(const FN(bw_plan) *pl, const FN(bw_pair) *t, int bad, const FA_T *kv,
                           FA_T *acc)
{
    const int64_t band = t->diag ? pl->K->mr : t->nq;
    for (int64_t g = 0; g < t->nq; g += band) {
        const int64_t nb = fa_min64(band, t->nq - g), nk = FN(bw_band_keys)(pl, t, g, nb);
        if (nk > 0)
            FN(bw_pv)(pl->K, bad, nb, nk, pl->ldE, t->dp + g * FA_KC, FA_KC, kv, acc + g * pl->ldE,
                      pl->ldE);
    }
}

/* o[nk x ncols] += x^T . vp (bw_pvt) for pair t's tile x (P or dS) and its
 * query rows packed as values vp (bad: they hold NaN/Inf); in a diagonal
 * pair by groups of mr keys, each from the first query row that sees its
 * first key (the rows above see none of the group).  xt: bw_pvt's. */
static void FN(bw_pair_kv)(const FN(bw_plan) *pl, const FN(bw_pair) *t, int bad, const FA_T *x,
                           const FA_T *vp, int64_t ncols, FA_T *o, int64_t ldo, FA_T *xt)
{
    const KT *K = pl->K;
    if (!t->diag) {
        FN(bw_pvt)(K, bad, t->nk, t->nq, ncols, x, vp, o, ldo, xt, pl->bqp);
        return;
    }
    for (int64_t j = 0; j < t->nk; j += K->mr) {
        const int64_t nj = fa_min64(K->mr, t->nk - j);
        const int64_t i1 = t->kb + j - pl->lim.hi - t->i0, i = i1 > 0 ? i1 : 0;
        if (i >= t->nq) break; /* the keys from j on: seen by no row of the pair */
        FN(bw_pvt)(K, bad, nj, t->nq - i, ncols, x + i * FA_KC + j, vp + i * K->nr,
                   o + j * ldo, ldo, xt, pl->bqp);
    }
}
