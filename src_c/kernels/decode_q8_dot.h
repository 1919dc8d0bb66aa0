/* decode_q8_dot.h -- Q.K^T and P.V of the int8 KV cache's kernel on integer
 * dot products (the qd_* of the mapping's FA_SIMD_Q8_DOT: simd/q8_dot_avx2.h,
 * simd/q8_dot_avx512.h), on avx2 and the x86 bfloat16 tiers; included by
 * kernels/decode_q8_tmpl.h (which defines Q8, Q8(blk), NB, RB,
 * Q8_ROW_CASES, Q8(prefetch) and the float Q8(pv) it falls back to), names
 * Q8(name) -> name_q8_<FA_ISA_NAME> (qk_dot_q8_amx, ...).  Every sum is an
 * exact integer and every float32 step is per element, so each tier gives
 * these products the same bits, whatever its width QD_W.
 *
 * Q.K^T: each query row quantised once per item to int16 with its own
 * scale, q16 = rint((q / a) 32767), a = max|q_r| (error <= 2^-16 a per
 * element, plus the float32 rounding of the quotient); the keys' int8
 * levels sign-extended to int16, QD_W keys at a time into a buffer that
 * serves every row; int32 sums (exact: |q16 k8| <= 32767 * 128 < 2^22, a
 * pair < 2^23, E/2 <= 128 pairs < 2^30 for E <= FA_Q8_DOT_MAX_E), the QD_W
 * keys' partial vectors reduced by one transpose-add; score j =
 * ((scale (a / 32767)) k_scale[j]) dot, in float32.
 * Where the mapping also has VPDPBUSD (QD_BYTE_ROWS: the x86 bfloat16
 * tiers), Q.K^T takes the same q16 as two byte planes against the int8
 * levels themselves, the same integers (Q8(qk_bytes) below).
 * P.V: per (row, key block) w_j = p_j v_scale[j] quantised to int16 with
 * scale b = max_j |w_j|: rint(w_j fl(32767 / b)) (error <= 2^-16 b per
 * weight, plus float32 roundings of 2^-8 levels; a zero weight, so every
 * hidden key, is exactly 0 and adds nothing); value pairs (key j, j + 1)
 * interleaved to int16 pairs per column; int32 sums in registers over the
 * block (|w16 v8| < 2^22, a pair < 2^23, FA_Q8_KC/2 = 64 pairs < 2^29),
 * then o += ((float)sum / 32767) b once per block.  Rows r0 .. r0+R
 * (Q8(rows)) with a NaN or infinity in a query run the float Q8(scores)
 * (such a row's output is NaN), and a block whose weights are not all
 * finite (a non-finite value scale), or so small that 32767 / b overflows
 * (b < 2^-113), the float Q8(pv). */
#define FA_Q8_DOT_MAX_E 256 /* the int32 sums of Q.K^T are exact up to here */
#define Q8_EP(E) (((E) + 31) / 32 * 32) /* a quantised row's length, zeros after E */

/* max |q[d]|, d < E; -1 if one is a NaN or infinity */
static float Q8(absmax)(const float *q, int64_t E)
{
    const int64_t Evec = E / VW * VW;
    vf mx = vf_zero(), bad = vf_zero();
    for (int64_t d = 0; d < Evec; d += VW) {
        const vf x = vf_load(q + d);
        mx = vf_max(vf_abs(x), mx);
        bad = vf_add(bad, vf_mul(x, vf_zero())); /* NaN once an element is NaN or inf */
    }
    float a = vf_hmax(mx);
    if (vf_hsum(bad) != 0) return -1;
    for (int64_t d = Evec; d < E; d++) {
        const float m = fabsf(q[d]);
        if (!(m <= FLT_MAX)) return -1;
        a = m > a ? m : a;
    }
    return a;
}

/* q16[r*Ep + 0..Ep) and sq[r] = a_r / 32767 for the R rows at qr; 0 if a
 * row has a NaN or infinity.  Each level is rint((q / a) 32767) in float32,
 * ties to even, by vectors as by the scalars of the last E % VW. */
