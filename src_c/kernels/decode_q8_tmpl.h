/* decode_q8_tmpl.h -- the int8 KV cache's attention kernel, written once over
 * simd/simd.h: one work item of fa_decode_q8 (decode_q8.h), float32 queries
 * against int8 keys and values with one float32 scale per row.
 *
 * Included by kernels/kernels_isa.c (compiled once per ISA) after the
 * float32 micro-kernels of kernels_tmpl.h, whose softcap, alibi, rowmax,
 * expsum and scal it reuses; FA_SFX must be f32 (the only instance: the
 * queries and all the arithmetic are float32).  Defines
 * fa_decode_q8_item_<FA_ISA_NAME> (fa_decode_q8_item_avx512, ...: the
 * decode_q8 entry of the ISA's f32 table, declared by kernels_isa.c); its
 * helpers are Q8(name) -> name_q8_<FA_ISA_NAME> (scores_q8_avx2, ...).
 *
 * Each key block's rows are located once (Q8(locate): through the block
 * table of a paged cache, or at fixed strides) into a table of row
 * pointers and scales that the loops read.
 *
 * Where the mapping names integer dot products (FA_SIMD_Q8_DOT: avx2 and
 * the x86 bfloat16 tiers), Q.K^T and P.V run on them (decode_q8_dot.h);
 * elsewhere, and for the rows or blocks it hands back, the int8 levels are
 * converted to float in registers (vf_load_i8) and the row scales applied
 * to scalars: score j = (scale k_scale[j]) (q . k8[j]), and value j enters
 * P.V with the weight p[j] v_scale[j].  Nothing is dequantised to memory.
 * Query rows are taken FA_Q8_ROWS at a time so that one conversion of a
 * key or value serves a whole GQA group; the keys in blocks of FA_Q8_KC,
 * with the online (streaming) softmax in between. */
#if FA_IS_F64(FA_SFX)
#error "decode_q8_tmpl.h: float32 only (FA_SFX f32)"
#endif
#define Q8(name) FA_CAT3(name, q8, FA_ISA_NAME)  /* Q8(scores) -> scores_q8_avx2 */
#define KF(name) FA_CAT3(name, f32, FA_ISA_NAME) /* KF(expsum) -> expsum_f32_avx2 */
#define VW VF_W
#define RB FA_Q8_ROWS
#define NB FA_Q8_KC
#if FA_Q8_ROWS != 8
#error "decode_q8_tmpl.h: Q8_ROW_CASES below spells out FA_Q8_ROWS = 8"
#endif
/* the switch over a row count 1..8, each case inlined with a constant R */
#define Q8_ROW_CASES(call)                                                        \
    switch (R) {                                                                  \
    case 1: call(1); break; case 2: call(2); break; case 3: call(3); break;      \
    case 4: call(4); break; case 5: call(5); break; case 6: call(6); break;      \
    case 7: call(7); break; default: call(8); break;                             \
    }

/* A key block's rows: key j0 + jj's levels k[jj], v[jj] and scales ks[jj],
 * vs[jj], for jj < n (and v[n] = v[n - 1] for an odd n); nx: the next
 * block's (its key rows prefetched). */
typedef struct Q8(blk) {
    const int8_t *k[NB], *v[NB];
    float ks[NB], vs[NB];
    int64_t n;
    const struct Q8(blk) *nx;
} Q8(blk);

