/* attention_tmpl.h -- the attention drivers, written once over the element
 * type.  Included twice by attention.c with FA_T, FA_SFX, KT (the kernel
 * table type) and KCUR() (the current table) defined. */
#define FA_CAT2_(a, b) a##_##b
#define FA_CAT2(a, b) FA_CAT2_(a, b)
#define FN(name) FA_CAT2(name, FA_SFX)

/* 1 if any of x[0..n) is NaN or +-Inf: an integer test of the exponent
 * bits, which the compiler vectorises. */
static int FN(any_nonfinite)(const FA_T *x, int64_t n)
{
    const FA_UINT expo = FA_EXP_MASK;
    FA_UINT acc = 0;
    for (int64_t i = 0; i < n; i++) {
        FA_UINT u;
        memcpy(&u, x + i, sizeof u);
        acc |= (FA_UINT)((u & expo) == expo);
    }
    return acc != 0;
}

/* e^x, or 2^x with base2 (scalar: the key-split merge factors). */
static FA_T FN(expb)(double x, int base2) { return (FA_T)(base2 ? exp2(x) : exp(x)); }

/* Qp[r x E] = sc * q[b][i0 + r][:] for r < n; rows n .. rpad zero. */
static void FN(pack_q)(const fa_attention_args *a, int64_t qoff, int64_t i0, int64_t n,
                       int64_t rpad, FA_T *qp, FA_T sc)
{
    const FA_T *q = (const FA_T *)a->q.data + qoff;
    const int64_t E = a->E, rs = a->q.rs, cs = a->q.cs;
    for (int64_t r = 0; r < n; r++) {
        const FA_T *src = q + (i0 + r) * rs;
        FA_T *dst = qp + r * E;
        if (cs == 1)
            for (int64_t d = 0; d < E; d++) dst[d] = src[d] * sc;
        else
            for (int64_t d = 0; d < E; d++) dst[d] = src[d * cs] * sc;
    }
    memset(qp + n * E, 0, (size_t)((rpad - n) * E) * sizeof(FA_T));
}

/* Kp panel-major [ncols/nr][E][nr] from keys kb .. kb+nk of batch koff:
 * the ISA's kernel for unit column stride, else element by element. */
static void FN(pack_k)(const fa_attention_args *a, const KT *K, int64_t koff, int64_t kb,
                       int64_t nk, int64_t ncols, int64_t nr, FA_T *kp)
{
    const FA_T *k = (const FA_T *)a->k.data + koff;
    const int64_t E = a->E, rs = a->k.rs, cs = a->k.cs;
    if (cs == 1 || E <= 1) {
        K->pack_k(nk, ncols, E, k + kb * rs, rs, kp);
        return;
    }
    for (int64_t j = 0; j < ncols; j++) {
        FA_T *dst = kp + (j / nr) * E * nr + (j % nr);
        if (j < nk) {
            const FA_T *src = k + (kb + j) * rs;
            for (int64_t d = 0; d < E; d++) dst[d * nr] = src[d * cs];
        } else {
            for (int64_t d = 0; d < E; d++) dst[d * nr] = 0;
        }
    }
}

/* Vp from values kb .. kb+nk, panel-major: panel p holds columns p*nr ..
 * p*nr+nr-1 as [nk x nr] at vp + p*FA_KC*nr (columns past Ev zero), so the
 * P.V micro-kernel streams each panel sequentially.  ldv (a multiple of nr)
 * is the padded row length.  Returns 1 if any entry is NaN/Inf.  The ISA's
 * kernel for unit column stride, else element by element. */
static int FN(pack_v)(const fa_attention_args *a, const KT *K, int64_t voff, int64_t kb,
                      int64_t nk, int64_t ldv, int64_t nr, FA_T *vp)
{
    const FA_T *v = (const FA_T *)a->v.data + voff;
    const int64_t Ev = a->Ev, rs = a->v.rs, cs = a->v.cs;
    if (cs == 1 || Ev <= 1) return K->pack_v(nk, Ev, ldv, v + kb * rs, rs, vp, FA_KC * nr);
    const int64_t npan = ldv / nr;
    for (int64_t j = 0; j < nk; j++) { /* each value row is read once, front to back */
        const FA_T *src = v + (kb + j) * rs;
        for (int64_t p = 0; p < npan; p++) {
            FA_T *dst = vp + p * FA_KC * nr + j * nr;
            const int64_t c0 = p * nr, w = Ev - c0 < nr ? Ev - c0 : nr;
            if (cs == 1)
                for (int64_t c = 0; c < w; c++) dst[c] = src[c0 + c];
            else
                for (int64_t c = 0; c < w; c++) dst[c] = src[(c0 + c) * cs];
            for (int64_t c = w; c < nr; c++) dst[c] = 0;
        }
    }
    int bad = 0;
    for (int64_t p = 0; p < npan; p++) bad |= FN(any_nonfinite)(vp + p * FA_KC * nr, nk * nr);
    return bad;
}