static int Q8(quant_q)(int R, int64_t E, const float *const *qr, int16_t *q16, float *sq)
{
    const int64_t Ep = Q8_EP(E), Evec = E / VW * VW;
    for (int r = 0; r < R; r++) {
        const float a = Q8(absmax)(qr[r], E);
        int16_t *o = q16 + r * Ep;
        if (a < 0) return 0;
        const int64_t z = a > 0 ? E : 0; /* levels below z are written next */
        memset(o + z, 0, (size_t)(Ep - z) * sizeof(int16_t));
        if (a > 0) {
            const vf va = vf_set1(a), top = vf_set1(32767.0f);
            for (int64_t d = 0; d < Evec; d += VW)
                qd_quant(o + d, vf_div(vf_load(qr[r] + d), va), top);
            for (int64_t d = Evec; d < E; d++) o[d] = (int16_t)rintf((qr[r][d] / a) * 32767.0f);
        }
        sq[r] = a / 32767.0f;
    }
    return 1;
}

/* Keys j0 .. j0+m (m <= QD_W) of block t as int16 rows of kq,
 * FA_Q8_DOT_MAX_E apart (a constant: one base register addresses all QD_W
 * rows), zeros from E to Ep and in the rows from m; their value rows and
 * the next block's keys asked for. */
static void Q8(widen_keys)(const fa_q8_item *it, const Q8(blk) *t, int64_t j0, int64_t m,
                           int16_t *kq)
{
    const int64_t E = it->E, Ep = Q8_EP(E), Ew = E / (2 * QD_W) * (2 * QD_W);
    for (int64_t l = 0; l < m; l++) {
        const int8_t *kp = t->k[j0 + l];
        int16_t *kr = kq + l * FA_Q8_DOT_MAX_E;
        Q8(prefetch)(it, t, j0 + l);
#pragma GCC unroll 4
        for (int64_t d = 0; d < Ew; d += 2 * QD_W) qd_store(kr + d, qd_widen(kp + d));
        if (Ew < E) qd_store(kr + Ew, qd_widen_part(kp + Ew, E - Ew));
        /* zeros to Ep (past E + 2 QD_W on avx2) */
        for (int64_t d = Ew < E ? Ew + 2 * QD_W : Ew; d < Ep; d += 2 * QD_W)
            qd_store(kr + d, qd_zero());
    }
    for (int64_t l = m; l < QD_W; l++)
        memset(kq + l * FA_Q8_DOT_MAX_E, 0, (size_t)Ep * sizeof(int16_t));
}

/* s[r*NB + jj] = ((scale sq[r]) ks[jj]) (q16_r . k8[jj]) for the R rows and
 * the keys of block t (lanes past t->n: scale 0). */
static void Q8(qk_dot)(int R, const fa_q8_item *it, const int16_t *q16, const float *sq,
                       const Q8(blk) *t, float *restrict s)
{
    const int64_t Ep = Q8_EP(it->E);
    int16_t kq[QD_W * FA_Q8_DOT_MAX_E];
    for (int64_t j0 = 0; j0 < t->n; j0 += QD_W) {
        Q8(widen_keys)(it, t, j0, t->n - j0 < QD_W ? t->n - j0 : QD_W, kq);
        for (int r = 0; r < R; r++) {
            qd_vi acc[QD_W];
#pragma GCC unroll 16
            for (int l = 0; l < QD_W; l++) acc[l] = qd_zero();
            for (int64_t d = 0; d < Ep; d += 2 * QD_W) {
                const qd_vi qv = qd_load(q16 + r * Ep + d);
#pragma GCC unroll 16
                for (int l = 0; l < QD_W; l++)
                    acc[l] = qd_dp(acc[l], qv, qd_load(kq + l * FA_Q8_DOT_MAX_E + d));
            }
            const vf c = vf_mul(vf_set1(it->scale * sq[r]), vf_load(t->ks + j0));
            vf_store(s + r * NB + j0, vf_mul(c, qd_to_f(qd_hsum_lanes(acc))));
        }
    }
}

