/* bw16_pair.h -- the 16-bit backward's operands and one (query block, key
 * block) pair; part of bw16.c (after its plan and the forward's float32
 * storage, tiles and scoreopts parts).  The packings move 16-bit elements
 * as they are (no conversion) into the layouts of fa_bw16_kernels.gemm
 * (kernels.h): a operands as rows, b operands as pair rows.
 *
 * Per key block (BW16_KB keys; nkp of them at a fixed stride):
 *   kt  K^T in pair rows over E (b of S = Q.K^T), [ep/2][2 KB]
 *   vt  V^T in pair rows over Ev (b of dP = dO.V^T), [evp/2][2 KB]
 *   kk  K in pair rows over keys (b of dQ += dS.K), [KB/2][2 e16]
 * Per query block (BW16_BQ rows):
 *   qr, dor  Q and dO rows (a of S and dP), [BQ][ep], [BQ][evp]
 *   qt, dot  Q^T and dO^T (a of dK^T += Q^T.dS, dV^T += dO^T.P), [e16][BQ]
 * Per pair: the float32 tiles s (the scores), dp (dP), f (the soft cap's
 * derivative), [BQ][KB]; P and dS, computed from them, rounded as pair rows
 * over the queries (pp, dsp) and dS as rows (dsr).  dK and dV are accumulated
 * transposed (dK^T, dV^T: E or Ev rows x the keys), so that no tile is ever
 * transposed per pair. */

/* Is the 16-bit h NaN or Inf (exponent bits eb all set)? */
static inline int bw16_bad(uint16_t h, uint16_t eb) { return (h & eb) == eb; }

/* dst row r (ld halves) = elements (r0 + r, 0 .. n) of operand y at yo, for
 * r < nr, zero past n and for nr <= r < rpad: a operand rows. */
static void bw16_rows_of(const fa_operand *y, int64_t yo, int64_t r0, int64_t nr, int64_t n,
                         int64_t rpad, uint16_t *dst, int64_t ld)
{
    const uint16_t *src = (const uint16_t *)y->data + yo;
    for (int64_t r = 0; r < rpad; r++) {
        uint16_t *d = dst + r * ld;
        int64_t c = 0;
        if (r < nr && y->cs == 1) {
            memcpy(d, src + (r0 + r) * y->rs, (size_t)n * 2);
            c = n;
        }
        if (r < nr)
            for (; c < n; c++) d[c] = src[(r0 + r) * y->rs + c * y->cs];
        if (c < ld) memset(d + c, 0, (size_t)(ld - c) * 2);
    }
}

/* dst[c][r] (ld halves) = element (r0 + r, c) of y, c < n, r < nr; zero for
 * nr <= r < rpad and n <= c < npad.  Returns 1 if an element is NaN/Inf.
 * Whole blocks of contiguous rows are M's transpose. */
static int bw16_cols_of(const fa_bw16_kernels *M, const fa_operand *y, int64_t yo, int64_t r0,
                        int64_t nr, int64_t n, int64_t rpad, int64_t npad, uint16_t eb,
                        uint16_t *dst, int64_t ld)
{
    const uint16_t *src = (const uint16_t *)y->data + yo;
    if (nr == rpad && n == npad && nr % 16 == 0 && n % 32 == 0 && y->cs == 1)
        return M->cols(src + r0 * y->rs, y->rs, nr, n, eb, dst, ld);
    int bad = 0;
    for (int64_t c = 0; c < npad; c++) memset(dst + c * ld, 0, (size_t)rpad * 2);
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < n; c++) {
            const uint16_t h = src[(r0 + r) * y->rs + c * y->cs];
            bad |= bw16_bad(h, eb);
            dst[c * ld + r] = h;
        }
    return bad;
}

/* Is src a whole block of dword rows (contiguous rows of even stride, 4-byte
 * aligned), so that the table's kernels may move its pairs as dwords? */
static int bw16_dwords(const fa_operand *y, const uint16_t *src)
{
    return y->cs == 1 && y->rs % 2 == 0 && (uintptr_t)src % 4 == 0;
}

/* Pair rows over the columns: dst[p][2r + e] = element (r0 + r, 2p + e) of
 * y for r < nr, 2p + e < n; zero up to rpad rows and npad columns (even).
 * A whole block (no padding, dword rows) is a dword transpose by M. */
static void bw16_pairs_t(const fa_bw16_kernels *M, const fa_operand *y, int64_t yo, int64_t r0,
                         int64_t nr, int64_t n, int64_t rpad, int64_t npad, uint16_t *dst,
                         int64_t ld)
{
    const uint16_t *src = (const uint16_t *)y->data + yo;
    if (nr == rpad && n == npad && nr % 16 == 0 && n % 32 == 0 && ld % 2 == 0 &&
        bw16_dwords(y, src + r0 * y->rs)) {
        M->trans((const float *)(const void *)(src + r0 * y->rs), y->rs / 2, nr, n / 2,
                 (float *)(void *)dst, ld / 2);
        return;
    }
    for (int64_t p = 0; p < npad / 2; p++) memset(dst + p * ld, 0, (size_t)rpad * 4);
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < n; c++)
            dst[(c / 2) * ld + 2 * r + (c & 1)] = src[(r0 + r) * y->rs + c * y->cs];
}

