/* decode_dp16.h -- the bfloat16 decoding kernels on VDPBF16PS (kernels.h:
 * qk_rows_dp16, pv_rows_dp16) over one key block's row pointers (fa_krows),
 * on the x86 bfloat16 tiers, over simd/dp16_rows.h.  Included once by
 * kernels_isa.c (f32 only) where the mapping has FA_SIMD_BF16 on x86;
 * names DD(name) -> name_dp16_<FA_ISA_NAME> (qk_rows_dp16_avx512_bf16,
 * pv_tile_dp16_amx, ...).
 *
 * Q.K^T: each query row rounded to bfloat16 (exact for bfloat16 queries,
 * which the driver passes unscaled), its pairs along E against the key's
 * in place, each key chunk loaded once for up to 4 rows; a tile's rows x
 * keys partial vectors (VF_W of them) reduced at once by one transpose-add
 * (vf_hsum_lanes), the scores then scaled by c in float32.
 * P.V: the weights rounded to bfloat16 nearest even; two keys' value rows
 * interleaved into pairs (key j, j + 1) per column, the output columns held
 * in that order in registers over the block and put back on the store.  A
 * key whose rounded weight is zero is dropped from its pair (so a NaN/Inf
 * value behind it never reaches o).  Float32 accumulation throughout. */
#define DD(name) FA_CAT3(name, dp16, FA_ISA_NAME)
#define DD_PR 4 /* rows of a P.V tile: 4 x 2 chunks of 32 columns, 16 accumulators */

/* s[r*lds + j0 + l] = c (q_r . k_{j0 + l}) for the R rows of qb (bfloat16,
 * E apart) and KL keys, R * KL <= VF_W: each key's 32-element chunk loaded
 * once for the R rows, accumulator r*KL + l for row r and key l, the R*KL
 * reduced at once by one transpose-add into lanes r*KL + l (so each score
 * is its own dot product whatever the rows and keys around it). */
static FA_ALWAYS_INLINE void DD(qk_tile)(int R, int KL, int64_t E, float c, const uint16_t *qb,
                                         const fa_krows *t, int64_t j0, float *s, int64_t lds)
{
    vf acc[VF_W];
    const uint16_t *k[VF_W];
#pragma GCC unroll 16
    for (int i = 0; i < VF_W; i++) acc[i] = vf_zero();
#pragma GCC unroll 16
    for (int l = 0; l < KL; l++) k[l] = (const uint16_t *)t->k[j0 + l];
    for (int64_t d = 0; d < E; d += 32) {
        dd_vi qv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) qv[r] = dd_load(qb + r * E + d);
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) {
            const dd_vi kv = dd_load(k[l] + d);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r * KL + l] = dd_dp(acc[r * KL + l], qv[r], kv);
        }
    }
    const vf x = vf_mul(vf_set1(c), vf_hsum_lanes(acc));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < KL / 4; u++) dd_put4(s + r * lds + j0 + 4 * u, x, r * KL / 4 + u);
}

/* The same for the one key j (the last t->n % KL of a block). */
static void DD(qk_key)(int64_t R, int64_t E, float c, const uint16_t *qb, const fa_krows *t,
                       int64_t j, float *s, int64_t lds)
{
    for (int64_t r = 0; r < R; r++) {
        vf acc = vf_zero();
        for (int64_t d = 0; d < E; d += 32)
            acc = dd_dp(acc, dd_load(qb + r * E + d), dd_load((const uint16_t *)t->k[j] + d));
        s[r * lds + j] = c * vf_hsum(acc);
    }
}

/* The rows of key j + FA_DIRECT_PF_KEYS (t's prefetch-only rows past the
 * block) and of value j (P.V reads it after the softmax): the rows of a
 * paged block lie anywhere, out of the hardware prefetchers' sight. */
static FA_ALWAYS_INLINE void DD(prefetch)(const fa_krows *t, int64_t j, int64_t E, int64_t Ev)
{
    const char *kn = (const char *)t->k[j + FA_DIRECT_PF_KEYS], *vj = (const char *)t->v[j];
    if (kn)
        for (int64_t b = 0; b < 2 * E; b += 64) FA_PREFETCH(kn + b);
    for (int64_t b = 0; b < 2 * Ev; b += 64) FA_PREFETCH(vj + b);
}