#if defined(QD_BYTE_ROWS)
/* Q.K^T on bytes (the mappings with QD_BYTE_ROWS: VPDPBUSD).  A group of
 * RG = 4, 2 or 1 query rows shares each vector: row g takes its W = 64 / RG
 * bytes g W .. (g + 1) W, W consecutive dimensions (so E must be a
 * multiple of W); a key's W bytes of those dimensions, repeated RG times,
 * serve all the group's rows in one product.  No key is widened to int16,
 * and the dword partial sums are added by one 4 x 4 transpose-add per four
 * keys and, for RG < 4, one or two lane folds (where Q8(qk_dot) reduces
 * QD_W lanes per row per key).  Each q16 is split as 256 qh + ql,
 * ql = q16 & 255 (unsigned, VPDPBUSD's first operand, against the signed
 * levels k) and qh in [-128, 127] (signed, against the unsigned k + 128):
 *   q16 . k = 256 (qh . (k + 128)) - 32768 sum(qh) + ql . k,
 * each term an int32 (|256 qh . (k + 128)| <= 256 * 128 * 255 * 256 < 2^31)
 * and the result the same exact integer as Q8(qk_dot)'s, scaled by the same
 * float32 steps: the same scores, bit for bit. */
typedef struct Q8(planes) {
    int rows, n;                               /* RG; the rows it holds (zero lanes after) */
    uint8_t lo[FA_Q8_DOT_MAX_E / 16][64];      /* vector c: row g's ql[c W + 0 .. W) at g W */
    int8_t hi[FA_Q8_DOT_MAX_E / 16][64];       /* its qh */
    int32_t bias[4 * QD_BYTE_ROWS];            /* each lane: 32768 sum(qh) of its row */
    float rs[4 * QD_BYTE_ROWS];                /* each lane: scale sq[its row] */
} Q8(planes);

/* The planes of a group of RG lanes for the n (<= RG) rows r0 .. r0+n of
 * q16 (Q8(quant_q)'s rows), sq; zeros in the lanes past n. */
static void Q8(byte_planes)(const fa_q8_item *it, int r0, int RG, int n, const int16_t *q16,
                            const float *sq, Q8(planes) *pl)
{
    const int64_t E = it->E, Ep = Q8_EP(E), W = 64 / RG;
    if (n < RG) memset(pl, 0, sizeof *pl);
    pl->rows = RG, pl->n = n;
    for (int g = 0; g < n; g++) {
        const int16_t *qg = q16 + (r0 + g) * Ep;
        int32_t sum = 0;
        for (int64_t c = 0; c < E / W; c++) {
            uint8_t *lo = pl->lo[c] + g * W;
            int8_t *hi = pl->hi[c] + g * W;
            for (int64_t o = 0; o < W; o++) {
                /* u = q + 32768 > 0 (|q| <= 32767): its bytes are ql and qh + 128 */
                const uint32_t u = (uint32_t)(qg[c * W + o] + 32768);
                const int32_t h = (int32_t)(u >> 8) - 128;
                lo[o] = (uint8_t)(u & 255);
                hi[o] = (int8_t)h;
                sum += h;
            }
        }
        for (int64_t i = g * W / 4; i < (g + 1) * W / 4; i++) {
            pl->bias[i] = 32768 * sum;
            pl->rs[i] = it->scale * sq[r0 + g];
        }
    }
}

/* s[(RG gi + g)*NB + jj] = ((scale sq[g]) ks[jj]) (q16_g . k8[jj]) for the
 * rows g < RG of the NG (1 or 2) groups pl[gi] and the keys of block t, four
 * keys at a time (a last key repeated past t->n: ks is zero there); two
 * groups share each key's broadcast.  pf: ask for each key's value row and
 * the next block's key row (the pass that reads the keys first), one key's
 * lines per chunk: the four keys' asked for at once wait behind the
 * line-fill buffers (pages of 128 keys from memory took 1.19x longer). */
