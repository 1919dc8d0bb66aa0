/* tiles_tmpl.h -- the pieces the streaming and weights paths share: packing
 * Q, K and V for the micro-kernels (the kernels' own packing for a unit
 * column stride, element by element otherwise), the masks of a score tile,
 * the test that skips an all-padding block, and P.V that skips
 * zero weights.  Part of attention_tmpl.h (FA_SFX; FA_T, KT): FN(pack_q) ->
 * pack_q_f32, pack_q_f64; likewise pack_k, pack_v, apply_masks, pv_careful,
 * count_pad, any_nonfinite. */

/* 1 if the call's q, out (and add_mask) are 16-bit (float16 or bfloat16) */
static FA_ALWAYS_INLINE int FN(is_half)(const fa_attention_args *a)
{
    return a->storage == FA_FLOAT16 || a->storage == FA_BFLOAT16;
}

/* 1 if its k and v are 16-bit (a->kv_storage) */
static FA_ALWAYS_INLINE int FN(kv_half)(const fa_attention_args *a)
{
    return a->kv_storage == FA_FLOAT16 || a->kv_storage == FA_BFLOAT16;
}

/* 1 if any of x[0..n) is NaN or +-Inf: an integer test of the exponent
 * bits, which the compiler vectorises. */
static int FN(any_nonfinite)(const FA_T *x, int64_t n)
{
    const FA_UINT(FA_SFX) expo = FA_EXP_MASK(FA_SFX);
    FA_UINT(FA_SFX) acc = 0;
    for (int64_t i = 0; i < n; i++) {
        FA_UINT(FA_SFX) u;
        memcpy(&u, x + i, sizeof u);
        acc |= (FA_UINT(FA_SFX))((u & expo) == expo);
    }
    return acc != 0;
}

/* pack_k and pack_v (below) for 16-bit keys and values: the ISA's
 * converting kernels for a unit column stride, else element by element. */
static void FN(pack_k_half)(const fa_attention_args *a, const KT *K, int64_t koff, int64_t kb,
                            int64_t nk, int64_t ncols, int64_t nr, FA_T *kp)
{
    const int64_t E = a->E, rs = a->k.rs, cs = a->k.cs;
#if !FA_IS_F64(FA_SFX)
    if (cs == 1 || E <= 1) {
        K->pack_k_h[a->kv_storage - FA_FLOAT16](nk, ncols, E,
                                             (const uint16_t *)a->k.data + koff + kb * rs, rs, kp);
        return;
    }
#endif
    for (int64_t j = 0; j < ncols; j++) {
        FA_T *dst = kp + (j / nr) * E * nr + (j % nr);
        for (int64_t d = 0; d < E; d++)
            dst[d * nr] = j < nk ? FN(ld)(a->k.data, koff + (kb + j) * rs + d * cs, a->kv_storage) : 0;
    }
}

static int FN(pack_v_half)(const fa_attention_args *a, const KT *K, int64_t voff, int64_t kb,
                           int64_t nk, int64_t ldv, int64_t nr, FA_T *vp)
{
    const int64_t Ev = a->Ev, rs = a->v.rs, cs = a->v.cs, npan = ldv / nr;
#if !FA_IS_F64(FA_SFX)
    if (cs == 1 || Ev <= 1)
        return K->pack_v_h[a->kv_storage - FA_FLOAT16](
            nk, Ev, ldv, (const uint16_t *)a->v.data + voff + kb * rs, rs, vp, FA_KC * nr);
#endif
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < ldv; c++)
            vp[(c / nr) * FA_KC * nr + j * nr + c % nr] =
                c < Ev ? FN(ld)(a->v.data, voff + (kb + j) * rs + c * cs, a->kv_storage) : 0;
    int bad = 0;
    for (int64_t p = 0; p < npan; p++) bad |= FN(any_nonfinite)(vp + p * FA_KC * nr, nk * nr);
    return bad;
}

