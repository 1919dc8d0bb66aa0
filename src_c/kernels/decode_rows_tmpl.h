/* decode_rows_tmpl.h -- the direct (decoding) kernels: Q.K^T and P.V over
 * one key block whose rows are found through pointers (kernels.h: qk_rows,
 * pv_rows; the rows in fa_krows), so a block of a paged cache is one call
 * whatever its page size, and Q.K^T over keys at one stride (qk_direct).
 * Q.K^T runs tiles of up to DR_QR query rows x several keys, each key
 * vector loaded (and widened) once for the tile's rows, each score its own
 * accumulator, a tile's scores reduced by one transpose-add; P.V holds a
 * tile of rows x column vectors of the output in registers over the whole
 * block, each value vector loaded once for the tile's rows.  The sums
 * (each score: its vector sum, then the E % VW tail in order; each output
 * element its weighted values in key order, zero weights skipped, the sums
 * of pv_direct) do not depend on the tiling, so a block gives the bits of
 * any split of it into runs, and a paged call those of the keys in place.
 * Included with DR_SRC (the rows' element type), DR_LOAD (a vector of
 * them, widened), DR_TO (one, widened), DR_WIDEN (1 if loading widens) and
 * the names DR_QK, DR_QKD, DR_PV, DR(name) set:
 *   kernels_tmpl.h:      DR_QK FN(qk_rows) (qk_rows_f32_avx2, ...)     DR_SRC FA_T
 *   kernels_half_tmpl.h: DR_QK HN(qk_rows) (qk_rows_bf16_avx512, ...)  DR_SRC uint16_t
 * (DR_QKD: qk_direct_f32_avx2, qk_direct_bf16_avx512, ...) and undefines
 * all of them. */
#define DR_QR 4 /* query rows per Q.K^T tile */
/* P.V tiles: DR_ACC accumulators (16 where there are 32 vector registers,
 * 8 in AVX2's 16), as 4 rows x DR_ACC/4 vectors, 2 x DR_ACC/2, 1 x 8 */
#if VW == 8 && defined(__AVX2__) && !defined(__AVX512F__)
#define DR_ACC 8
#else
#define DR_ACC 16
#endif

/* DR(touch)(t): 1 where Q.K^T reads (touches) the value rows of FA_T
 * rather than prefetching them, and P.V asks for none of the next block's
 * key rows: AVX2 without AVX-512 (its tier runs on AMD Zen 2/3 and Intel's
 * client cores), for value rows that follow one another over at least
 * FA_DIRECT_TOUCH_RUN bytes.  On a Zen 3 VM, bench --suite serving's
 * float32 decoding batch in pages of 128 keys (64 KiB per head): 1.18-1.20x
 * on one thread, 1.08-1.14x on two (the hints brought the rows in at half the read
 * probe's rate; demand loads, which the hardware prefetchers follow, hold
 * more of them in flight); pages of 16 keys, where those prefetchers stop at
 * every page, were 0.93-1.02x so; 16-bit rows, whose widening arithmetic
 * is the longer part, were not faster so in a C harness. */
#if defined(__AVX2__) && !defined(__AVX512F__) && !DR_WIDEN
#define DR_TOUCH 1
#else
#define DR_TOUCH 0
#endif
static FA_ALWAYS_INLINE int DR(touch)(const fa_krows *t)
{
    return DR_TOUCH && t->vrun >= FA_DIRECT_TOUCH_RUN;
}

/* Key j's prefetches: through t (paged rows) the key row FA_DIRECT_PF_KEYS
 * ahead (t's prefetch-only rows past the block; NULL past the pool's last)
 * and value row j (read where DR(touch)); with kb (keys at one stride) the
 * key row that far ahead within the n keys. */
