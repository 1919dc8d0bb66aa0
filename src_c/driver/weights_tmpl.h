/* weights_tmpl.h -- the path that materialises the attention weights
 * (return_weights): the rows of the full L x S weight matrix, then
 * out = W . V.  Part of attention_tmpl.h (FA_SFX; FA_T, KT):
 * FN(weights_rows) -> weights_rows_f32, weights_rows_f64; likewise
 * weights_scores, weights_softmax. */

/* W[ni x S] = the masked scores of rows i0 .. i0 + ni (Q packed in sc->qp);
 * blocks wholly hidden are -inf without computing them. */
static void FN(weights_scores)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                               const fa_mask_summary *ms, int64_t t, int64_t ni, FA_T *W,
                               FN(fa_scratch) *sc)
{
    const int64_t E = a->E, S = a->S, nr = K->nr, i0 = t * ms->mcp;
    const fa_limits w = fa_limits_of(a);
    for (int64_t kb = 0; kb < S; kb += FA_KC) {
        const int64_t nk = fa_min64(S - kb, FA_KC);
        int skip = fa_limits_none(&w, i0, ni, kb, nk), pad_some = 0, bool_some = 0;
        const int cut = fa_limits_cut(&w, i0, ni, kb, nk);
        if (!skip && a->pad.data) {
            int64_t np = FN(count_pad)(a, off->pad, kb, nk);
            skip = np == nk;
            pad_some = np > 0;
        }
        if (!skip && a->bool_mask.data) {
            const int state = fa_mask_summary_at(ms, off->bms, t, kb / FA_KC);
            skip = state == FA_BLK_HIDDEN;
            bool_some = state == FA_BLK_MIXED;
        }
        if (skip) {
            for (int64_t i = 0; i < ni; i++)
                for (int64_t j = 0; j < nk; j++) W[i * S + kb + j] = (FA_T)-INFINITY;
            continue;
        }
        const int64_t ncols = fa_round_up(nk, nr);
        FN(pack_k)(a, K, off->k, kb, nk, ncols, nr, sc->kp);
        K->qk(fa_round_up(ni, K->mr), ncols, E, sc->qp, sc->kp, sc->st, FA_KC, NULL);
        if (a->softcap > 0 || a->alibi.data)
            FN(score_opts)(a, K, off, sc->st, FA_KC, i0, ni, kb, nk, 0, NULL);
        if (cut || pad_some || bool_some || a->add_mask.data)
            FN(apply_masks)(a, off, sc->st, FA_KC, i0, ni, kb, nk, cut ? &w : NULL, pad_some,
                            bool_some);
        for (int64_t i = 0; i < ni; i++)
            memcpy(W + i * S + kb, sc->st + i * FA_KC, (size_t)nk * sizeof(FA_T));
    }
}

/* Each of the ni rows of W (length S; rows i0.. of the batch index at off)
 * becomes its softmax, as scipy's, with the sink's exp in the denominator
 * if any (shifted by M = max(row max, sink)); the rows' lse if asked for. */
static void FN(weights_softmax)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                                int64_t i0, int64_t ni, int64_t S, FA_T *W)
{
    const FA_T NEG = (FA_T)-INFINITY;
    for (int64_t i = 0; i < ni; i++) {
        FA_T *row = W + i * S;
        int has_nan = 0;
        FA_T mx = S > 0 ? K->rowmax(row, S, &has_nan) : NEG, lse;
        if (has_nan || mx == (FA_T)INFINITY) {
            /* as scipy: a NaN or +inf score makes every visible weight NaN */
            for (int64_t j = 0; j < S; j++) row[j] = row[j] == NEG ? (FA_T)0 : (FA_T)NAN;
            lse = (FA_T)NAN;
        } else if (mx == NEG) {
            memset(row, 0, (size_t)S * sizeof(FA_T)); /* no visible key */
            lse = NEG;
        } else {
            FA_T M = mx, t = NEG;
            if (a->sinks.data) {
                t = (FA_T)((const double *)a->sinks.data)[off->sk];
                if (t > M) M = t;
            }
            FA_T sum = K->expsum(row, row, S, M);
            if (a->sinks.data) sum += (FA_T)exp((double)t - (double)M);
            K->scal(row, S, (FA_T)1 / sum);
            lse = (FA_T)((double)M + log((double)sum));
        }
        if (a->lse.data) ((FA_T *)a->lse.data)[off->lse + (i0 + i) * a->lse.rs] = lse;
    }
}

/* Weights path for batch b, query tile t (rows [i0, i0 + ni), i0 = t mcp):
 * writes the rows of the full weight matrix, then out = W . V. */
static void FN(weights_rows)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                             const fa_mask_summary *ms, int64_t b, int64_t t, int64_t ni,
                             int64_t ldv, FN(fa_scratch) *sc)
{
    const int64_t S = a->S, nr = K->nr, i0 = t * ms->mcp;
    const int half = FN(is_half)(a); /* 16-bit weights: computed in sc->w, then rounded */
    FA_T *W = half ? sc->w : (FA_T *)a->weights + (b * a->L + i0) * S;
    FN(pack_q)(a, off->q, i0, ni, fa_round_up(ni, K->mr), sc->qp, (FA_T)a->scale);
    FN(weights_scores)(a, K, off, ms, t, ni, W, sc);
    FN(weights_softmax)(a, K, off, i0, ni, S, W);
    if (half)
        for (int64_t i = 0; i < ni * S; i++) FN(st)(a->weights, (b * a->L + i0) * S + i, a->storage, W[i]);
    memset(sc->o, 0, (size_t)(ni * ldv) * sizeof(FA_T));
    for (int64_t kb = 0; kb < S; kb += FA_KC) {
        const int64_t nk = fa_min64(S - kb, FA_KC);
        const int v_bad = FN(pack_v)(a, K, off->v, kb, nk, ldv, nr, sc->vp);
        if (v_bad)
            FN(pv_careful)(K, ni, nk, ldv, W + kb, S, sc->vp, sc->o, ldv);
        else
            K->pv(ni, nk, ldv, W + kb, S, sc->vp, FA_KC * nr, sc->o, ldv);
    }
    for (int64_t i = 0; i < ni; i++) sc->l[i] = 1;
    FN(write_out)(a, off, i0, i0 + ni, ldv, sc->o, sc->l, NULL, 0);
}