/* The rows of keys j0 .. j0+n into t, run by run of a block. */
static void Q8(locate)(const fa_q8_item *it, int64_t j0, int64_t n, Q8(blk) *t)
{
    t->n = n;
    for (int64_t jj = 0; jj < n;) {
        const int64_t j = j0 + jj, bs = it->block_size;
        const int64_t c = it->blocks ? it->blocks[j / bs] : 0, off = it->blocks ? j % bs : j;
        const int64_t run = it->blocks && bs - off < n - jj ? bs - off : n - jj;
        const int8_t *k = it->k + c * it->k_bs + off * it->k_rs;
        const int8_t *v = it->v + c * it->v_bs + off * it->v_rs;
        const float *ks = it->k_scale + c * it->ks_bs + off * it->ks_rs;
        const float *vs = it->v_scale + c * it->vs_bs + off * it->vs_rs;
        for (int64_t u = 0; u < run; u++, jj++) {
            t->k[jj] = k + u * it->k_rs, t->v[jj] = v + u * it->v_rs;
            t->ks[jj] = ks[u * it->ks_rs], t->vs[jj] = vs[u * it->vs_rs];
        }
    }
    for (int64_t jj = n; jj < NB; jj++) t->ks[jj] = t->vs[jj] = 0; /* whole vectors past n */
    if (n % 2) t->v[n] = t->v[n - 1]; /* a pair's second row for the integer P.V (weight 0) */
}

/* The keys of the block from j0 when the last is jhi: at most NB. */
static inline int64_t Q8(keys)(int64_t j0, int64_t jhi) { return jhi - j0 + 1 < NB ? jhi - j0 + 1 : NB; }

/* Ask for the lines of the n floats p[u*rs]: each line once where the
 * floats are closer than a line (the common layouts: Hkv floats apart),
 * else each float's. */
static void Q8(prefetch_run)(const float *p, int64_t n, int64_t rs)
{
    const int64_t step = rs < 0 ? -rs : rs;
    if (step == 0 || step >= 16 || n < 2) {
        for (int64_t u = 0; u < (step == 0 ? 1 : n); u++) FA_PREFETCH(p + u * rs);
        return;
    }
    const char *lo = (const char *)(rs > 0 ? p : p + (n - 1) * rs);
    const int64_t span = (n - 1) * step * (int64_t)sizeof(float); /* lo to the last float */
    for (int64_t b = 0; b < span; b += 64) FA_PREFETCH(lo + b);
    FA_PREFETCH(lo + span);
}

/* Ask for the scales of keys j0 .. j0+n, a block before Q8(locate) reads
 * them: a paged cache's blocks lie in any order, so no hardware
 * prefetcher finds them, and each load would wait on memory. */
static void Q8(prefetch_scales)(const fa_q8_item *it, int64_t j0, int64_t n)
{
    const int64_t bs = it->block_size;
    for (int64_t jj = 0; jj < n;) {
        const int64_t j = j0 + jj;
        const int64_t c = it->blocks ? it->blocks[j / bs] : 0, off = it->blocks ? j % bs : j;
        const int64_t run = it->blocks && bs - off < n - jj ? bs - off : n - jj;
        Q8(prefetch_run)(it->k_scale + c * it->ks_bs + off * it->ks_rs, run, it->ks_rs);
        Q8(prefetch_run)(it->v_scale + c * it->vs_bs + off * it->vs_rs, run, it->vs_rs);
        jj += run;
    }
}

/* Ask for key jj's value row (P.V reads it next) and the next block's key
 * row jj, while key jj's scores are computed: the rows of a block span
 * several 4 KiB pages, past which the hardware prefetchers do not run;
 * spread over the keys, the requests never pile up behind the line-fill
 * buffers. */
static inline void Q8(prefetch)(const fa_q8_item *it, const Q8(blk) *t, int64_t jj)
{
    for (int64_t c = 0; c < it->Ev; c += 64) FA_PREFETCH(t->v[jj] + c);
    if (t->nx && jj < t->nx->n)
        for (int64_t c = 0; c < it->E; c += 64) FA_PREFETCH(t->nx->k[jj] + c);
}

/* s[r*NB + jj] = scale ks[jj] (q_r . k8[jj]) for the R (<= RB) rows at
 * qr[r] and the keys j0 <= jj < t->n of block t.  Each key is converted
 * once, in registers, for all R rows. */
