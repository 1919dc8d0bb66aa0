/* band_tmpl.h -- one band of query rows against one key block of the
 * streaming loop: Q.K^T, the masks, the online softmax update, P.V.  Q.K^T
 * and P.V run on the packed K and V blocks, or, decoding (the direct path:
 * at most FA_DIRECT_MAX_ROWS query rows), straight from K and V in place.
 * Part of attention_tmpl.h (FA_SFX; FA_T, KT): FN(stream_band) ->
 * stream_band_f32, stream_band_f64; FN(fa_stream) -> fa_stream_f32, ... */

/* One streaming call (batch b, query rows [r0, r1), a key range), and the
 * key block [kb, kb + nk) in progress: what every tile and band reads. */
typedef struct FN(fa_stream) {
    const fa_attention_args *a;
    const KT *K;
    const fa_offsets *off;
    const fa_mask_summary *ms; /* the boolean mask's block states */
    fa_limits lim;             /* the causal and window limits (window.h) */
    FN(fa_scratch) *sc;
    int64_t r0, r1, ldv, mcp, ntiles;
    int base2;     /* scores in log2 units, exp2 (see stream_rows) */
    int direct;    /* decoding: no packing (see stream_rows) */
    int64_t kb, nk; /* the key block */
    int pad_some;  /* some key of the block is padding */
    int v_bad;     /* its packed values hold NaN/Inf */
    int64_t tk[FA_MAX_CHUNK_MC]; /* per tile: keys of the block some row sees (0: skip) */
    int tmixed[FA_MAX_CHUNK_MC]; /* per tile: the boolean mask must be applied */
} FN(fa_stream);

#if !FA_IS_F64(FA_SFX)
/* Decoding bfloat16 queries over bfloat16 keys and values on the tier's
 * dp16 kernels where they take the packed (scaled) queries exactly
 * (dp16_f32q, kernels.h: the rows widened by one VPUNPCK per 16 elements
 * where qk_direct's natural order takes two instructions; their sums in
 * another order than the float32 path's, which float32 queries keep: a KV
 * cache's results are bitwise those of its widened keys and values), for
 * bands of 2 rows or more (a grouped-query step; one row read faster by
 * qk_direct's, 4.7 against 5.5 ms at 32 heads of 4096 keys on an Intel
 * Xeon with AMX): the n keys from j0 of the block as rows into *t, the
 * next FA_KC keys' for the prefetches.  NULL where those kernels do not
 * run. */
static const fa_krows *FN(band_rows)(const FN(fa_stream) *st, int64_t nb, int64_t j0, int64_t n,
                                     fa_krows *t)
{
    const fa_attention_args *a = st->a;
    if (!st->direct || nb < 2 || a->storage != FA_BFLOAT16 || a->kv_storage != FA_BFLOAT16 ||
        !st->K->dp16_f32q || a->E % 32 || a->E > FA_FLASH16_MAX_E || a->Ev % 32)
        return NULL;
    const uint16_t *k = (const uint16_t *)a->k.data + st->off->k;
    const uint16_t *v = (const uint16_t *)a->v.data + st->off->v;
    const int64_t kb = st->kb + j0, end = fa_min64(kb + n + FA_KC, a->S);
    t->n = n, t->kbytes = a->E * 2, t->vrun = 0;
    for (int64_t j = 0; j < n + FA_KC; j++)
        t->k[j] = kb + j < end ? (const void *)(k + (kb + j) * a->k.rs) : NULL;
    for (int64_t j = 0; j < n; j++) t->v[j] = v + (kb + j) * a->v.rs;
    return t;
}
#endif

/* s[nb x nk_b] = the scores of rows ib.. (tile t, row g of it) against the
 * keys j0.. of the block (j0 a multiple of nr), from the packed K block or
 * (direct) K in place, or its rows (band_rows); with vmax, their row
 * maxima. */
static void FN(band_scores)(const FN(fa_stream) *st, int64_t t, int64_t g, int64_t nb,
                            int64_t j0, int64_t nk_b, FA_T *s, FA_T *vmax, const fa_krows *rows)
{
    const fa_attention_args *a = st->a;
    const KT *K = st->K;
    const int64_t E = a->E;
    const FA_T *qp = st->sc->qp + (t * st->mcp + g) * E;
    if (rows) { /* the queries came scaled: c = 1 */
        K->qk_rows_dp16(nb, E, a->Ev, (FA_T)1, qp, rows, s, FA_KC);
        return;
    }
#if !FA_IS_F64(FA_SFX)
    if (st->direct && FN(kv_half)(a)) { /* 16-bit keys widened in registers */
        const uint16_t *kbase = (const uint16_t *)a->k.data + st->off->k;
        K->qk_direct_h[a->kv_storage - FA_FLOAT16](nb, nk_b, E, qp, kbase + (st->kb + j0) * a->k.rs,
                                                a->k.rs, s, FA_KC);
        return;
    }
#endif
    if (st->direct) {
        const FA_T *kbase = (const FA_T *)a->k.data + st->off->k;
        K->qk_direct(nb, nk_b, E, qp, kbase + (st->kb + j0) * a->k.rs, a->k.rs, s, FA_KC);
    } else {
        K->qk(fa_round_up(nb, K->mr), fa_round_up(nk_b, K->nr), E, qp, st->sc->kp + j0 * E, s,
              FA_KC, vmax);
    }
}

