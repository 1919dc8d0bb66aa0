/* decode_dp16.h -- the bfloat16 decoding kernels (kernels.h: qk_rows_dp16,
 * pv_rows_dp16) over one key block's row pointers (fa_krows), on the x86
 * bfloat16 tiers, over simd/dp16_rows.h.  Included once by kernels_isa.c
 * (f32 only) where the mapping has FA_SIMD_BF16 on x86; names DD(name) ->
 * name_dp16_<FA_ISA_NAME> (qk_rows_dp16_avx512_bf16, pv_tile_dp16_amx, ...).
 *
 * Two ways to multiply, one per tier, around the same loops:
 * - avx512_bf16: on VDPBF16PS, which AMD's Zen 5 issues at its FMAs'
 *   rate (574 against 286 GFLOP/s on one core).  Q.K^T: each
 *   query row rounded to bfloat16 (exact for bfloat16 queries, which the
 *   driver passes unscaled), its pairs along E against the key's in place.
 *   P.V: the weights rounded to bfloat16 nearest even; two keys' value rows
 *   interleaved into pairs (key j, j + 1) per column.  A key whose rounded
 *   weight is zero is dropped from its pair.
 * - amx (DD_WIDEN): the rows of K and V widened exactly to float32 in
 *   registers (one VPUNPCK per 16 elements: 32 elements in dd_mix's lo and
 *   hi orders) and float32 FMAs, nothing rounded: an Intel Xeon with AMX
 *   issues VDPBF16PS at a quarter of its FMAs' rate (117 against 240
 *   GFLOP/s on one core, 2026-12-05; the widened rows took 9% off a
 *   decoding step of bfloat16 queries read from memory, 18% with the pool
 *   in the L2, 37% there for float32 queries), and the AMX tiles would be
 *   mostly padding for a decoding step's 1 to 8 rows.  Q.K^T: each query
 *   row in float32, put in the mixed orders once per call.  P.V: each key's
 *   widened value row times the float32 weights; a zero weight's key is
 *   skipped.
 * Either way each key chunk is loaded once for up to 4 query rows; a Q.K^T
 * tile's rows x keys partial vectors (VF_W of them) are reduced at once by
 * one transpose-add (vf_hsum_lanes), the scores then scaled by c in
 * float32; P.V holds the output columns in the mixed order in registers
 * over the block and puts them back on the store; a skipped key's NaN/Inf
 * value never reaches o.  Float32 accumulation throughout. */
#define DD(name) FA_CAT3(name, dp16, FA_ISA_NAME)
#define DD_PR 4 /* rows of a P.V tile: 4 x 2 chunks of 32 columns, 16 accumulators */
#if defined(FA_SIMD_AMX)
#define DD_WIDEN 1
typedef float DD_QT; /* the queries as the tiles read them */
typedef float DD_WT; /* the weights as P.V reads them */
#else
#define DD_WIDEN 0
typedef uint16_t DD_QT;
typedef uint32_t DD_WT;
#define DD_LDW (FA_KC / 2) /* the rounded weights' row stride */
#endif

#if DD_WIDEN
/* s[r*lds + j0 + l] = c (q_r . k_{j0 + l}) for the R rows of qm (float32
 * in the mixed orders, E apart) and KL keys, R * KL <= VF_W: each key's
 * 32-element chunk loaded and widened once for the R rows, accumulator
 * r*KL + l for row r and key l, the R*KL reduced at once by one
 * transpose-add into lanes r*KL + l (so each score is its own dot product
 * whatever the rows and keys around it). */
static FA_ALWAYS_INLINE void DD(qk_tile)(int R, int KL, int64_t E, float c, const DD_QT *qm,
                                         const fa_krows *t, int64_t j0, float *s, int64_t lds)
{
    vf acc[VF_W];
    const uint16_t *k[VF_W];
#pragma GCC unroll 16
    for (int i = 0; i < VF_W; i++) acc[i] = vf_zero();
#pragma GCC unroll 16
    for (int l = 0; l < KL; l++) k[l] = (const uint16_t *)t->k[j0 + l];
    for (int64_t d = 0; d < E; d += 32) {
        vf ql[4], qh[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            ql[r] = vf_load(qm + r * E + d);
            qh[r] = vf_load(qm + r * E + d + 16);
        }
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) {
            const dd_vi kv = dd_load(k[l] + d);
            const vf kl = dd_wlo(kv), kh = dd_whi(kv);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r * KL + l] = vf_fma(qh[r], kh, vf_fma(ql[r], kl, acc[r * KL + l]));
        }
    }
    const vf x = vf_mul(vf_set1(c), vf_hsum_lanes(acc));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < KL / 4; u++) dd_put4(s + r * lds + j0 + 4 * u, x, r * KL / 4 + u);
}