static FA_ALWAYS_INLINE void Q8(scores_r)(int R, const fa_q8_item *it, const float *const *qr,
                                          const Q8(blk) *t, int64_t j0, float *restrict s)
{
    const int64_t E = it->E, Evec = E / VW * VW;
    for (int64_t jj = j0; jj < t->n; jj++) {
        const int8_t *kj = t->k[jj];
        Q8(prefetch)(it, t, jj);
        vf acc[RB];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r] = vf_zero();
        for (int64_t d = 0; d < Evec; d += VW) {
            const vf kv = vf_load_i8(kj + d);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r] = vf_fma(vf_load(qr[r] + d), kv, acc[r]);
        }
        const float ks = it->scale * t->ks[jj];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float t = vf_hsum(acc[r]);
            for (int64_t d = Evec; d < E; d++) t += qr[r][d] * (float)kj[d];
            s[r * NB + jj] = ks * t;
        }
    }
}

/* One row (plain decode): keys VW at a time, each with its own accumulator,
 * the VW dot products finished by one vf_hsum_lanes and scaled as a vector
 * (the same roundings as scores_r); the last n % VW keys by scores_r. */
static void Q8(scores1)(const fa_q8_item *it, const float *q, const Q8(blk) *t,
                        float *restrict s)
{
    const int64_t E = it->E, Evec = E / VW * VW, n = t->n;
    const vf vsc = vf_set1(it->scale);
    int64_t jj = 0;
    for (; jj + VW <= n; jj += VW) {
        const int8_t *const *kb = t->k + jj;
        vf acc[VW];
        float tail[VW];
        for (int l = 0; l < VW; l++) Q8(prefetch)(it, t, jj + l);
#pragma GCC unroll 16
        for (int l = 0; l < VW; l++) acc[l] = vf_zero();
        for (int64_t d = 0; d < Evec; d += VW) {
            const vf qv = vf_load(q + d);
#pragma GCC unroll 16
            for (int l = 0; l < VW; l++) acc[l] = vf_fma(qv, vf_load_i8(kb[l] + d), acc[l]);
        }
        for (int l = 0; l < VW; l++) {
            tail[l] = 0;
            for (int64_t d = Evec; d < E; d++) tail[l] += q[d] * (float)kb[l][d];
        }
        const vf dot = Evec < E ? vf_add(vf_hsum_lanes(acc), vf_load(tail)) : vf_hsum_lanes(acc);
        vf_store(s + jj, vf_mul(vf_mul(vsc, vf_load(t->ks + jj)), dot));
    }
    if (jj < n) Q8(scores_r)(1, it, &q, t, jj, s);
}

static void Q8(scores)(int R, const fa_q8_item *it, const float *const *qr, const Q8(blk) *t,
                       float *s)
{
    if (R == 1) {
        Q8(scores1)(it, qr[0], t, s);
        return;
    }
#define Q8_SCORES(c) Q8(scores_r)(c, it, qr, t, 0, s)
    Q8_ROW_CASES(Q8_SCORES)
#undef Q8_SCORES
}

/* o[r*ldo + c0 + 0..NV*VW) += sum_jj p[r*NB + jj] vs[jj] v8[jj][c0 ..]
 * for the PR rows and the keys jj < n of block t: a PR x NV register tile
 * held over the whole block, each value vector converted once for PR rows. */
static FA_ALWAYS_INLINE void Q8(pv_tile)(int PR, int NV, const Q8(blk) *t, int64_t n,
                                         const float *restrict p, float *restrict o,
                                         int64_t ldo, int64_t c0)
{
    vf acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < PR; r++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) acc[r][u] = vf_load(o + r * ldo + c0 + u * VW);
    for (int64_t jj = 0; jj < n; jj++) {
        const int8_t *vj = t->v[jj] + c0;
        const float vs = t->vs[jj];
        vf w[4];
#pragma GCC unroll 4
        for (int r = 0; r < PR; r++) w[r] = vf_set1(p[r * NB + jj] * vs);
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) {
            const vf vv = vf_load_i8(vj + u * VW);
#pragma GCC unroll 4
            for (int r = 0; r < PR; r++) acc[r][u] = vf_fma(w[r], vv, acc[r][u]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < PR; r++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) vf_store(o + r * ldo + c0 + u * VW, acc[r][u]);
}