/* Pair rows over the rows: dst[p][2c + e] = element (r0 + 2p + e, c) of y
 * for 2p + e < nr, c < n; zero up to rpad rows (even) and npad columns.
 * Returns 1 if an element is NaN/Inf.  A whole block of contiguous rows is
 * M's interleave. */
static int bw16_pairs_r(const fa_bw16_kernels *M, const fa_operand *y, int64_t yo, int64_t r0,
                        int64_t nr, int64_t n, int64_t rpad, int64_t npad, uint16_t eb,
                        uint16_t *dst, int64_t ld)
{
    const uint16_t *src = (const uint16_t *)y->data + yo;
    if (nr == rpad && n == npad && n % 16 == 0 && y->cs == 1)
        return M->inter(src + r0 * y->rs, y->rs, nr, n, eb, dst, ld);
    int bad = 0;
    for (int64_t p = 0; p < rpad / 2; p++) memset(dst + p * ld, 0, (size_t)npad * 4);
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < n; c++) {
            const uint16_t h = src[(r0 + r) * y->rs + c * y->cs];
            bad |= bw16_bad(h, eb);
            dst[(r / 2) * ld + 2 * c + (r & 1)] = h;
        }
    return bad;
}

/* gemm's product where an operand holds NaN/Inf: every term with a zero
 * factor left out (a hidden weight's 0 never meets them), the rest summed
 * in float32 in pair order. */
static void bw16_careful(int f16, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                         int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = c[i * ldc + j];
            for (int64_t p = 0; p < k; p++) {
                const uint16_t x = a[i * lda + p], y = b[(p / 2) * ldb + 2 * j + (p & 1)];
                if (!(x & 0x7fff) || !(y & 0x7fff)) continue;
                s += f16 ? fa_f16_to_f32(x) * fa_f16_to_f32(y)
                         : fa_bf16_to_f32(x) * fa_bf16_to_f32(y);
            }
            c[i * ldc + j] = s;
        }
}

/* c += a . b: the table's product, or the careful one where bad */
static void bw16_gemm(const bw16_plan *pl, void *tf, int bad, int64_t m, int64_t n, int64_t k,
                      const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                      int64_t ldc)
{
    if (bad)
        bw16_careful(pl->f16, m, n, k, a, lda, b, ldb, c, ldc);
    else
        pl->M->gemm(tf, pl->f16, 0, m, n, k, a, lda, b, ldb, c, ldc);
}

/* The final logits of the pair: S = scale (Q.K^T) from 0, then the soft cap
 * (f = 1 - tanh^2), ALiBi and the masks by the forward's code; hidden
 * positions exactly -inf (rows < nq, keys < nk).  Where the plan folds the
 * scale (> 0, and nothing between it and the masks), S is left unscaled:
 * grad_pair multiplies by it, the same product, and -inf stays -inf. */
static void bw16_scores(const bw16_plan *pl, const fa_offsets *off, const bw16_pair *t,
                        const bw16_ops *o)
{
    const fa_attention_args *a = &pl->b->fwd;
    const fa_kernels_f32 *K = pl->K;
    pl->M->gemm(o->tf, pl->f16, 1, t->qpad, t->kpad, pl->ep, o->qr, pl->ep, o->kt, 2 * BW16_KB,
                o->s, BW16_KB);
    for (int64_t i = 0; i < t->nq && !pl->fold; i++)
        K->scal(o->s + i * BW16_KB, t->nk, (float)a->scale);
    if (a->softcap > 0)
        for (int64_t i = 0; i < t->nq; i++)
            K->softcap(o->s + i * BW16_KB, o->f + i * BW16_KB, t->nk, (float)a->softcap);
    if (a->alibi.data) /* ALiBi alone: the cap is applied above */
        (void)score_opts_f32(&pl->nocap, K, off, o->s, BW16_KB, t->i0, t->nq, t->kb, t->nk, 0,
                             NULL);
    const int cut = fa_limits_cut(&pl->lim, t->i0, t->nq, t->kb, t->nk);
    apply_masks_f32(a, off, o->s, BW16_KB, t->i0, t->nq, t->kb, t->nk, cut ? &pl->lim : NULL,
                    a->pad.data != NULL, a->bool_mask.data != NULL);
}

