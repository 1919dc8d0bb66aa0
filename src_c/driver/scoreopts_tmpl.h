/* scoreopts_tmpl.h -- the score options of fastattn.reference: the soft cap
 * and ALiBi, applied to a score tile after Q.K^T and before the masks; the
 * sink and the log-sum-exp, applied once per row when it is finalised (after
 * the key-split merge, never per key block).  Scores are in the units of
 * the call: log2 units (base2: Q packed times scale * log2(e)) or natural
 * units, so the cap and the slopes are multiplied by u = log2(e) or 1 (tanh's
 * form c tanh(s / c) holds in any unit with c in that unit).  Part of
 * attention_tmpl.h (FA_SFX; FA_T, KT): FN(score_opts) -> score_opts_f32,
 * score_opts_f64; likewise alibi_rows, row_finish. */

/* s[ni x nk] (ld lds), rows i0.., keys kb..: s -= slope |p(i) - j| with
 * p(i) = i + causal_offset, slope in the scores' units: the ISA's kernel
 * while the distances are exact in FA_T (as the reference's cast of the
 * integer), beyond that in double. */
static void FN(alibi_rows)(const fa_attention_args *a, const KT *K, FA_T slope, FA_T *s,
                           int64_t lds, int64_t i0, int64_t ni, int64_t kb, int64_t nk)
{
    const double exact = FA_IS_F64(FA_SFX) ? 0x1p53 : 0x1p24;
    for (int64_t i = 0; i < ni; i++) {
        FA_T *row = s + i * lds;
        const int64_t p = i0 + i + a->causal_offset - kb; /* the key at distance 0 */
        if (fabs((double)p) + FA_KC < exact)
            K->alibi(row, nk, (FA_T)p, slope);
        else
            for (int64_t j = 0; j < nk; j++) row[j] -= slope * (FA_T)fabs((double)p - (double)j);
    }
}

/* The soft cap, then ALiBi, on the scores s[ni x nk] of rows i0.., keys
 * kb.. of the batch index at off (base2: log2 units). */
static void FN(score_opts)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                           FA_T *s, int64_t lds, int64_t i0, int64_t ni, int64_t kb, int64_t nk,
                           int base2)
{
    const double u = base2 ? FA_LOG2E : 1.0;
    if (a->softcap > 0) {
        const FA_T cap = (FA_T)(a->softcap * u); /* finite: plan_make checks */
        for (int64_t i = 0; i < ni; i++) K->softcap(s + i * lds, nk, cap);
    }
    if (a->alibi.data) {
        double slope = ((const double *)a->alibi.data)[off->al] * u;
        const double big = (double)FA_TYPE_MAX(FA_SFX);
        slope = slope > big ? big : (slope < -big ? -big : slope); /* never inf * 0 */
        FN(alibi_rows)(a, K, (FA_T)slope, s, lds, i0, ni, kb, nk);
    }
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
        lse = base2 ? (M + log2(lt)) * FA_LN2 : M + log(lt);
    } else {
        inv = (FA_T)1 / l;
        lse = base2 ? ((double)m + log2((double)l)) * FA_LN2 : (double)m + log((double)l);
    }
    if (a->lse.data) ((FA_T *)a->lse.data)[off->lse + i * a->lse.rs] = (FA_T)lse;
    return inv;
}