/* Rows r < PR of P.V over the block: whole NV-vector tiles, single vectors,
 * then the last Ev % VW columns one by one. */
static FA_ALWAYS_INLINE void Q8(pv_rows)(int PR, int NV, const fa_q8_item *it,
                                         const Q8(blk) *t, const float *p, float *o, int64_t ldo)
{
    const int64_t Ev = it->Ev, n = t->n;
    int64_t c = 0;
    for (; c + NV * VW <= Ev; c += NV * VW) Q8(pv_tile)(PR, NV, t, n, p, o, ldo, c);
    for (; c + VW <= Ev; c += VW) Q8(pv_tile)(PR, 1, t, n, p, o, ldo, c);
    for (; c < Ev; c++)
        for (int64_t jj = 0; jj < n; jj++) {
            const float x = t->vs[jj] * (float)t->v[jj][c];
            for (int r = 0; r < PR; r++) o[r * ldo + c] += p[r * NB + jj] * x;
        }
}

/* o[r*ldo + 0..Ev) += sum_jj p[r*NB + jj] vs[jj] v8[jj] for the R rows
 * and the keys of block t: rows by fours (2-vector tiles), then a pair (4
 * vectors), then one (8 vectors): 8 accumulators each time. */
static void Q8(pv)(int R, const fa_q8_item *it, const Q8(blk) *t, const float *p, float *o,
                   int64_t ldo)
{
    int r = 0;
    for (; r + 4 <= R; r += 4) Q8(pv_rows)(4, 2, it, t, p + r * NB, o + r * ldo, ldo);
    for (; r + 2 <= R; r += 2) Q8(pv_rows)(2, 4, it, t, p + r * NB, o + r * ldo, ldo);
    for (; r < R; r++) Q8(pv_rows)(1, 8, it, t, p + r * NB, o + r * ldo, ldo);
}

#if defined(FA_SIMD_Q8_DOT)
/* a mapping with integer dot products (avx2: VPMADDWD; the x86 bfloat16
 * tiers: VPDPWSSD): Q.K^T and P.V on them */
#define FA_Q8_DOT 1
#include FA_SIMD_Q8_DOT
#include "kernels/decode_q8_dot.h" /* qk_dot_q8_amx, pv_dot_q8_avx2, ... */
#else
#define FA_Q8_DOT 0
#endif