static FA_ALWAYS_INLINE void DR(qk_prefetch)(int64_t E, int64_t Ev, const DR_SRC *kb, int64_t krs,
                                             const fa_krows *t, int64_t n, int64_t j)
{
    const int64_t kbytes = E * (int64_t)sizeof(DR_SRC);
    if (kb) {
        if (j + FA_DIRECT_PF_KEYS < n)
            for (int64_t b = 0; b < kbytes; b += 64)
                FA_PREFETCH((const char *)(kb + (j + FA_DIRECT_PF_KEYS) * krs) + b);
        return;
    }
    const char *kn = (const char *)t->k[j + FA_DIRECT_PF_KEYS], *vj = (const char *)t->v[j];
    if (kn)
        for (int64_t b = 0; b < kbytes; b += 64) FA_PREFETCH(kn + b);
    const int touch = DR(touch)(t);
    for (int64_t b = 0; b < Ev * (int64_t)sizeof(DR_SRC); b += 64)
        if (touch)
            FA_TOUCH(vj + b);
        else
            FA_PREFETCH(vj + b);
}

/* Q.K^T by tiles of R rows x KL keys, R * KL <= VW: one accumulator per
 * score (r*KL + l) over the E / VW whole vectors, each key vector loaded
 * (and widened) once for the R rows, the tile's scores then reduced at once
 * by one transpose-add (DR(lanes)): 16 scores of a grouped step on avx512
 * take 45 shuffles and adds where per-score sums took 16 x 9.  Every lane of
 * the transpose-add sums its vector in the same order, so each score is
 * its own dot product whatever its tile: qk_rows and qk_direct give the same
 * bits for any tiling, block split or page size.  The last E % VW elements
 * are added after the vector sum, in order.  A tile has VW / R keys, at
 * most DR_KLMAX: one query row against 8 or 16 keys at a time (as many rows
 * read at once) made a step of one row per KV head 2-6% slower than per-key
 * sums (avx512, keys from the L3), 4 keys 1-3% faster. */
#define DR_KLMAX 4
#define DR_KL(R) ((R) > VW ? 1 : VW / (R) < DR_KLMAX ? VW / (R) : DR_KLMAX)

#if FA_IS_F64(FA_SFX)
/* lane i = V(hsum)(x[i]) (no transpose-add for doubles: the decoding
 * step's float64 is for accuracy, not speed) */
static FA_ALWAYS_INLINE VT DR(lanes)(const VT *x)
{
    FA_T t[VW];
    for (int i = 0; i < VW; i++) t[i] = V(hsum)(x[i]);
    return V(load)(t);
}
#else
static FA_ALWAYS_INLINE VT DR(lanes)(const VT *x) { return vf_hsum_lanes(x); }
#endif

/* s[r*lds + l] = q_r . k[l] for the R rows at q (packed, E apart) and the
 * KL keys at k[0 .. KL). */
static FA_ALWAYS_INLINE void DR(qk_tile)(int R, int KL, int64_t E, const FA_T *restrict q,
                                         const DR_SRC *const *k, FA_T *restrict s, int64_t lds)
{
    VT acc[VW];
#pragma GCC unroll 16
    for (int i = 0; i < VW; i++) acc[i] = V(zero)();
    const int64_t Evec = E / VW * VW;
    for (int64_t d = 0; d < Evec; d += VW) {
        VT qv[DR_QR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) qv[r] = V(load)(q + r * E + d);
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) {
            const VT kv = DR_LOAD(k[l] + d);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r * KL + l] = V(fma)(qv[r], kv, acc[r * KL + l]);
        }
    }
    FA_T x[VW];
    V(store)(x, DR(lanes)(acc));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) {
            FA_T t = x[r * KL + l];
            for (int64_t d = Evec; d < E; d++) t += q[r * E + d] * DR_TO(k[l][d]);
            s[r * lds + l] = t;
        }
}

/* Rows r < R of s[r*lds + j] = q_r . k_j, j < n, key j at kb + j*krs or
 * (kb NULL) t->k[j]: tiles of DR_KL(R) keys, then the last keys one by one;
 * where pf, each key's prefetch (DR(qk_prefetch), through t or kb) asked
 * before its tile. */