/* Qp[r x E] = sc * q[b][i0 + r][:] for r < n; rows n .. rpad zero. */
static void FN(pack_q)(const fa_attention_args *a, int64_t qoff, int64_t i0, int64_t n,
                       int64_t rpad, FA_T *qp, FA_T sc)
{
    const int64_t E = a->E, rs = a->q.rs, cs = a->q.cs;
    if (FN(is_half)(a)) { /* widened once per tile */
        for (int64_t r = 0; r < n; r++) {
            FA_T *dst = qp + r * E;
#if !FA_IS_F64(FA_SFX)
            if (cs == 1) {
                const KT *K = KCUR();
                K->widen_h[a->storage - FA_FLOAT16]((const uint16_t *)a->q.data + qoff + (i0 + r) * rs, dst, E);
                K->scal(dst, E, sc);
                continue;
            }
#endif
            for (int64_t d = 0; d < E; d++)
                dst[d] = FN(ld)(a->q.data, qoff + (i0 + r) * rs + d * cs, a->storage) * sc;
        }
        memset(qp + n * E, 0, (size_t)((rpad - n) * E) * sizeof(FA_T));
        return;
    }
    const FA_T *q = (const FA_T *)a->q.data + qoff;
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
    const int64_t E = a->E, rs = a->k.rs, cs = a->k.cs;
    if (FN(kv_half)(a)) {
        FN(pack_k_half)(a, K, koff, kb, nk, ncols, nr, kp);
        return;
    }
    const FA_T *k = (const FA_T *)a->k.data + koff;
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
    const int64_t Ev = a->Ev, rs = a->v.rs, cs = a->v.cs;
    if (FN(kv_half)(a)) return FN(pack_v_half)(a, K, voff, kb, nk, ldv, nr, vp);
    const FA_T *v = (const FA_T *)a->v.data + voff;
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
 * by every mask (the causal and window limits if cut is not NULL: they cut
 * the block; the boolean mask if bool_some: the block is not all visible);
 * returns nothing: hidden entries are exactly -inf.  Scores are in natural
 * units whenever there is an additive mask (FN(attention)). */
static void FN(apply_masks)(const fa_attention_args *a, const fa_offsets *off, FA_T *s,
                            int64_t lds, int64_t i0, int64_t ni, int64_t kb, int64_t nk,
                            const fa_limits *cut, int pad_some, int bool_some)
{
    const FA_T NEG = (FA_T)-INFINITY;
    for (int64_t i = 0; i < ni; i++) {
        FA_T *row = s + i * lds;
        /* the additive mask first: the hiding masks then override whatever it
         * gave (a NaN or +inf mask entry at a hidden position is harmless) */
        if (a->add_mask.data && FN(is_half)(a)) {
            const int64_t m0 = off->am + (i0 + i) * a->add_mask.rs + kb * a->add_mask.cs;
            for (int64_t j = 0; j < nk; j++) {
                FA_T x = FN(ld)(a->add_mask.data, m0 + j * a->add_mask.cs, a->storage);
                row[j] = (x == NEG) ? NEG : row[j] + x;
            }
        } else if (a->add_mask.data) {
            const FA_T *m = (const FA_T *)a->add_mask.data + off->am +
                            (i0 + i) * a->add_mask.rs + kb * a->add_mask.cs;
            const int64_t cs = a->add_mask.cs;
            for (int64_t j = 0; j < nk; j++) {
                FA_T x = m[j * cs];
                row[j] = (x == NEG) ? NEG : row[j] + x;
            }
        }
        if (cut) { /* keys first <= j < lim visible */
            const int64_t first = cut->has_lo ? fa_min64(i0 + i + cut->lo - kb, nk) : 0;
            int64_t lim = cut->has_hi ? i0 + i + cut->hi - kb + 1 : nk;
            if (lim < 0) lim = 0;
            for (int64_t j = 0; j < first; j++) row[j] = NEG;
            for (int64_t j = lim; j < nk; j++) row[j] = NEG;
        }
        if (pad_some) {
            const uint8_t *p = (const uint8_t *)a->pad.data + off->pad + kb * a->pad.cs;
            const int64_t cs = a->pad.cs;
            for (int64_t j = 0; j < nk; j++) row[j] = p[j * cs] ? NEG : row[j];
        }
        if (bool_some) {
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

/* Number of padded keys in [kb, kb + nk) for batch offset poff. */
static int64_t FN(count_pad)(const fa_attention_args *a, int64_t poff, int64_t kb, int64_t nk)
{
    const uint8_t *p = (const uint8_t *)a->pad.data + poff;
    int64_t c = 0;
    for (int64_t j = kb; j < kb + nk; j++) c += p[j * a->pad.cs] != 0;
    return c;
}