/* a + b, b >= 0, saturating at INT64_MAX; a - b likewise at INT64_MIN */
static inline int64_t Q8(sat_add)(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
static inline int64_t Q8(sat_sub)(int64_t a, int64_t b) { return a < INT64_MIN + b ? INT64_MIN : a - b; }

/* The keys query i may see: [*lo, *hi] (empty when *lo > *hi), before the
 * padding; none below key_lo. */
static void Q8(visible)(const fa_q8_item *it, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t p = i + it->causal_offset;
    int64_t a = Q8(sat_sub)(p, it->win_left), b = Q8(sat_add)(p, it->win_right);
    if (it->causal && p < b) b = p;
    *lo = a < it->key_lo ? it->key_lo : a;
    *hi = b > it->S - 1 ? it->S - 1 : b;
}

/* Row state of the online softmax: running max m, sum l, and bad (a NaN or
 * +inf logit was visible: the row's output is NaN, as the reference's). */
typedef struct Q8(row) {
    int64_t g, i, lo, hi;
    float m, l;
    int bad;
} Q8(row);

/* One row's logits of the block j0 .. j0+n (s, in place): soft cap, ALiBi,
 * then every hidden key -inf; then the online softmax step: s becomes the
 * weights exp(s - m), o (Ev) is rescaled.  A row with nothing visible yet,
 * or bad, gets zero weights. */
static void Q8(softmax_row)(const fa_q8_item *it, Q8(row) *rw, int64_t j0, int64_t n, float *s,
                            float *o)
{
    const int64_t a = rw->lo > j0 ? rw->lo - j0 : 0;
    const int64_t b = rw->hi - j0 + 1 < n ? rw->hi - j0 + 1 : n; /* visible: [a, b) */
    if (rw->bad || a >= b) {
        memset(s, 0, (size_t)n * sizeof(float));
        return;
    }
    if (it->softcap > 0 || it->alibi) /* soft cap, then ALiBi, in one pass */
        KF(score_row)(s + a, b - a, it->softcap > 0 ? (float)it->softcap : 0.0f,
                      (float)(rw->i + it->causal_offset - (j0 + a)),
                      it->alibi ? (float)it->alibi[rw->g] : 0.0f, NULL);
    for (int64_t jj = 0; jj < a; jj++) s[jj] = -INFINITY;
    for (int64_t jj = b; jj < n; jj++) s[jj] = -INFINITY;
    if (it->pad)
        for (int64_t jj = a; jj < b; jj++)
            if (it->pad[j0 + jj]) s[jj] = -INFINITY;
    int has_nan = 0;
    const float mx = KF(rowmax)(s, n, &has_nan);
    if (has_nan || mx == INFINITY) {
        rw->bad = 1;
        memset(s, 0, (size_t)n * sizeof(float));
        return;
    }
    const float mn = mx > rw->m ? mx : rw->m;
    if (mn == -INFINITY) { /* nothing visible yet */
        memset(s, 0, (size_t)n * sizeof(float));
        return;
    }
    const float sum = KF(expsum)(s, s, n, mn);
    if (mn != rw->m) {
        const float f = expf(rw->m - mn); /* 0 for the first visible key */
        KF(scal)(o, it->Ev, f);
        rw->l = rw->l * f + sum;
        rw->m = mn;
    } else {
        rw->l += sum;
    }
}

/* The finished row: out = o / (l + the sink's exp), lse; NaN for a bad row,
 * zero (lse -inf) for a row with nothing visible. */
static void Q8(finish_row)(const fa_q8_item *it, const Q8(row) *rw, const float *o)
{
    float *out = it->out + rw->g * it->o_hs + rw->i * it->o_rs;
    float lse;
    if (rw->bad) {
        for (int64_t c = 0; c < it->Ev; c++) out[c] = NAN;
        lse = NAN;
    } else if (rw->m == -INFINITY) {
        for (int64_t c = 0; c < it->Ev; c++) out[c] = 0;
        lse = -INFINITY;
    } else {
        double top = rw->m, a = 1, tot = rw->l; /* tot: the denominator, at max top */
        if (it->sinks) {
            const double t = it->sinks[rw->g];
            if (t > top) {
                a = exp((double)rw->m - t);
                tot = rw->l * a + 1;
                top = t;
            } else {
                tot += exp(t - top);
            }
        }
        const float f = (float)(a / tot);
        for (int64_t c = 0; c < it->Ev; c++) out[c] = o[c] * f;
        lse = (float)(top + log(tot));
    }
    if (it->lse) it->lse[rw->g * it->lse_hs + rw->i] = lse;
}

/* A row of a key split: p = {m, l, o[0 .. part_ld)} as the driver's merge
 * reads them (zeros past Ev; all NaN for a bad row). */
static void Q8(store_row)(const fa_q8_item *it, const Q8(row) *rw, const float *o, float *p)
{
    p[0] = rw->bad ? NAN : rw->m;
    p[1] = rw->bad ? NAN : rw->l;
    for (int64_t c = 0; c < it->part_ld; c++) p[2 + c] = rw->bad ? NAN : c < it->Ev ? o[c] : 0;
}

/* Rows r0 .. r0+R of the item, one pass over their visible keys. */
static void Q8(rows)(const fa_q8_item *it, int64_t r0, int R)
{
    const int64_t ldo = fa_q8_ldo(it->Ev);
    float *s = it->scratch, *o = it->scratch + RB * NB;
    Q8(row) rw[RB];
    const float *qr[RB];
    int64_t jlo = INT64_MAX, jhi = -1;
    for (int r = 0; r < R; r++) {
        rw[r].g = (r0 + r) / it->L;
        rw[r].i = (r0 + r) % it->L;
        rw[r].m = -INFINITY;
        rw[r].l = 0;
        rw[r].bad = 0;
        Q8(visible)(it, rw[r].i, &rw[r].lo, &rw[r].hi);
        if (rw[r].lo <= rw[r].hi) {
            jlo = rw[r].lo < jlo ? rw[r].lo : jlo;
            jhi = rw[r].hi > jhi ? rw[r].hi : jhi;
        }
        qr[r] = it->q + rw[r].g * it->q_hs + rw[r].i * it->q_rs;
        memset(o + r * ldo, 0, (size_t)ldo * sizeof(float));
    }
#if FA_Q8_DOT
    int16_t q16[RB * FA_Q8_DOT_MAX_E];
    float sq[RB];
    const int dot = it->E <= FA_Q8_DOT_MAX_E && Q8(quant_q)(R, it->E, qr, q16, sq);
#if defined(QD_BYTE_ROWS)
    Q8(planes) planes[RB / QD_BYTE_ROWS + 2]; /* groups of 4, then 2, then 1 */
#else
    char planes[1];
#endif
    int nb = 0;
    const int ng = dot ? Q8(plan_bytes)(R, it, q16, sq, planes, &nb) : 0;
#endif
    Q8(blk) tab[2]; /* this key block's rows and the next's */
    /* (jhi - NB, not jlo + NB: jlo is INT64_MAX when no row sees a key) */
    if (jlo <= jhi - NB) Q8(prefetch_scales)(it, jlo + NB, Q8(keys)(jlo + NB, jhi));
    if (jlo <= jhi) Q8(locate)(it, jlo, Q8(keys)(jlo, jhi), &tab[0]);
    for (int64_t j0 = jlo, c = 0; j0 <= jhi; j0 += NB, c ^= 1) {
        const int64_t n = tab[c].n, j1 = j0 + NB;
        tab[c].nx = j1 <= jhi ? &tab[c ^ 1] : NULL;
        if (tab[c].nx) Q8(locate)(it, j1, Q8(keys)(j1, jhi), &tab[c ^ 1]);
        if (j1 + NB <= jhi) Q8(prefetch_scales)(it, j1 + NB, Q8(keys)(j1 + NB, jhi));
#if FA_Q8_DOT
        if (dot)
            Q8(qk)(R, it, q16, sq, planes, ng, nb, &tab[c], s);
        else
#endif
            Q8(scores)(R, it, qr, &tab[c], s);
        for (int r = 0; r < R; r++) Q8(softmax_row)(it, &rw[r], j0, n, s + r * NB, o + r * ldo);
#if FA_Q8_DOT
        Q8(pv_dot)(R, it, &tab[c], s, o, ldo);
#else
        Q8(pv)(R, it, &tab[c], s, o, ldo);
#endif
    }
    for (int r = 0; r < R; r++) {
        if (it->part)
            Q8(store_row)(it, &rw[r], o + r * ldo, it->part + (r0 + r) * it->part_rs);
        else
            Q8(finish_row)(it, &rw[r], o + r * ldo);
    }
}

/* The item, FA_Q8_ROWS rows at a time:
 * FA_CAT(fa_decode_q8_item, FA_ISA_NAME) -> fa_decode_q8_item_avx2, ... */
static void FA_CAT(fa_decode_q8_item, FA_ISA_NAME)(const fa_q8_item *it)
{
    for (int64_t r0 = 0; r0 < it->rows; r0 += RB)
        Q8(rows)(it, r0, (int)(it->rows - r0 < RB ? it->rows - r0 : RB));
}

#undef Q8_ROW_CASES
#undef FA_Q8_DOT
#undef Q8
#undef KF
#undef VW
#undef RB
#undef NB