static FA_ALWAYS_INLINE void DR(qk_part)(int R, int pf, int64_t E, int64_t Ev, const FA_T *q,
                                         const DR_SRC *kb, int64_t krs, const fa_krows *t,
                                         int64_t n, FA_T *s, int64_t lds)
{
    const int KL = DR_KL(R);
    const DR_SRC *k[VW];
    int64_t j = 0;
    for (; j + KL <= n; j += KL) {
#pragma GCC unroll 16
        for (int l = 0; l < KL; l++) {
            if (pf) DR(qk_prefetch)(E, Ev, kb, krs, t, n, j + l);
            k[l] = kb ? kb + (j + l) * krs : (const DR_SRC *)t->k[j + l];
        }
        DR(qk_tile)(R, KL, E, q, k, s + j, lds);
    }
    for (; j < n; j++) {
        if (pf) DR(qk_prefetch)(E, Ev, kb, krs, t, n, j);
        k[0] = kb ? kb + j * krs : (const DR_SRC *)t->k[j];
        DR(qk_tile)(R, 1, E, q, k, s + j, lds);
    }
}

/* s[i*lds + j] = q_i . k_j for i < rows, j < n (keys as in DR(qk_part)):
 * rows by groups of DR_QR (at most VW), then the rest; the first group asks
 * for the rows, the others find them cached. */
static FA_ALWAYS_INLINE void DR(qk_keys)(int64_t rows, int64_t E, int64_t Ev, const FA_T *q,
                                         const DR_SRC *kb, int64_t krs, const fa_krows *t,
                                         int64_t n, FA_T *s, int64_t lds)
{
    const int RG = VW < DR_QR ? VW : DR_QR;
    int64_t i = 0;
    for (; i + RG <= rows; i += RG)
        DR(qk_part)(RG, i == 0, E, Ev, q + i * E, kb, krs, t, n, s + i * lds, lds);
    const int pf = i == 0;
    switch (rows - i) { /* (a tile of R rows needs R <= VW lanes) */
    case 3:
        if (VW >= 4) DR(qk_part)(3, pf, E, Ev, q + i * E, kb, krs, t, n, s + i * lds, lds);
        break;
    case 2:
        if (VW >= 2) DR(qk_part)(2, pf, E, Ev, q + i * E, kb, krs, t, n, s + i * lds, lds);
        break;
    case 1: DR(qk_part)(1, pf, E, Ev, q + i * E, kb, krs, t, n, s + i * lds, lds); break;
    default: break;
    }
}

/* s[i][j] = q[i] . k_j, i < rows, j < t->n; while key j is read, the key
 * row FA_DIRECT_PF_KEYS ahead (past the block: t's prefetch-only rows) and
 * value row j (P.V reads it after the softmax) are prefetched: the rows of
 * a paged block lie anywhere, out of the hardware prefetchers' sight. */
static void DR_QK(int64_t rows, int64_t E, int64_t Ev, const FA_T *q, const fa_krows *t,
                  FA_T *s, int64_t lds)
{
    DR(qk_keys)(rows, E, Ev, q, NULL, 0, t, t->n, s, lds);
}

/* s[i][j] = q[i] . k_j, i < rows, j < nkeys, key j at k + j*krs (the
 * direct decoding path over keys in place): key j + FA_DIRECT_PF_KEYS's
 * row prefetched while key j is read (within the block; the next block's
 * first keys are the hardware prefetcher's, the rows lying at one stride). */
static void DR_QKD(int64_t rows, int64_t nkeys, int64_t E, const FA_T *q, const DR_SRC *k,
                   int64_t krs, FA_T *s, int64_t lds)
{
    DR(qk_keys)(rows, E, 0, q, k, krs, NULL, nkeys, s, lds);
}