/* Rows r < R (<= 4) over the block: tiles of KL = 16 / R keys rounded down
 * to a multiple of 4 (16, 8, 4, 4), then the last keys one by one. */
static FA_ALWAYS_INLINE void DD(qk_part)(int R, int64_t E, int64_t Ev, float c, const uint16_t *qb,
                                         const fa_krows *t, float *s, int64_t lds)
{
    const int KL = R == 1 ? 16 : R == 2 ? 8 : 4;
    int64_t j = 0;
    for (; j + KL <= t->n; j += KL) {
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) DD(prefetch)(t, j + l, E, Ev);
        DD(qk_tile)(R, KL, E, c, qb, t, j, s, lds);
    }
    for (; j < t->n; j++) {
        DD(prefetch)(t, j, E, Ev);
        DD(qk_key)(R, E, c, qb, t, j, s, lds);
    }
}

/* s[i][j] = c (bf16(q_i) . k_j), i < rows <= FA_DIRECT_MAX_ROWS, j < t->n;
 * E % 32 == 0, E <= FA_FLASH16_MAX_E: rows by fours, then the rest (a
 * second part's prefetches find the rows cached). */
static void DD(qk_rows)(int64_t rows, int64_t E, int64_t Ev, float c, const float *q,
                        const fa_krows *t, float *s, int64_t lds)
{
    uint16_t qb[FA_DIRECT_MAX_ROWS * FA_FLASH16_MAX_E];
    for (int64_t i = 0; i < rows * E; i += 32) dd_store(qb + i, dd_round(vf_load(q + i + 16), vf_load(q + i)));
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) DD(qk_part)(4, E, Ev, c, qb + i * E, t, s + i * lds, lds);
    switch (rows - i) {
    case 3: DD(qk_part)(3, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    case 2: DD(qk_part)(2, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    case 1: DD(qk_part)(1, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    default: break;
    }
}

/* The R rows' weights p[r][0 .. n) rounded to bfloat16 nearest even, as
 * dword pairs (key 2jp low, 2jp + 1 high) at w + r*FA_KC/2 + jp; an odd last
 * key's partner 0.  p's rows are read up to n rounded up to 32 (<= FA_KC).
 * Returns 1 if some pair has a zero half (a weight rounded to 0, or an odd
 * n's partner): then P.V must test each pair. */
static int DD(weights)(int64_t R, const float *p, int64_t ldp, int64_t n, uint32_t *w)
{
    uint32_t zero = (uint32_t)(n % 2);
    for (int64_t r = 0; r < R; r++) {
        uint16_t *wr = (uint16_t *)(w + r * (FA_KC / 2));
        for (int64_t j = 0; j < n; j += 32) {
            const dd_vi x = dd_round(vf_load(p + r * ldp + j + 16), vf_load(p + r * ldp + j));
            const uint32_t live = n - j >= 32 ? 0xffffffffu : (1u << (n - j)) - 1;
            zero |= ~dd_nonzero(x) & live;
            dd_store(wr + j, x);
        }
        if (n % 2) wr[n] = 0;
    }
    return zero != 0;
}

/* o[r][c0 .. c0 + 32 NC) += sum_j bf16(p[r][j]) v_j[c0 ..], r < R, NC <= 2:
 * key pairs at once, the R x NC x 2 accumulators in registers over the
 * block; where zw (DD(weights)' answer), a pair with one zero weight keeps
 * only the other key's values and one with two is skipped (else no pair
 * has a zero weight: no test); pf: the next block's key rows prefetched on
 * the way. */
static FA_ALWAYS_INLINE void DD(pv_tile)(int R, int NC, int zw, int pf, const fa_krows *t,
                                         const uint32_t *w, int64_t c0, float *o, int64_t ldo)
{
    vf lo[DD_PR][2], hi[DD_PR][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++)
            dd_mix(vf_load(o + r * ldo + c0 + 32 * u), vf_load(o + r * ldo + c0 + 32 * u + 16),
                   &lo[r][u], &hi[r][u]);
    for (int64_t j = 0; j < t->n; j += 2) {
        if (pf) fa_krows_prefetch_next(t, j), fa_krows_prefetch_next(t, j + 1);
        const uint16_t *va = (const uint16_t *)t->v[j] + c0;
        const uint16_t *vb = j + 1 < t->n ? (const uint16_t *)t->v[j + 1] + c0 : va;
        dd_vi pl[2], ph[2];
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) {
            const dd_vi a = dd_load(va + 32 * u), b = dd_load(vb + 32 * u);
            pl[u] = dd_pairs_lo(a, b), ph[u] = dd_pairs_hi(a, b);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint32_t x = w[r * (FA_KC / 2) + j / 2];
            if (zw && x == 0) continue;
            const dd_vi wv = dd_bcast(x);
            const uint32_t m = !zw ? 0 : !(x & 0xffffu) ? 0xffff0000u : !(x >> 16) ? 0xffffu : 0;
#pragma GCC unroll 2
            for (int u = 0; u < NC; u++) {
                lo[r][u] = dd_dp(lo[r][u], wv, m ? dd_keep(pl[u], m) : pl[u]);
                hi[r][u] = dd_dp(hi[r][u], wv, m ? dd_keep(ph[u], m) : ph[u]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) {
            vf o0, o1;
            dd_unmix(lo[r][u], hi[r][u], &o0, &o1);
            vf_store(o + r * ldo + c0 + 32 * u, o0);
            vf_store(o + r * ldo + c0 + 32 * u + 16, o1);
        }
}

/* Rows r < R (<= DD_PR) over every 32-column chunk: tiles of 2 chunks, then
 * 1, with the pair tests where zw; the first tile prefetches the next
 * block's keys where pf. */
static FA_ALWAYS_INLINE void DD(pv_part)(int R, int zw, int pf, int64_t Ev, const fa_krows *t,
                                         const uint32_t *w, float *o, int64_t ldo)
{
    int64_t c = 0;
    if (zw) {
        for (; c + 64 <= Ev; c += 64) DD(pv_tile)(R, 2, 1, pf && c == 0, t, w, c, o, ldo);
        if (c < Ev) DD(pv_tile)(R, 1, 1, pf && c == 0, t, w, c, o, ldo);
    } else {
        for (; c + 64 <= Ev; c += 64) DD(pv_tile)(R, 2, 0, pf && c == 0, t, w, c, o, ldo);
        if (c < Ev) DD(pv_tile)(R, 1, 0, pf && c == 0, t, w, c, o, ldo);
    }
}

/* o[i][:Ev] += sum_j bf16(p[i][j]) v_j, i < rows <= FA_DIRECT_MAX_ROWS,
 * j < t->n; Ev % 32 == 0, ldp >= FA_KC. */
static void DD(pv_rows)(int64_t rows, int64_t Ev, const float *p, int64_t ldp, const fa_krows *t,
                        float *o, int64_t ldo)
{
    uint32_t w[FA_DIRECT_MAX_ROWS * FA_KC / 2];
    const int zw = DD(weights)(rows, p, ldp, t->n, w);
    int64_t i = 0;
    for (; i + DD_PR <= rows; i += DD_PR)
        DD(pv_part)(DD_PR, zw, i == 0, Ev, t, w + i * (FA_KC / 2), o + i * ldo, ldo);
    const int pf = i == 0;
    switch (rows - i) {
    case 3: DD(pv_part)(3, zw, pf, Ev, t, w + i * (FA_KC / 2), o + i * ldo, ldo); break;
    case 2: DD(pv_part)(2, zw, pf, Ev, t, w + i * (FA_KC / 2), o + i * ldo, ldo); break;
    case 1: DD(pv_part)(1, zw, pf, Ev, t, w + i * (FA_KC / 2), o + i * ldo, ldo); break;
    default: break;
    }
}

#undef DD_PR
#undef DD