/* Hide (set to -inf) or shift the scores s[ni x nk] of rows i0.., keys kb..
 * by every mask; returns nothing: hidden entries are exactly -inf.  Scores
 * are in natural units whenever there is an additive mask (FN(attention)). */
static void FN(apply_masks)(const fa_attention_args *a, const fa_offsets *off, FA_T *s,
                            int64_t lds, int64_t i0, int64_t ni, int64_t kb, int64_t nk,
                            int causal_diag, int pad_some)
{
    const FA_T NEG = (FA_T)-INFINITY;
    for (int64_t i = 0; i < ni; i++) {
        FA_T *row = s + i * lds;
        /* the additive mask first: the hiding masks then override whatever it
         * gave (a NaN or +inf mask entry at a hidden position is harmless) */
        if (a->add_mask.data) {
            const FA_T *m = (const FA_T *)a->add_mask.data + off->am +
                            (i0 + i) * a->add_mask.rs + kb * a->add_mask.cs;
            const int64_t cs = a->add_mask.cs;
            for (int64_t j = 0; j < nk; j++) {
                FA_T x = m[j * cs];
                row[j] = (x == NEG) ? NEG : row[j] + x;
            }
        }
        if (causal_diag) {
            int64_t lim = i0 + i + a->causal_offset - kb + 1; /* keys j < lim visible */
            if (lim < 0) lim = 0;
            for (int64_t j = lim; j < nk; j++) row[j] = NEG;
        }
        if (pad_some) {
            const uint8_t *p = (const uint8_t *)a->pad.data + off->pad + kb * a->pad.cs;
            const int64_t cs = a->pad.cs;
            for (int64_t j = 0; j < nk; j++) row[j] = p[j * cs] ? NEG : row[j];
        }
        if (a->bool_mask.data) {
            const uint8_t *m = (const uint8_t *)a->bool_mask.data + off->bm +
                               (i0 + i) * a->bool_mask.rs + kb * a->bool_mask.cs;
            const int64_t cs = a->bool_mask.cs;
            if (cs == 1)
                for (int64_t j = 0; j < nk; j++) row[j] = m[j] ? row[j] : NEG;
            else
                for (int64_t j = 0; j < nk; j++) row[j] = m[j * cs] ? row[j] : NEG;
        }
    }
}

/* o[ni x ncols] += p . vp (panel-major, see pack_v), skipping exact-zero
 * weights: used when the value block holds NaN/Inf, so that a hidden (or
 * zero-weight) key cannot leak 0 * Inf = NaN into the output.  It runs the
 * ISA's own fused multiply-add in the same key order as K->pv, so the
 * visible keys give bitwise the same sums as the fast kernel. */
static void FN(pv_careful)(const KT *K, int64_t ni, int64_t nk, int64_t ncols, const FA_T *p,
                           int64_t ldp, const FA_T *vp, FA_T *o, int64_t ldo)
{
    const int64_t nr = K->nr;
    for (int64_t c = 0; c < ncols; c += nr)
        K->pv_direct(ni, nk, nr, p, ldp, vp + (c / nr) * FA_KC * nr, nr, o + c, ldo);
}

/* Per-thread scratch of the drivers. */
typedef struct FN(fa_scratch) {
    FA_T *qp, *kp, *vp, *st, *o, *m, *l, *vmax;
} FN(fa_scratch);

/* Number of padded keys in [kb, kb + nk) for batch offset poff. */
static int64_t FN(count_pad)(const fa_attention_args *a, int64_t poff, int64_t kb, int64_t nk)
{
    const uint8_t *p = (const uint8_t *)a->pad.data + poff;
    int64_t c = 0;
    for (int64_t j = kb; j < kb + nk; j++) c += p[j * a->pad.cs] != 0;
    return c;
}