/* o[r][c0 + 0..NV*VW) += sum_j p[r][j] v_j[c0 ..] for the R rows at o (ld
 * ldo) and p (ld ldp): the R x NV tile in registers over the block's keys,
 * each value vector loaded once for the R rows; a zero weight skipped,
 * unless nz (none of the R rows' weights in the block is zero: no test,
 * each weight broadcast straight from memory, the same sums); pf >= 0:
 * part pf of npf of the next block's key rows prefetched on the way. */
static FA_ALWAYS_INLINE void DR(pv_tile)(int R, int NV, int nz, int64_t pf, int64_t npf,
                                         const fa_krows *t, const FA_T *restrict p, int64_t ldp,
                                         int64_t c0, FA_T *restrict o, int64_t ldo)
{
    VT acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) acc[r][u] = V(load)(o + r * ldo + c0 + u * VW);
    for (int64_t j = 0; j < t->n; j++) {
        if (pf >= 0) fa_krows_prefetch_part(t, j, pf, npf);
        const DR_SRC *vj = (const DR_SRC *)t->v[j] + c0;
        VT vv[8];
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) vv[u] = DR_LOAD(vj + u * VW);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const FA_T w = p[r * ldp + j];
            if (!nz && w == 0) continue;
            const VT vw = V(set1)(w);
#pragma GCC unroll 8
            for (int u = 0; u < NV; u++) acc[r][u] = V(fma)(vw, vv[u], acc[r][u]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) V(store)(o + r * ldo + c0 + u * VW, acc[r][u]);
}

/* 1 if none of the R rows' weights p[r*ldp + j], j < n, is zero. */
static FA_ALWAYS_INLINE int DR(no_zero)(int R, const FA_T *p, int64_t ldp, int64_t n)
{
    int z = 0;
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) z |= p[r * ldp + j] == 0;
    return !z;
}

/* The column tiles of one pass of NV-vector tiles (then single vectors)
 * over Ev columns. */
static FA_ALWAYS_INLINE int64_t DR(ntiles)(int NV, int64_t Ev)
{
    return Ev / (NV * VW) + Ev % (NV * VW) / VW;
}

/* The vector columns of rows r < R: NV-vector tiles, then single vectors;
 * where pf >= 0, tile i prefetches part pf + i of npf of the next block's
 * keys (parts from npf on: none; no tile at all if Ev < VW: a head that
 * small is no stream to keep up).  Returns the first column left. */
static FA_ALWAYS_INLINE int64_t DR(pv_vectors)(int R, int NV, int nz, int64_t pf, int64_t npf,
                                               int64_t Ev, const FA_T *p, int64_t ldp,
                                               const fa_krows *t, FA_T *o, int64_t ldo)
{
    int64_t c = 0, i = pf;
    for (; c + NV * VW <= Ev; c += NV * VW, i++)
        DR(pv_tile)(R, NV, nz, pf >= 0 && i < npf ? i : -1, npf, t, p, ldp, c, o, ldo);
    for (; c + VW <= Ev; c += VW, i++)
        DR(pv_tile)(R, 1, nz, pf >= 0 && i < npf ? i : -1, npf, t, p, ldp, c, o, ldo);
    return c;
}

/* Rows r < R of P.V over the block: the vector columns (without a weight
 * test where no weight is zero, which is most blocks of a decoding step:
 * only hidden keys and underflows give zeros), then the last Ev % VW
 * columns one by one (the sums of pv_direct's tail). */
static FA_ALWAYS_INLINE void DR(pv_part)(int R, int NV, int64_t pf, int64_t npf, int64_t Ev,
                                         const FA_T *p, int64_t ldp, const fa_krows *t, FA_T *o,
                                         int64_t ldo)
{
    const int64_t c = DR(no_zero)(R, p, ldp, t->n)
                          ? DR(pv_vectors)(R, NV, 1, pf, npf, Ev, p, ldp, t, o, ldo)
                          : DR(pv_vectors)(R, NV, 0, pf, npf, Ev, p, ldp, t, o, ldo);
    if (c == Ev) return;
    for (int64_t j = 0; j < t->n; j++) {
        const DR_SRC *vj = (const DR_SRC *)t->v[j];
        for (int r = 0; r < R; r++) {
            const FA_T w = p[r * ldp + j];
            if (w == 0) continue;
            for (int64_t cc = c; cc < Ev; cc++) o[r * ldo + cc] += w * DR_TO(vj[cc]);
        }
    }
}