static FA_ALWAYS_INLINE void Q8(qk_bytes)(int RG, int NG, const fa_q8_item *it,
                                          const Q8(planes) *pl, int pf, const Q8(blk) *t,
                                          float *restrict s)
{
    const int64_t W = 64 / RG, C = it->E / W, n = t->n;
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int8_t *kr[4];
        qd_vi h[2][4], l[2][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            kr[i] = t->k[j0 + i < n ? j0 + i : n - 1];
#pragma GCC unroll 2
            for (int gi = 0; gi < NG; gi++) h[gi][i] = l[gi][i] = qd_zero();
        }
        for (int64_t c = 0; c < C; c++) {
            if (pf && c < 4 && j0 + c < n) Q8(prefetch)(it, t, j0 + c);
            qd_vi ql[2], qh[2];
#pragma GCC unroll 2
            for (int gi = 0; gi < NG; gi++)
                ql[gi] = qd_load_b(pl[gi].lo[c]), qh[gi] = qd_load_b(pl[gi].hi[c]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const qd_vi kb = qd_bytes_bcast(RG, kr[i] + W * c), ku = qd_flip(kb);
#pragma GCC unroll 2
                for (int gi = 0; gi < NG; gi++) {
                    l[gi][i] = qd_dpbu(l[gi][i], ql[gi], kb);
                    h[gi][i] = qd_dpbu(h[gi][i], ku, qh[gi]);
                }
            }
        }
        for (int64_t i = C; i < 4; i++)
            if (pf && j0 + i < n) Q8(prefetch)(it, t, j0 + i);
#pragma GCC unroll 2
        for (int gi = 0; gi < NG; gi++) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) l[gi][i] = qd_shl8_add(h[gi][i], l[gi][i]);
            const qd_vi dot = qd_sub(qd_fold_lanes(RG, qd_hsum4(l[gi])), qd_load_d(pl[gi].bias));
            const vf c = vf_mul(vf_load(pl[gi].rs), vf_bcast4(t->ks + j0));
            qd_scatter_rows(RG, s + gi * RG * NB + j0, NB, vf_mul(c, qd_to_f(dot)));
        }
    }
}
#endif

/* Q.K^T of the R rows: the first nb by the ng byte planes' groups (two of
 * 4 lanes in one pass), the rest by Q8(qk_dot). */
static void Q8(qk)(int R, const fa_q8_item *it, const int16_t *q16, const float *sq,
                   const void *planes, int ng, int nb, const Q8(blk) *t, float *restrict s)
{
#if defined(QD_BYTE_ROWS)
    const Q8(planes) *pl = planes;
    for (int g = 0, r = 0; g < ng;) {
        const int two = pl[g].rows == 4 && g + 1 < ng && pl[g + 1].rows == 4;
        float *sr = s + r * NB;
        switch (two ? 8 : pl[g].rows) {
        case 8: Q8(qk_bytes)(4, 2, it, &pl[g], g == 0, t, sr); break;
        case 4: Q8(qk_bytes)(4, 1, it, &pl[g], g == 0, t, sr); break;
        case 2: Q8(qk_bytes)(2, 1, it, &pl[g], g == 0, t, sr); break;
        default: Q8(qk_bytes)(1, 1, it, &pl[g], g == 0, t, sr); break;
        }
        r += pl[g].n + (two ? pl[g + 1].n : 0);
        g += 1 + two;
    }
#else
    (void)planes, (void)ng;
#endif
    if (nb < R) Q8(qk_dot)(R - nb, it, q16 + nb * Q8_EP(it->E), sq + nb, t, s + nb * NB);
}

/* The byte planes of rows 0 .. R into pl: groups of 4 (three rows too: one
 * pass over the keys costs less than two), then 2, then 1, while E is a
 * multiple of the group's W; *nb: the rows they cover; returns their
 * count, 0 without QD_BYTE_ROWS. */