/* o[nb x ldv] += p[nb x nk_b] . V (the values j0.. of the block): packed,
 * packed skipping zero weights (the block holds NaN/Inf), or (direct) V in
 * place or by its rows (band_rows) skipping them. */
static void FN(band_values)(const FN(fa_stream) *st, int64_t nb, int64_t j0, int64_t nk_b,
                            const FA_T *p, FA_T *o, const fa_krows *rows)
{
    const fa_attention_args *a = st->a;
    const KT *K = st->K;
    const int64_t ldv = st->ldv;
    if (rows) {
        K->pv_rows_dp16(nb, a->Ev, p, FA_KC, rows, o, ldv);
        return;
    }
#if !FA_IS_F64(FA_SFX)
    if (st->direct && FN(kv_half)(a)) { /* 16-bit values widened in registers */
        const uint16_t *vbase = (const uint16_t *)a->v.data + st->off->v;
        K->pv_direct_h[a->kv_storage - FA_FLOAT16](nb, nk_b, a->Ev, p, FA_KC,
                                                vbase + (st->kb + j0) * a->v.rs, a->v.rs, o, ldv);
        return;
    }
#endif
    if (st->direct) {
        const FA_T *vbase = (const FA_T *)a->v.data + st->off->v;
        K->pv_direct(nb, nk_b, a->Ev, p, FA_KC, vbase + (st->kb + j0) * a->v.rs, a->v.rs, o,
                     ldv);
    } else if (st->v_bad) {
        FN(pv_careful)(K, nb, nk_b, ldv, p, FA_KC, st->sc->vp + j0 * K->nr, o, ldv);
    } else {
        K->pv(nb, nk_b, ldv, p, FA_KC, st->sc->vp + j0 * K->nr, FA_KC * K->nr, o, ldv);
    }
}

/* Rows ib .. ib + nb (row g of tile t) against the keys j0 .. nk_b of the
 * block (j0 a multiple of nr); edge: the causal or window limits cross the
 * tile. */
static void FN(stream_band)(const FN(fa_stream) *st, int64_t t, int64_t g, int64_t ib,
                            int64_t nb, int64_t j0, int64_t nk_b, int edge)
{
    const fa_attention_args *a = st->a;
    FN(fa_scratch) *sc = st->sc;
    const int64_t kb = st->kb + j0, ldv = st->ldv, row = ib - st->r0, n = nk_b - j0;
    const int cut = edge && fa_limits_cut(&st->lim, ib, nb, kb, n);
    const int bmixed = st->tmixed[t]; /* the boolean mask: neither all hidden nor all visible */
    const int masked = cut || st->pad_some || bmixed || a->add_mask.data;
    const int opts = a->softcap > 0 || a->alibi.data; /* the scores change after Q.K^T */
    /* The row maxima come from Q.K^T's register tiles, or from the score
     * options' pass, and stand for the band's when every score computed is
     * one the softmax sees: no mask; no padded key column in Q.K^T's case */
    FA_T *s = sc->st + j0;
    FA_T *vmax = !st->direct && !masked && (opts || fa_round_up(n, st->K->nr) == n)
                     ? sc->vmax : NULL;
#if !FA_IS_F64(FA_SFX)
    fa_krows krows;
    const fa_krows *rows = FN(band_rows)(st, nb, j0, n, &krows);
#else
    const fa_krows *rows = NULL;
#endif
    FN(band_scores)(st, t, g, nb, j0, n, s, opts ? NULL : vmax, rows);
    if (opts && !FN(score_opts)(a, st->K, st->off, s, FA_KC, ib, nb, kb, n, st->base2, vmax))
        vmax = NULL;
    if (masked)
        FN(apply_masks)(a, st->off, s, FA_KC, ib, nb, kb, n, cut ? &st->lim : NULL,
                        st->pad_some, bmixed);
    FA_T *o = sc->o + row * ldv;
    /* A visible NaN score poisons its row: through the sum (exp of NaN is
     * NaN) unless no key of the row is visible yet. */
    st->K->online_softmax(nb, n, s, FA_KC, sc->m + row, sc->lv + row * st->K->vw, o, ldv,
                          st->base2, vmax);
    FN(band_values)(st, nb, j0, n, s, o, rows);
}