/* o[i][:Ev] += sum_j p[i][j] v_j, i < rows, j < t->n: rows by fours, the
 * tile's DR_ACC accumulators as 4 rows x DR_ACC/4 vectors, each value
 * vector loaded (and widened) once for the four rows.  Widened rows
 * (DR_WIDEN): then a pair, then one; the first tile of the first rows asks
 * for the next block's key rows whole (16-bit rows are bound by their
 * arithmetic: spreading the requests over the tiles cost bfloat16 4-6% on
 * avx2).  Rows that need none (float32, float64): the rows left over one
 * at a time, 8 vectors, each value vector an operand of its FMA; such rows
 * read memory as fast as they can ask for it, so every tile asks for its
 * own share of the next block's key rows' lines and memory is read through
 * the whole of P.V rather than in one burst in the first tile (on avx2,
 * from memory: 1.07-1.11x).  Four float32 rows sharing each value load
 * (a grouped-query decoding step's query heads) against one row at a time:
 * 1.17-1.23x from memory, 1.28-1.47x from the caches (Zen 5, avx512; on
 * its avx2 tier 1.09-1.11x and 1.31x), but 0.94-0.95x from memory on two
 * threads sharing the memory, where reading each value row whole in one
 * pass seems to suit the prefetchers better; the same sums, so the same
 * bits. */
static void DR_PV(int64_t rows, int64_t Ev, const FA_T *p, int64_t ldp, const fa_krows *t,
                  FA_T *o, int64_t ldo)
{
    int64_t i = 0;
    if (DR_WIDEN) {
        for (; i + 4 <= rows; i += 4)
            DR(pv_part)(4, DR_ACC / 4, i == 0 ? 0 : -1, 1, Ev, p + i * ldp, ldp, t, o + i * ldo,
                        ldo);
        for (; i + 2 <= rows; i += 2)
            DR(pv_part)(2, DR_ACC / 2, i == 0 ? 0 : -1, 1, Ev, p + i * ldp, ldp, t, o + i * ldo,
                        ldo);
        for (; i < rows; i++)
            DR(pv_part)(1, 8, i == 0 ? 0 : -1, 1, Ev, p + i * ldp, ldp, t, o + i * ldo, ldo);
        return;
    }
    /* the next block's key rows in npf parts, one per tile of every row
     * group (none where DR(touch): Q.K^T's own requests fetch them) */
    const int64_t n4 = DR(ntiles)(DR_ACC / 4, Ev), n1 = DR(ntiles)(8, Ev), g4 = rows / 4;
    const int64_t npf = g4 * n4 + rows % 4 * n1;
    const int none = DR(touch)(t);
    for (; i + 4 <= rows; i += 4)
        DR(pv_part)(4, DR_ACC / 4, none ? -1 : i / 4 * n4, npf, Ev, p + i * ldp, ldp, t,
                    o + i * ldo, ldo);
    for (; i < rows; i++)
        DR(pv_part)(1, 8, none ? -1 : g4 * n4 + (i - 4 * g4) * n1, npf, Ev, p + i * ldp, ldp, t,
                    o + i * ldo, ldo);
}

#undef DR_QR
#undef DR_TOUCH
#undef DR_ACC
#undef DR_SRC
#undef DR_WIDEN
#undef DR_LOAD
#undef DR_TO
#undef DR_QK
#undef DR_QKD
#undef DR_KL
#undef DR_KLMAX
#undef DR_PV
#undef DR