/* Is the bool-mask tile rows i0.., keys kb.. wholly hidden? */
static int FN(bool_tile_hidden)(const fa_attention_args *a, const fa_offsets *off, int64_t i0,
                                int64_t ni, int64_t kb, int64_t nk)
{
    const uint8_t *m = (const uint8_t *)a->bool_mask.data + off->bm;
    for (int64_t i = 0; i < ni; i++) {
        const uint8_t *row = m + (i0 + i) * a->bool_mask.rs + kb * a->bool_mask.cs;
        for (int64_t j = 0; j < nk; j++)
            if (row[j * a->bool_mask.cs]) return 0;
        if (a->bool_mask.rs == 0) break; /* every row is the same row */
    }
    return 1;
}

/* Streaming attention for batch b, query rows [r0, r1), keys [k0, k1):
 * online softmax over key blocks; the state (m, l, o) of each row is left in
 * the scratch (unnormalised).  No L x S buffer.  With base2, the scores are
 * in log2 units (Q scaled by scale * log2(e)) and exponentiated by exp2: one
 * multiplication less per score; without it (scale * log2(e) would overflow
 * the type, or an additive mask is given: see FN(attention)), natural
 * units and exp. */
static void FN(stream_rows)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                            int64_t r0, int64_t r1, int64_t k0, int64_t k1, int64_t ldv,
                            int base2, FN(fa_scratch) *sc)
{
    const FA_T qscale = (FA_T)(base2 ? a->scale * FA_LOG2E : a->scale);
    const int64_t E = a->E, mr = K->mr, nr = K->nr, mcp = (FA_MC + mr - 1) / mr * mr;
    /* mcp: the ISA's tile height, FA_MC rounded up to a multiple of mr */
    const int64_t nrows = r1 - r0, ntiles = (nrows + mcp - 1) / mcp;
    /* Decoding (a few query rows): dot products straight from K and V, no
     * packing.  Decided by the problem, not the chunk, so every row takes the
     * same path whatever the thread count (bitwise reproducibility). */
    const int direct = a->L <= FA_DIRECT_MAX_ROWS && (a->k.cs == 1 || E <= 1) &&
                       (a->v.cs == 1 || a->Ev <= 1);
    const FA_T *kbase = (const FA_T *)a->k.data + off->k, *vbase = (const FA_T *)a->v.data + off->v;
    for (int64_t t = 0; t < ntiles; t++) {
        int64_t i0 = r0 + t * mcp, ni = r1 - i0 < mcp ? r1 - i0 : mcp;
        FN(pack_q)(a, off->q, i0, ni, direct ? ni : (ni + mr - 1) / mr * mr, sc->qp + t * mcp * E,
                   qscale);
    }
    for (int64_t i = 0; i < nrows; i++) { sc->m[i] = (FA_T)-INFINITY; sc->l[i] = 0; }
    memset(sc->o, 0, (size_t)(nrows * ldv) * sizeof(FA_T));

    int64_t kend = k1;
    if (a->causal) {
        int64_t lim = r1 - 1 + a->causal_offset + 1; /* keys < lim visible to some row */
        if (lim < kend) kend = lim;
    }
    for (int64_t kb = k0; kb < kend; kb += FA_KC) {
        const int64_t nk = kend - kb < FA_KC ? kend - kb : FA_KC;
        int pad_some = 0;
        if (a->pad.data) {
            int64_t np = FN(count_pad)(a, off->pad, kb, nk);
            if (np == nk) continue;           /* every key of the block is padding */
            pad_some = np > 0;
        }
        const int64_t ncols = (nk + nr - 1) / nr * nr;
        int v_bad = 0;
        if (!direct) {
            FN(pack_k)(a, K, off->k, kb, nk, ncols, nr, sc->kp);
            v_bad = FN(pack_v)(a, K, off->v, kb, nk, ldv, nr, sc->vp);
        }
        for (int64_t t = 0; t < ntiles; t++) {
            const int64_t i0 = r0 + t * mcp, ni = r1 - i0 < mcp ? r1 - i0 : mcp;
            int64_t nk_t = nk; /* keys of this block that some row of the tile sees */
            if (a->causal) {
                int64_t lim = i0 + ni + a->causal_offset - kb;
                if (lim <= 0) continue; /* tile wholly in the future of the block */
                if (lim < nk_t) nk_t = lim;
            }
            if (a->bool_mask.data && FN(bool_tile_hidden)(a, off, i0, ni, kb, nk_t)) continue;
            /* A tile that the causal diagonal crosses is cut into bands of mr
             * rows (one register tile high), each computing only the keys its
             * last row sees: the tile's hidden triangle is not computed,
             * exponentiated or multiplied by V.  The keys left out are hidden
             * from every row of the band, so they would add exact zeros. */
            const int diag = a->causal && kb + nk_t - 1 > i0 + a->causal_offset;
            const int64_t band = diag && !direct ? mr : ni;
            for (int64_t g = 0; g < ni; g += band) {
                const int64_t ib = i0 + g, nb = ni - g < band ? ni - g : band;
                int64_t nk_b = nk_t;
                if (diag) {
                    int64_t lim = ib + nb + a->causal_offset - kb;
                    if (lim <= 0) continue; /* no key of the block is visible yet */
                    if (lim < nk_b) nk_b = lim;
                }
                const int causal_diag = diag && kb + nk_b - 1 > ib + a->causal_offset;
                const int64_t ncols_b = (nk_b + nr - 1) / nr * nr;
                const int masked =
                    causal_diag || pad_some || a->bool_mask.data || a->add_mask.data;
                /* Q.K^T's row maxima (from its register tiles) stand for the
                 * band's only when every score it computes is one the softmax
                 * sees: no mask, no padded key column */
                FA_T *st = sc->st, *vmax = !direct && !masked && ncols_b == nk_b ? sc->vmax : NULL;
                const FA_T *qp = sc->qp + (t * mcp + g) * E;
                if (direct)
                    K->qk_direct(nb, nk_b, E, qp, kbase + kb * a->k.rs, a->k.rs, st, FA_KC);
                else
                    K->qk((nb + mr - 1) / mr * mr, ncols_b, E, qp, sc->kp, st, FA_KC, vmax);
                if (masked)
                    FN(apply_masks)(a, off, st, FA_KC, ib, nb, kb, nk_b, causal_diag, pad_some);
                FA_T *o = sc->o + (ib - r0) * ldv;
                /* A visible NaN score poisons its row: through the sum (exp of
                 * NaN is NaN) unless no key of the row is visible yet. */
                K->online_softmax(nb, nk_b, st, FA_KC, sc->m + (ib - r0), sc->l + (ib - r0), o,
                                  ldv, base2, vmax);
                if (direct)
                    K->pv_direct(nb, nk_b, a->Ev, st, FA_KC, vbase + kb * a->v.rs, a->v.rs, o,
                                 ldv);
                else if (v_bad)
                    FN(pv_careful)(K, nb, nk_b, ldv, st, FA_KC, sc->vp, o, ldv);
                else
                    K->pv(nb, nk_b, ldv, st, FA_KC, sc->vp, FA_KC * nr, o, ldv);
            }
        }
    }
}