/* The same for the one key j (the last t->n % KL of a block). */
static void DD(qk_key)(int64_t R, int64_t E, float c, const DD_QT *qm, const fa_krows *t,
                       int64_t j, float *s, int64_t lds)
{
    for (int64_t r = 0; r < R; r++) {
        vf acc = vf_zero();
        for (int64_t d = 0; d < E; d += 32) {
            const dd_vi kv = dd_load((const uint16_t *)t->k[j] + d);
            acc = vf_fma(vf_load(qm + r * E + d), dd_wlo(kv), acc);
            acc = vf_fma(vf_load(qm + r * E + d + 16), dd_whi(kv), acc);
        }
        s[r * lds + j] = c * vf_hsum(acc);
    }
}

/* q's rows in the tiles' form: the mixed orders */
static void DD(prep_q)(int64_t n, const float *q, DD_QT *qx)
{
    for (int64_t i = 0; i < n; i += 32) {
        vf lo, hi;
        dd_mix(vf_load(q + i), vf_load(q + i + 16), &lo, &hi);
        vf_store(qx + i, lo);
        vf_store(qx + i + 16, hi);
    }
}

#else
/* s[r*lds + j0 + l] = c (q_r . k_{j0 + l}) for the R rows of qb (bfloat16,
 * E apart) and KL keys, R * KL <= VF_W: each key's 32-element chunk loaded
 * once for the R rows, accumulator r*KL + l for row r and key l, the R*KL
 * reduced at once by one transpose-add into lanes r*KL + l (so each score
 * is its own dot product whatever the rows and keys around it). */
static FA_ALWAYS_INLINE void DD(qk_tile)(int R, int KL, int64_t E, float c, const DD_QT *qb,
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
static void DD(qk_key)(int64_t R, int64_t E, float c, const DD_QT *qb, const fa_krows *t,
                       int64_t j, float *s, int64_t lds)
{
    for (int64_t r = 0; r < R; r++) {
        vf acc = vf_zero();
        for (int64_t d = 0; d < E; d += 32)
            acc = dd_dp(acc, dd_load(qb + r * E + d), dd_load((const uint16_t *)t->k[j] + d));
        s[r * lds + j] = c * vf_hsum(acc);
    }
}

/* q's rows in the tiles' form: rounded to bfloat16 */
static void DD(prep_q)(int64_t n, const float *q, DD_QT *qx)
{
    for (int64_t i = 0; i < n; i += 32)
        dd_store(qx + i, dd_round(vf_load(q + i + 16), vf_load(q + i)));
}

#endif

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
static FA_ALWAYS_INLINE void DD(qk_part)(int R, int64_t E, int64_t Ev, float c, const DD_QT *qb,
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

/* s[i][j] = c (q_i . k_j) (q_i rounded to bfloat16 but where DD_WIDEN), i <
 * rows <= FA_DIRECT_MAX_ROWS, j < t->n; E % 32 == 0, E <= FA_FLASH16_MAX_E:
 * rows by fours, then the rest (a second part's prefetches find the rows
 * cached). */
static void DD(qk_rows)(int64_t rows, int64_t E, int64_t Ev, float c, const float *q,
                        const fa_krows *t, float *s, int64_t lds)
{
    DD_QT qb[FA_DIRECT_MAX_ROWS * FA_FLASH16_MAX_E];
    DD(prep_q)(rows * E, q, qb);
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) DD(qk_part)(4, E, Ev, c, qb + i * E, t, s + i * lds, lds);
    switch (rows - i) {
    case 3: DD(qk_part)(3, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    case 2: DD(qk_part)(2, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    case 1: DD(qk_part)(1, E, Ev, c, qb + i * E, t, s + i * lds, lds); break;
    default: break;
    }
}

/* A P.V tile's accumulators: columns c0 .. c0 + 32 NC of the R rows of o in
 * dd_mix's orders (lo, hi per 32 columns), and back. */
static FA_ALWAYS_INLINE void DD(acc_load)(int R, int NC, const float *o, int64_t ldo, int64_t c0,
                                          vf lo[][2], vf hi[][2])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++)
            dd_mix(vf_load(o + r * ldo + c0 + 32 * u), vf_load(o + r * ldo + c0 + 32 * u + 16),
                   &lo[r][u], &hi[r][u]);
}

static FA_ALWAYS_INLINE void DD(acc_store)(int R, int NC, vf lo[][2], vf hi[][2], float *o,
                                           int64_t ldo, int64_t c0)
{
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

#if DD_WIDEN
/* 1 if some weight p[r][j], r < R, j < n, is zero (P.V must then test
 * each); p's rows are read up to n rounded up to 16 (<= FA_KC). */
static int DD(any_zero)(int64_t R, const float *p, int64_t ldp, int64_t n)
{
    uint32_t z = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j += 16) {
            const uint32_t live = n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1;
            z |= dd_zeros(vf_load(p + r * ldp + j)) & live;
        }
    return z != 0;
}

/* o[r][c0 .. c0 + 32 NC) += sum_j p[r][j] v_j[c0 ..], r < R, NC <= 2: each
 * key's value chunk loaded and widened once for the R rows, the R x NC x 2
 * accumulators in registers over the block; where zw (DD(any_zero)'s
 * answer) a zero weight's key is skipped for its row; pf: the next block's
 * key rows prefetched on the way. */
static FA_ALWAYS_INLINE void DD(pv_tile)(int R, int NC, int zw, int pf, const fa_krows *t,
                                         const DD_WT *p, int64_t ldp, int64_t c0, float *o,
                                         int64_t ldo)
{
    vf lo[DD_PR][2], hi[DD_PR][2];
    DD(acc_load)(R, NC, o, ldo, c0, lo, hi);
    for (int64_t j = 0; j < t->n; j++) {
        if (pf) fa_krows_prefetch_next(t, j);
        const uint16_t *va = (const uint16_t *)t->v[j] + c0;
        vf vl[2], vh[2];
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) {
            const dd_vi x = dd_load(va + 32 * u);
            vl[u] = dd_wlo(x), vh[u] = dd_whi(x);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float x = p[r * ldp + j];
            if (zw && x == 0) continue;
            const vf wv = vf_set1(x);
#pragma GCC unroll 2
            for (int u = 0; u < NC; u++) {
                lo[r][u] = vf_fma(wv, vl[u], lo[r][u]);
                hi[r][u] = vf_fma(wv, vh[u], hi[r][u]);
            }
        }
    }
    DD(acc_store)(R, NC, lo, hi, o, ldo, c0);
}