static int Q8(plan_bytes)(int R, const fa_q8_item *it, const int16_t *q16, const float *sq,
                          void *planes, int *nb)
{
    int ng = 0;
    *nb = 0;
#if defined(QD_BYTE_ROWS)
    Q8(planes) *pl = planes;
    while (*nb < R) {
        const int left = R - *nb, rg = left >= 3 ? 4 : left, n = left < rg ? left : rg;
        if (it->E % (64 / rg)) break;
        Q8(byte_planes)(it, *nb, rg, n, q16, sq, &pl[ng++]);
        *nb += n;
    }
#else
    (void)R, (void)it, (void)q16, (void)sq, (void)planes;
#endif
    return ng;
}

/* The R rows' weights p[r*NB + jj] vs[jj], jj < t->n, as int16 at
 * w + r*NB (zeros to the end of the last 16: whole vectors on every tier)
 * and their scales b[r] (0: a row without weight here); 0 if a weight is
 * not finite or 32767 / b[r] is not.  p's rows are zeroed past t->n first
 * (t->vs is zero there, Q8(locate)). */
static int Q8(quant_w)(int R, const Q8(blk) *t, float *p, int16_t *w, float *b)
{
    const int64_t n = t->n, np = (n + 15) / 16 * 16;
    for (int r = 0; r < R; r++) {
        float *pr = p + r * NB;
        for (int64_t jj = n; jj < np; jj++) pr[jj] = 0;
        vf mx = vf_zero(), bad = vf_zero();
        for (int64_t jj = 0; jj < np; jj += QD_W) {
            const vf x = vf_mul(vf_load(pr + jj), vf_load(t->vs + jj));
            mx = vf_max(vf_abs(x), mx);
            bad = vf_add(bad, vf_mul(x, vf_zero())); /* NaN once a weight is NaN or inf */
        }
        if (vf_hsum(bad) != 0) return 0;
        b[r] = vf_hmax(mx);
        if (b[r] == 0) {
            memset(w + r * NB, 0, (size_t)np * sizeof(int16_t));
            continue;
        }
        const float inv = 32767.0f / b[r];
        if (!(inv <= FLT_MAX)) return 0;
        const vf sc = vf_set1(inv);
        for (int64_t jj = 0; jj < np; jj += QD_W)
            qd_quant(w + r * NB + jj, vf_mul(vf_load(pr + jj), vf_load(t->vs + jj)), sc);
    }
    return 1;
}

/* o[r*ldo + c0 + 0..2 QD_W NC) += (sum_jj w16[r][jj] v8[jj][c0 ..]) b[r] /
 * 32767, r < PR, for the keys of block t: key pairs at once, the PR x NC x 2
 * accumulators in registers over the block.  full: every column of the
 * tile is below Ev; else its one chunk (NC = 1) has Ev - c0 < 2 QD_W. */
static FA_ALWAYS_INLINE void Q8(pv_dot_tile)(int PR, int NC, int full, const fa_q8_item *it,
                                             const Q8(blk) *t, const int16_t *w, const float *b,
                                             float *restrict o, int64_t ldo, int64_t c0)
{
    const int64_t n = t->n, cols = it->Ev - c0;
    qd_vi lo[QD_TILE_ROWS][4], hi[QD_TILE_ROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < PR; r++)
#pragma GCC unroll 4
        for (int u = 0; u < NC; u++) lo[r][u] = hi[r][u] = qd_zero();
    for (int64_t jj = 0; jj < n; jj += 2) {
        const int8_t *va = t->v[jj] + c0, *vb = t->v[jj + 1] + c0; /* v[n]: Q8(locate) */
        qd_vi pl[4], ph[4];
#pragma GCC unroll 4
        for (int u = 0; u < NC; u++) {
            const qd_vi x = full ? qd_widen(va + 2 * QD_W * u) : qd_widen_part(va, cols);
            const qd_vi y = full ? qd_widen(vb + 2 * QD_W * u) : qd_widen_part(vb, cols);
            pl[u] = qd_pairs_lo(x, y), ph[u] = qd_pairs_hi(x, y);
        }
#pragma GCC unroll 8
        for (int r = 0; r < PR; r++) {
            const qd_vi wv = qd_bcast(w + r * NB + jj);
#pragma GCC unroll 4
            for (int u = 0; u < NC; u++) {
                lo[r][u] = qd_dp(lo[r][u], pl[u], wv);
                hi[r][u] = qd_dp(hi[r][u], ph[u], wv);
            }
        }
    }
    const vf k = vf_set1(1.0f / 32767.0f);
#pragma GCC unroll 8
    for (int r = 0; r < PR; r++) {
        const vf br = vf_set1(b[r]);
#pragma GCC unroll 4
        for (int u = 0; u < NC; u++) {
            float *op = o + r * ldo + c0 + 2 * QD_W * u;
            vf o0, o1;
            qd_unmix(qd_to_f(lo[r][u]), qd_to_f(hi[r][u]), &o0, &o1);
            vf_store(op, vf_fma(vf_mul(o0, k), br, vf_load(op)));
            vf_store(op + QD_W, vf_fma(vf_mul(o1, k), br, vf_load(op + QD_W)));
        }
    }
}