/* out[b, r0 .. r1, :] = o / l (0 for rows with no visible key). */
static void FN(write_out)(const fa_attention_args *a, const fa_offsets *off, int64_t r0,
                          int64_t r1, int64_t ldv, const FA_T *o, const FA_T *l)
{
    FA_T *out = (FA_T *)a->out.data + off->o;
    for (int64_t i = r0; i < r1; i++) {
        const FA_T li = l[i - r0];
        const FA_T inv = li == 0 ? (FA_T)0 : (FA_T)1 / li;
        const FA_T *src = o + (i - r0) * ldv;
        FA_T *dst = out + i * a->out.rs;
        for (int64_t c = 0; c < a->Ev; c++) dst[c * a->out.cs] = src[c] * inv;
    }
}

/* Weights path for batch b, query rows [i0, i0 + ni): writes the rows of the
 * full weight matrix, then out = W . V. */
static void FN(weights_rows)(const fa_attention_args *a, const KT *K, const fa_offsets *off,
                             int64_t b, int64_t i0, int64_t ni, int64_t ldv, FN(fa_scratch) *sc)
{
    const int64_t E = a->E, S = a->S, mr = K->mr, nr = K->nr;
    const FA_T NEG = (FA_T)-INFINITY;
    FA_T *W = (FA_T *)a->weights + (b * a->L + i0) * S;
    FN(pack_q)(a, off->q, i0, ni, (ni + mr - 1) / mr * mr, sc->qp, (FA_T)a->scale);
    for (int64_t kb = 0; kb < S; kb += FA_KC) {
        const int64_t nk = S - kb < FA_KC ? S - kb : FA_KC;
        int skip = 0, pad_some = 0, causal_diag = 0;
        if (a->causal) {
            skip = kb > i0 + ni - 1 + a->causal_offset;
            causal_diag = kb + nk - 1 > i0 + a->causal_offset;
        }
        if (!skip && a->pad.data) {
            int64_t np = FN(count_pad)(a, off->pad, kb, nk);
            skip = np == nk;
            pad_some = np > 0;
        }
        if (!skip && a->bool_mask.data) skip = FN(bool_tile_hidden)(a, off, i0, ni, kb, nk);
        if (skip) {
            for (int64_t i = 0; i < ni; i++)
                for (int64_t j = 0; j < nk; j++) W[i * S + kb + j] = NEG;
            continue;
        }
        const int64_t ncols = (nk + nr - 1) / nr * nr;
        FN(pack_k)(a, K, off->k, kb, nk, ncols, nr, sc->kp);
        K->qk((ni + mr - 1) / mr * mr, ncols, E, sc->qp, sc->kp, sc->st, FA_KC, NULL);
        if (causal_diag || pad_some || a->bool_mask.data || a->add_mask.data)
            FN(apply_masks)(a, off, sc->st, FA_KC, i0, ni, kb, nk, causal_diag, pad_some);
        for (int64_t i = 0; i < ni; i++)
            memcpy(W + i * S + kb, sc->st + i * FA_KC, (size_t)nk * sizeof(FA_T));
    }
    for (int64_t i = 0; i < ni; i++) {
        FA_T *row = W + i * S;
        int has_nan = 0;
        FA_T mx = S > 0 ? K->rowmax(row, S, &has_nan) : NEG;
        if (has_nan || mx == (FA_T)INFINITY) {
            /* as scipy: a NaN or +inf score makes every visible weight NaN */
            for (int64_t j = 0; j < S; j++) row[j] = row[j] == NEG ? (FA_T)0 : (FA_T)NAN;
        } else if (mx == NEG) {
            memset(row, 0, (size_t)S * sizeof(FA_T)); /* no visible key */
        } else {
            FA_T sum = K->expsum(row, row, S, mx);
            K->scal(row, S, (FA_T)1 / sum);
        }
    }
    memset(sc->o, 0, (size_t)(ni * ldv) * sizeof(FA_T));
    for (int64_t kb = 0; kb < S; kb += FA_KC) {
        const int64_t nk = S - kb < FA_KC ? S - kb : FA_KC;
        const int v_bad = FN(pack_v)(a, K, off->v, kb, nk, ldv, nr, sc->vp);
        if (v_bad)
            FN(pv_careful)(K, ni, nk, ldv, W + kb, S, sc->vp, sc->o, ldv);
        else
            K->pv(ni, nk, ldv, W + kb, S, sc->vp, FA_KC * nr, sc->o, ldv);
    }
    for (int64_t i = 0; i < ni; i++) sc->l[i] = 1;
    FN(write_out)(a, off, i0, i0 + ni, ldv, sc->o, sc->l);
}

