/* stream_tmpl.h -- the streaming loop: online softmax over key blocks, no
 * L x S buffer.  Part of attention_tmpl.h (FA_SFX; FA_T, KT):
 * FN(stream_rows) -> stream_rows_f32, stream_rows_f64; likewise
 * stream_start, tile_keys, stream_block, stream_tile. */

/* Q packed (scaled) tile by tile, and every row's state reset: m = -inf,
 * lv = 0 (the sums, lane-wise), o = 0. */
static void FN(stream_start)(const FN(fa_stream) *st)
{
    const fa_attention_args *a = st->a;
    FN(fa_scratch) *sc = st->sc;
    const int64_t E = a->E, mcp = st->mcp, nrows = st->r1 - st->r0;
    const FA_T qscale = (FA_T)(st->base2 ? a->scale * FA_LOG2E : a->scale);
    for (int64_t t = 0; t < st->ntiles; t++) {
        int64_t i0 = st->r0 + t * mcp, ni = fa_min64(st->r1 - i0, mcp);
        FN(pack_q)(a, st->off->q, i0, ni, st->direct ? ni : fa_round_up(ni, st->K->mr),
                   sc->qp + t * mcp * E, qscale);
    }
    for (int64_t i = 0; i < nrows; i++) sc->m[i] = (FA_T)-INFINITY;
    memset(sc->lv, 0, (size_t)(nrows * st->K->vw) * sizeof(FA_T));
    memset(sc->o, 0, (size_t)(nrows * st->ldv) * sizeof(FA_T));
}

/* The keys of the block that some row of tile t sees: st->tk[t] (0: the
 * tile skips the block: wholly right or wholly left of its rows' windows,
 * or the boolean mask hides it all) and st->tmixed[t] (the boolean mask is
 * neither all hidden nor all visible there: it must be applied).  The
 * mask's state comes from the summary of the whole (tile, block), rescanned
 * only when the causal or window bound cuts the block. */
static void FN(tile_keys)(FN(fa_stream) *st, int64_t t)
{
    const fa_attention_args *a = st->a;
    const int64_t kb = st->kb, i0 = st->r0 + t * st->mcp, ni = fa_min64(st->r1 - i0, st->mcp);
    int64_t nk_t = st->nk;
    st->tk[t] = 0;
    st->tmixed[t] = 0;
    if (st->lim.has_hi) {
        int64_t lim = i0 + ni + st->lim.hi - kb;
        if (lim <= 0) return; /* the block wholly right of the tile's window */
        if (lim < nk_t) nk_t = lim;
    }
    if (fa_limits_none(&st->lim, i0, ni, kb, nk_t)) return; /* wholly left of it */
    if (a->bool_mask.data) {
        int state = fa_mask_summary_at(st->ms, st->off->bms, i0 / st->mcp, kb / FA_KC);
        if (state == FA_BLK_MIXED && nk_t < fa_min64(a->S - kb, FA_KC)) {
            const int64_t rs = a->bool_mask.rs, cs = a->bool_mask.cs;
            const uint8_t *m = (const uint8_t *)a->bool_mask.data + st->off->bm;
            state = fa_bool_block_state(m + i0 * rs + kb * cs, rs, cs, ni, nk_t);
        }
        if (state == FA_BLK_HIDDEN) return;
        st->tmixed[t] = state == FA_BLK_MIXED;
    }
    st->tk[t] = nk_t;
}

/* Tile t (rows i0 .. i0 + ni) against the first st->tk[t] keys of the
 * block.  A tile that the causal diagonal or the window's right edge
 * crosses is cut into bands of mr rows (one register tile high), each
 * computing only the keys up to the last its last row sees: the tile's
 * hidden triangle is not computed, exponentiated or multiplied by V; where
 * the window's left edge crosses it, each band starts at the nr-panel
 * holding the first key its first row sees.  The keys left out are hidden
 * from every row of the band, so they would add exact zeros. */