/* Every column of the PR rows: tiles of NC chunks of 2 QD_W, then single
 * chunks, the last one partial (ldo is a multiple of 32, so of 2 QD_W:
 * fa_q8_ldo). */
static FA_ALWAYS_INLINE void Q8(pv_dot_rows)(int PR, int NC, const fa_q8_item *it,
                                             const Q8(blk) *t, const int16_t *w, const float *b,
                                             float *o, int64_t ldo)
{
    int64_t c = 0;
    for (; c + 2 * QD_W * NC <= it->Ev; c += 2 * QD_W * NC)
        Q8(pv_dot_tile)(PR, NC, 1, it, t, w, b, o, ldo, c);
    for (; c + 2 * QD_W <= it->Ev; c += 2 * QD_W) Q8(pv_dot_tile)(PR, 1, 1, it, t, w, b, o, ldo, c);
    if (c < it->Ev) Q8(pv_dot_tile)(PR, 1, 0, it, t, w, b, o, ldo, c);
}

/* The R (<= QD_TILE_ROWS) rows of one tile: QD_PV_CHUNKS(R) chunks wide
 * (the mapping's choice, as many as its registers hold: on avx512, 8 rows
 * x 1 chunk, 4 x 2, 2 x 4, 1 x 4). */
static void Q8(pv_dot_tile_rows)(int R, const fa_q8_item *it, const Q8(blk) *t, const int16_t *w,
                                 const float *b, float *o, int64_t ldo)
{
    /* rows past QD_TILE_ROWS never come here: the cases only keep it in bounds */
#define Q8_PV_DOT(c)                                                                   \
    Q8(pv_dot_rows)((c) < QD_TILE_ROWS ? (c) : QD_TILE_ROWS, QD_PV_CHUNKS(c), it, t, w, b, o, \
                    ldo)
    Q8_ROW_CASES(Q8_PV_DOT)
#undef Q8_PV_DOT
}

/* o[r*ldo + 0..Ev) += sum_jj p[r*NB + jj] vs[jj] v8[jj] for the R rows (in
 * tiles of QD_TILE_ROWS: each value row widened once per tile), or by the
 * float Q8(pv) if a weight is not finite. */
static void Q8(pv_dot)(int R, const fa_q8_item *it, const Q8(blk) *t, float *p, float *o,
                       int64_t ldo)
{
    int16_t w[RB * NB];
    float b[RB];
    if (!Q8(quant_w)(R, t, p, w, b)) {
        Q8(pv)(R, it, t, p, o, ldo);
        return;
    }
    for (int r = 0; r < R; r += QD_TILE_ROWS)
        Q8(pv_dot_tile_rows)(R - r < QD_TILE_ROWS ? R - r : QD_TILE_ROWS, it, t, w + r * NB, b + r,
                             o + r * ldo, ldo);
}

#undef Q8_EP