/* Merge the key-split partials of one row: part[s] = {m, l, o[ldv]}. */
static void FN(merge_row)(const FA_T *part, int64_t nsplit, int64_t ldv, int base2, FA_T *o,
                          FA_T *l)
{
    const int64_t stride = ldv + 2;
    FA_T M = (FA_T)-INFINITY;
    for (int64_t s = 0; s < nsplit; s++)
        if (part[s * stride] > M) M = part[s * stride];
    FA_T lsum = 0;
    for (int64_t c = 0; c < ldv; c++) o[c] = 0;
    for (int64_t s = 0; s < nsplit; s++) {
        const FA_T *p = part + s * stride;
        FA_T ls = p[1];
        if (ls != ls) { lsum = (FA_T)NAN; continue; }
        if (p[0] == (FA_T)-INFINITY) continue; /* this chunk saw no visible key */
        FA_T f = FN(expb)((double)(p[0] - M), base2);
        lsum += ls * f;
        for (int64_t c = 0; c < ldv; c++) o[c] += p[2 + c] * f;
    }
    *l = lsum;
}

/* Everything a work item needs, shared read-only by the threads. */
typedef struct FN(fa_plan) {
    const fa_attention_args *a;
    const KT *K;
    FA_T **bufs, *part;
    int64_t ldv, Epad, rows, qrows, mcp, kc_e, ntiles, chunk_tiles, nchunks, nsplit, split_kc,
        nbatch;
    int base2; /* streaming scores in log2 units (see stream_rows) */
} FN(fa_plan);

