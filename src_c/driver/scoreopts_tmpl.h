/* scoreopts_tmpl.h -- the score options of fastattn.reference: the soft cap
 * and ALiBi, applied to a score tile after Q.K^T and before the masks; the
 * sink and the log-sum-exp, applied once per row when it is finalised (after
 * the key-split merge, never per key block).  Scores are in the units of
 * the call: log2 units (base2: Q packed times scale * log2(e)) or natural
 * units, so the cap and the slopes are multiplied by u = log2(e) or 1 (tanh's
 * form c tanh(s / c) holds in any unit with c in that unit).  Part of
 * attention_tmpl.h (FA_SFX; FA_T, KT): FN(score_opts) -> score_opts_f32,
 * score_opts_f64; likewise row_finish. */

/* The soft cap, then ALiBi, on the scores s[ni x nk] (ld lds) of rows
 * i0.., keys kb.. of the batch index at off (base2: log2 units), one pass
 * per row (the ISA's score_row), ALiBi's -slope |p(i) - j| with p(i) = i +
 * causal_offset and the slope in the scores' units.  vmax NULL or [ni x
 * vw]: filled with the rows' lane-wise maxima (as qk's), unless the
 * distances are not all exact in FA_T (as the reference's cast of the
 * integer): then ALiBi is applied in double, row by row, and 0 is returned
 * (vmax left unfilled); otherwise 1. */
static int FN(score_opts)(const fa_attention_args *a, const KT *K, const fa_offsets *off, FA_T *s,
                          int64_t lds, int64_t i0, int64_t ni, int64_t kb, int64_t nk, int base2,
                          FA_T *vmax)
{
    const double u = base2 ? FA_LOG2E : 1.0;
    const FA_T cap = a->softcap > 0 ? (FA_T)(a->softcap * u) : 0; /* finite: plan_make checks */
    double slope = 0;
    if (a->alibi.data) {
        const double big = (double)FA_TYPE_MAX(FA_SFX);
        slope = ((const double *)a->alibi.data)[off->al] * u;
        slope = slope > big ? big : (slope < -big ? -big : slope); /* never inf * 0 */
    }
    const double exact = FA_IS_F64(FA_SFX) ? 0x1p53 : 0x1p24;
    const int64_t p0 = i0 + a->causal_offset - kb; /* row 0's key at distance 0 */
    const double far = fmax(fabs((double)p0), fabs((double)(p0 + ni - 1)));
    if (slope == 0 || far + FA_KC < exact) {
        for (int64_t i = 0; i < ni; i++)
            K->score_row(s + i * lds, nk, cap, (FA_T)(p0 + i), (FA_T)slope,
                         vmax ? vmax + i * K->vw : NULL);
        return 1;
    }
    for (int64_t i = 0; i < ni; i++) { /* distances beyond FA_T's integers: in double */
        FA_T *row = s + i * lds;
        K->score_row(row, nk, cap, 0, 0, NULL);
        for (int64_t j = 0; j < nk; j++)
            row[j] -= (FA_T)slope * (FA_T)fabs((double)(p0 + i) - (double)j);
    }
    return 0;
}

/* Row i of the batch index at off, finalised from its streaming state m, l
 * (base2: log2 units): the sink joins the denominator, M = max(m, t),
 * l' = l E(m - M) + E(t - M); the log-sum-exp (natural log) M + log l' is
 * written if asked for.  Returns the factor E(m - M) / l' that turns the
 * row's accumulated o into its output: 0 for a row with nothing visible
 * (l = 0; lse -inf, sink or not), NaN for a NaN row (lse NaN). */
static FA_T FN(row_finish)(const fa_attention_args *a, const fa_offsets *off, int64_t i, FA_T m,
                           FA_T l, int base2)
{
    FA_T inv;
    double lse;
    if (l == 0) {
        inv = 0;
        lse = -INFINITY;
    } else if (l != l) {
        inv = (FA_T)NAN;
        lse = NAN;
    } else if (a->sinks.data) {
        const double t = ((const double *)a->sinks.data)[off->sk] * (base2 ? FA_LOG2E : 1.0);
        const double M = t > (double)m ? t : (double)m;
        const double f = base2 ? exp2((double)m - M) : exp((double)m - M);
        const double lt = (double)l * f + (base2 ? exp2(t - M) : exp(t - M));
        inv = (FA_T)(f / lt);
        lse = fa_lse_of(M, lt, base2);
    } else {
        inv = (FA_T)1 / l;
        lse = fa_lse_of((double)m, (double)l, base2);
    }
    if (a->lse.data) ((FA_T *)a->lse.data)[off->lse + i * a->lse.rs] = (FA_T)lse;
    return inv;
}