static void FN(stream_tile)(const FN(fa_stream) *st, int64_t t)
{
    const fa_limits *w = &st->lim;
    const int64_t kb = st->kb, i0 = st->r0 + t * st->mcp, ni = fa_min64(st->r1 - i0, st->mcp);
    const int64_t nk_t = st->tk[t], nr = st->K->nr;
    if (nk_t == 0) return;
    const int diag = w->has_hi && kb + nk_t - 1 > i0 + w->hi;
    const int ledge = w->has_lo && kb < i0 + ni - 1 + w->lo;
    const int64_t band = (diag || ledge) && !st->direct ? st->K->mr : ni;
    for (int64_t g = 0; g < ni; g += band) {
        const int64_t ib = i0 + g, nb = fa_min64(ni - g, band);
        int64_t nk_b = nk_t, j0 = 0;
        if (diag) {
            int64_t lim = ib + nb + w->hi - kb;
            if (lim <= 0) continue; /* no key of the block is visible yet */
            if (lim < nk_b) nk_b = lim;
        }
        if (ledge && ib + w->lo > kb) {
            j0 = (ib + w->lo - kb) / nr * nr;
            if (j0 >= nk_b) continue; /* every key of the block is left of the window */
        }
        FN(stream_band)(st, t, g, ib, nb, j0, nk_b, diag || ledge);
    }
}

/* The key block [kb, kb + nk): skipped if all padding or seen by no tile;
 * K and V packed (unless direct), then every tile that sees it. */
static void FN(stream_block)(FN(fa_stream) *st, int64_t kb, int64_t nk)
{
    const fa_attention_args *a = st->a;
    st->kb = kb;
    st->nk = nk;
    st->pad_some = 0;
    st->v_bad = 0;
    if (a->pad.data) {
        int64_t np = FN(count_pad)(a, st->off->pad, kb, nk);
        if (np == nk) return; /* every key of the block is padding */
        st->pad_some = np > 0;
    }
    int seen = 0;
    for (int64_t t = 0; t < st->ntiles; t++) {
        FN(tile_keys)(st, t);
        seen |= st->tk[t] > 0;
    }
    if (!seen) return;
    if (!st->direct) {
        const int64_t nr = st->K->nr;
        FN(pack_k)(a, st->K, st->off->k, kb, nk, fa_round_up(nk, nr), nr, st->sc->kp);
        st->v_bad = FN(pack_v)(a, st->K, st->off->v, kb, nk, st->ldv, nr, st->sc->vp);
    }
    for (int64_t t = 0; t < st->ntiles; t++) FN(stream_tile)(st, t);
}

/* Streaming attention for batch offsets off, query rows [r0, r1), keys
 * [k0, k1): online softmax over key blocks; the state (m, l, o) of each row
 * is left in the scratch (unnormalised).  With base2, the scores are in
 * log2 units (Q scaled by scale * log2(e)) and exponentiated by exp2: one
 * multiplication less per score; without it (scale * log2(e) would
 * overflow the type, or an additive mask is given: see plan_tmpl.h),
 * natural units and exp. */
static void FN(stream_rows)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                            const fa_mask_summary *ms, int64_t r0, int64_t r1, int64_t k0,
                            int64_t k1, int64_t ldv, int base2, FN(fa_scratch) *sc)
{
    const int64_t mcp = fa_round_up(FA_MC, K->mr); /* the ISA's tile height */
    FN(fa_stream) st = {.a = a, .K = K, .off = off, .ms = ms, .lim = fa_limits_of(a), .sc = sc,
                        .r0 = r0, .r1 = r1, .ldv = ldv, .mcp = mcp,
                        .ntiles = fa_div_up(r1 - r0, mcp), .base2 = base2};
    /* Decoding (a few query rows): dot products straight from K and V, no
     * packing.  Decided by the problem, not the chunk, so every row takes
     * the same path whatever the thread count (bitwise reproducibility). */
    st.direct = a->L <= FA_DIRECT_MAX_ROWS && (a->k.cs == 1 || a->E <= 1) &&
                (a->v.cs == 1 || a->Ev <= 1);
    FN(stream_start)(&st);
    /* the keys some row sees: [kbeg, kend), kbeg on the block grid of k0
     * (every row meets the same blocks whatever its chunk) */
    int64_t kbeg = k0, kend = k1;
    if (st.lim.has_hi) {
        int64_t lim = r1 - 1 + st.lim.hi + 1; /* keys < lim visible to some row */
        if (lim < kend) kend = lim;
    }
    if (st.lim.has_lo && r0 + st.lim.lo > k0) kbeg = k0 + (r0 + st.lim.lo - k0) / FA_KC * FA_KC;
    for (int64_t kb = kbeg; kb < kend; kb += FA_KC)
        FN(stream_block)(&st, kb, fa_min64(kend - kb, FA_KC));
    K->lane_sums(r1 - r0, sc->lv, sc->l);
}