/* Work item it: (query chunk, batch, key split) or, with weights, (batch, tile). */
static void FN(run_item)(const FN(fa_plan) *pl, int64_t it, int tid)
{
    const fa_attention_args *a = pl->a;
    const KT *K = pl->K;
    const int64_t L = a->L, S = a->S, ldv = pl->ldv, ntiles = pl->ntiles;
    const int64_t nbatch = pl->nbatch, nsplit = pl->nsplit, split_kc = pl->split_kc;
    const int64_t chunk_tiles = pl->chunk_tiles, nchunks = pl->nchunks;
    FA_T *part = pl->part;
    FA_T *base = pl->bufs[tid];
    FN(fa_scratch) sc;
    sc.qp = base;
    sc.kp = sc.qp + pl->qrows * pl->Epad;
    sc.vp = sc.kp + pl->kc_e;
    sc.st = sc.vp + FA_KC * ldv;
    sc.o = sc.st + pl->mcp * FA_KC;
    sc.m = sc.o + pl->rows * ldv;
    sc.l = sc.m + pl->rows;
    sc.vmax = sc.l + pl->rows; /* mcp x vw */
    fa_offsets off;
    if (a->weights) {
        int64_t b = it / ntiles, t = it % ntiles;
        if (a->causal) t = ntiles - 1 - t; /* the longest rows first */
        fa_batch_offsets(a, b, &off);
        int64_t i0 = t * pl->mcp;
        FN(weights_rows)(a, K, &off, b, i0, L - i0 < pl->mcp ? L - i0 : pl->mcp, ldv, &sc);
        return;
    }
    int64_t c = it / (nbatch * nsplit), rest = it % (nbatch * nsplit);
    if (a->causal) c = nchunks - 1 - c;
    int64_t b = rest / nsplit, s = rest % nsplit;
    fa_batch_offsets(a, b, &off);
    int64_t r0 = c * chunk_tiles * pl->mcp;
    int64_t r1 = r0 + chunk_tiles * pl->mcp < L ? r0 + chunk_tiles * pl->mcp : L;
    int64_t k0 = s * split_kc, k1 = k0 + split_kc < S ? k0 + split_kc : S;
    FN(stream_rows)(a, K, &off, r0, r1, k0, k1, ldv, pl->base2, &sc);
    if (nsplit == 1) {
        FN(write_out)(a, &off, r0, r1, ldv, sc.o, sc.l);
    } else {
        for (int64_t i = r0; i < r1; i++) {
            FA_T *p = part + ((b * L + i) * nsplit + s) * (ldv + 2);
            p[0] = sc.m[i - r0];
            p[1] = sc.l[i - r0];
            memcpy(p + 2, sc.o + (i - r0) * ldv, (size_t)ldv * sizeof(FA_T));
        }
    }
}

/* Merge the key-split partials of every row of batch b and write them out. */
static void FN(merge_batch)(const FN(fa_plan) *pl, int64_t b, int tid)
{
    const fa_attention_args *a = pl->a;
    const int64_t L = a->L, nsplit = pl->nsplit, ldv = pl->ldv;
    FA_T *base = pl->bufs[tid];
    fa_offsets off;
    fa_batch_offsets(a, b, &off);
    for (int64_t i = 0; i < L; i++) {
        FN(merge_row)(pl->part + (b * L + i) * nsplit * (ldv + 2), nsplit, ldv, pl->base2, base,
                      base + ldv);
        FN(write_out)(a, &off, i, i + 1, ldv, base, base + ldv);
    }
}