/* The mask's gradient (fa_backward_args.dmask) at the pair's rows < nq and
 * keys < nk: P (dP - D), 0 where P is, before the soft cap's factor, from
 * the float32 scores (times sc) and dP before grad_pair takes them as
 * scratch.  P by the f32 table's expsum in float32, each row through o->tr
 * (free until the items' stores): for bfloat16 not the weights' exp2 that
 * the products' P takes (a relative 2^-13 apart). */
static void bw16_dmask(const bw16_plan *pl, const fa_bw_offsets *go, const bw16_pair *t,
                       const bw16_ops *o, float sc)
{
    const fa_attention_args *a = &pl->b->fwd;
    const fa_operand *m = &pl->b->dmask;
    const float *lse = (const float *)a->lse.data + go->lse;
    float *p = o->tr;
    for (int64_t i = 0; i < t->nq; i++) {
        const float l = lse[(t->i0 + i) * a->lse.rs], d = pl->delta[go->delta + t->i0 + i];
        if (l == -INFINITY) continue; /* nothing visible: the caller's zeros */
        const float *s = o->s + i * BW16_KB, *dp = o->dp + i * BW16_KB;
        for (int64_t j = 0; j < t->nk; j++) {
            const float x = sc * s[j];
            p[j] = l < x ? l : x; /* P never above 1 (bw_tile's clamp) */
        }
        (void)pl->K->expsum(p, p, t->nk, l);
        float *dm = (float *)m->data + go->dmask + (t->i0 + i) * m->rs + t->kb * m->cs;
        for (int64_t j = 0; j < t->nk; j++) dm[j * m->cs] = p[j] != 0 ? p[j] * (dp[j] - d) : 0;
    }
}

/* The pair's P and dS rounded as the operands of the products of want
 * (bw16_pair_run), zero outside rows < nq and keys < nk up to qpad x kpad:
 * dP = dO.V^T, P = exp(s - lse) where visible (0 where hidden or the row's
 * lse is -inf), dS = P (dP - D), by the table's grad_pair two rows at a
 * time (the float32 backward's rule: dS exactly 0 where P is).  The pass
 * that owns the pair's rows (want & 1) writes the mask's gradient where
 * asked for. */
static void bw16_tile(const bw16_plan *pl, const fa_offsets *off, const fa_bw_offsets *go,
                      const bw16_pair *t, const bw16_ops *o, int want)
{
    const fa_attention_args *a = &pl->b->fwd;
    const float *lse = (const float *)a->lse.data + go->lse;
    const float *delta = pl->delta + go->delta;
    const float sc = pl->fold ? (float)a->scale : 1.0f;
    bw16_scores(pl, off, t, o);
    pl->M->gemm(o->tf, pl->f16, 1, t->qpad, t->kpad, pl->evp, o->dor, pl->evp, o->vt,
                2 * BW16_KB, o->dp, BW16_KB);
    if ((want & 1) && pl->b->dmask.data) bw16_dmask(pl, go, t, o, sc);
    for (int64_t i = 0; i < t->qpad; i += 2) {
        float l[2], d[2];
        int live[2];
        for (int e = 0; e < 2; e++) {
            l[e] = i + e < t->nq ? lse[(t->i0 + i + e) * a->lse.rs] : -INFINITY;
            live[e] = l[e] != -INFINITY;
            d[e] = live[e] ? delta[t->i0 + i + e] : 0;
        }
        const int64_t at = i * BW16_KB;
        pl->M->grad_pair(pl->f16, o->s + at, o->dp + at, a->softcap > 0 ? o->f + at : NULL,
                         BW16_KB, t->nk, t->kpad, live, sc, l, d, want & 2 ? o->pp + at : NULL,
                         want & 2 ? o->dsp + at : NULL, want & 1 ? o->dsr + at : NULL, BW16_KB);
    }
}

/* The pair's products: dQ += dS.K into o->dq (want & 1); dV^T += dO^T.P
 * and dK^T += Q^T.dS into o->dvt, o->dkt (the pair's first key's column,
 * want & 2); P and dS rounded to 16 bits as their operands. */
static void bw16_pair_run(const bw16_plan *pl, const fa_offsets *off, const fa_bw_offsets *go,
                          const bw16_pair *t, const bw16_ops *o, int want)
{
    bw16_tile(pl, off, go, t, o, want);
    if (want & 1)
        bw16_gemm(pl, o->tf, o->kbad, t->qpad, pl->e16, t->kpad, o->dsr, BW16_KB, o->kk,
                  2 * pl->e16, o->dq, pl->e16);
    if (want & 2) {
        bw16_gemm(pl, o->tf, o->dobad, pl->ev16, t->kpad, t->qpad, o->dot, BW16_BQ, o->pp,
                  2 * BW16_KB, o->dvt, o->ldt);
        bw16_gemm(pl, o->tf, o->qbad, pl->e16, t->kpad, t->qpad, o->qt, BW16_BQ, o->dsp,
                  2 * BW16_KB, o->dkt, o->ldt);
    }
}