#else
/* The R rows' weights p[r][0 .. n) rounded to bfloat16 nearest even, as
 * dword pairs (key 2jp low, 2jp + 1 high) at w + r*DD_LDW + jp; an odd last
 * key's partner 0.  p's rows are read up to n rounded up to 32 (<= FA_KC).
 * Returns 1 if some pair has a zero half (a weight rounded to 0, or an odd
 * n's partner): then P.V must test each pair. */
static int DD(weights)(int64_t R, const float *p, int64_t ldp, int64_t n, uint32_t *w)
{
    uint32_t zero = (uint32_t)(n % 2);
    for (int64_t r = 0; r < R; r++) {
        uint16_t *wr = (uint16_t *)(w + r * DD_LDW);
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
                                         const DD_WT *w, int64_t ldw, int64_t c0, float *o,
                                         int64_t ldo)
{
    vf lo[DD_PR][2], hi[DD_PR][2];
    DD(acc_load)(R, NC, o, ldo, c0, lo, hi);
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
            const uint32_t x = w[r * ldw + j / 2];
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
    DD(acc_store)(R, NC, lo, hi, o, ldo, c0);
}

#endif

/* Rows r < R (<= DD_PR) over every 32-column chunk: tiles of 2 chunks, then
 * 1, with the pair tests where zw; the first tile prefetches the next
 * block's keys where pf. */
static FA_ALWAYS_INLINE void DD(pv_part)(int R, int zw, int pf, int64_t Ev, const fa_krows *t,
                                         const DD_WT *w, int64_t ldw, float *o, int64_t ldo)
{
    int64_t c = 0;
    if (zw) {
        for (; c + 64 <= Ev; c += 64) DD(pv_tile)(R, 2, 1, pf && c == 0, t, w, ldw, c, o, ldo);
        if (c < Ev) DD(pv_tile)(R, 1, 1, pf && c == 0, t, w, ldw, c, o, ldo);
    } else {
        for (; c + 64 <= Ev; c += 64) DD(pv_tile)(R, 2, 0, pf && c == 0, t, w, ldw, c, o, ldo);
        if (c < Ev) DD(pv_tile)(R, 1, 0, pf && c == 0, t, w, ldw, c, o, ldo);
    }
}

/* o[i][:Ev] += sum_j p[i][j] v_j (p rounded to bfloat16 but where
 * DD_WIDEN), i < rows <= FA_DIRECT_MAX_ROWS, j < t->n; Ev % 32 == 0,
 * ldp >= FA_KC. */
static void DD(pv_rows)(int64_t rows, int64_t Ev, const float *p, int64_t ldp, const fa_krows *t,
                        float *o, int64_t ldo)
{
#if DD_WIDEN
    const int zw = DD(any_zero)(rows, p, ldp, t->n);
    const DD_WT *w = p;
    const int64_t ldw = ldp;
#else
    DD_WT w[FA_DIRECT_MAX_ROWS * DD_LDW];
    const int zw = DD(weights)(rows, p, ldp, t->n, w);
    const int64_t ldw = DD_LDW;
#endif
    int64_t i = 0;
    for (; i + DD_PR <= rows; i += DD_PR)
        DD(pv_part)(DD_PR, zw, i == 0, Ev, t, w + i * ldw, ldw, o + i * ldo, ldo);
    const int pf = i == 0;
    switch (rows - i) {
    case 3: DD(pv_part)(3, zw, pf, Ev, t, w + i * ldw, ldw, o + i * ldo, ldo); break;
    case 2: DD(pv_part)(2, zw, pf, Ev, t, w + i * ldw, ldw, o + i * ldo, ldo); break;
    case 1: DD(pv_part)(1, zw, pf, Ev, t, w + i * ldw, ldw, o + i * ldo, ldo); break;
    default: break;
    }
}

#undef DD_PR
#undef DD_WIDEN
#undef DD_LDW
#undef DD