static int FN(attention)(const fa_attention_args *a)
{
    const KT *K = KCUR();
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    int64_t nbatch = 1;
    for (int d = 0; d < a->nbatch_dims; d++) nbatch *= a->batch_shape[d];
    if (nbatch == 0 || L == 0 || (Ev == 0 && !a->weights)) return FA_OK;
    const int64_t ldv = (Ev + K->nr - 1) / K->nr * K->nr; /* V panels of nr columns */
    const int64_t Epad = E > 0 ? E : 1;
    int nt = fa_resolve_threads(a->num_threads);
    double work = (double)nbatch * (double)L * (double)S * (double)(E + Ev);
    if (work < FA_PARALLEL_MIN_WORK) nt = 1;

    const int64_t mcp = (FA_MC + K->mr - 1) / K->mr * K->mr; /* tile rows: FA_MC padded to mr */
    const int64_t ntiles = (L + mcp - 1) / mcp;
    int64_t chunk_tiles = 1, nsplit = 1, split_kc = S;
    if (a->weights == NULL) {
        /* Query chunks share one packed K/V block: as long as there are
         * enough chunks to keep the threads busy (chunking never changes the
         * result: every row is computed the same way in any chunk). */
        int64_t want = (nbatch * ntiles + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);
        chunk_tiles = want < 1 ? 1 : (want > FA_MAX_CHUNK_MC ? FA_MAX_CHUNK_MC : want);
        /* Decoding: few query tiles, many keys: split the keys, by the
         * problem's size alone. */
        if (nbatch * ntiles < FA_SPLIT_MAX_ITEMS && S > 2 * FA_SPLIT_KC) {
            split_kc = FA_SPLIT_KC;
            if ((S + split_kc - 1) / split_kc > 64) split_kc = (S + 63) / 64;
            split_kc = (split_kc + FA_KC - 1) / FA_KC * FA_KC;
            nsplit = (S + split_kc - 1) / split_kc;
        }
    }
    if (nsplit > 1) chunk_tiles = 1;
    const int64_t nchunks = (ntiles + chunk_tiles - 1) / chunk_tiles;
    const int64_t nitems = a->weights ? nbatch * ntiles : nbatch * nchunks * nsplit;
    if ((int64_t)nt > nitems) nt = (int)nitems;
    if (nt < 1) nt = 1;

    /* All scratch is allocated here, before any output is touched. */
    const int64_t rows = a->weights ? mcp : chunk_tiles * mcp;
    const int64_t qrows = a->weights ? mcp : chunk_tiles * mcp;
    const int64_t kc_e = FA_KC * Epad;
    const size_t per = (size_t)(qrows * Epad + kc_e + FA_KC * ldv + mcp * FA_KC +
                                rows * ldv + 2 * rows + mcp * K->vw + 64);
    FA_T **bufs = (FA_T **)fa_calloc((size_t)nt, sizeof(FA_T *));
    FA_T *part = NULL;
    int status = FA_OK;
    if (!bufs) return FA_ENOMEM;
    for (int t = 0; t < nt; t++) {
        bufs[t] = (FA_T *)fa_malloc(per * sizeof(FA_T));
        if (!bufs[t]) { status = FA_ENOMEM; break; }
    }
    if (status == FA_OK && nsplit > 1) {
        part = (FA_T *)fa_malloc((size_t)(nbatch * L * nsplit * (ldv + 2)) * sizeof(FA_T));
        if (!part) status = FA_ENOMEM;
    }
    if (status != FA_OK) {
        for (int t = 0; t < nt; t++) fa_free(bufs[t]);
        fa_free(bufs);
        return status;
    }

    FN(fa_plan) pl = {a, K, bufs, part, ldv, Epad, rows, qrows, mcp, kc_e, ntiles,
                      chunk_tiles, nchunks, nsplit, split_kc, nbatch,
                      /* log2 units unless scale * log2(e) overflows, or an additive
                       * mask is given: x * log2(e) would turn a mask of -FLT_MAX (a
                       * row of them gives uniform weights) into -inf (a hidden row) */
                      a->add_mask.data == NULL && fabs(a->scale * FA_LOG2E) <= (double)FA_T_MAX};
    if (nt > 1) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
        for (int64_t it = 0; it < nitems; it++) FN(run_item)(&pl, it, FA_OMP_THREAD_NUM());
    } else {
        for (int64_t it = 0; it < nitems; it++) FN(run_item)(&pl, it, 0);
    }
    if (nsplit > 1) {
        if (nt > 1) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
            for (int64_t b = 0; b < nbatch; b++) FN(merge_batch)(&pl, b, FA_OMP_THREAD_NUM());
        } else {
            for (int64_t b = 0; b < nbatch; b++) FN(merge_batch)(&pl, b, 0);
        }
    }
    for (int t = 0; t < nt; t++) fa_free(bufs[t]);
    fa_free(bufs);
    fa_free(part);
    return FA_OK;
}

#undef FN
