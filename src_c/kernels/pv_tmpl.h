/* pv_tmpl.h -- o += p . vp over the register tile of kernels_tmpl.h, for the
 * weights row-major (the forward's P.V) or transposed (the backward's P^T.dO
 * and dS^T.Q, whose weight tiles come out of Q.K^T with the queries on
 * rows).  Part of kernels_tmpl.h (FA_SFX, FA_ISA_NAME; FN, FA_T, NR, PV_MR,
 * FN(tile)): FN(pv_any) -> pv_any_f32_avx2, ...; FN(pv) -> pv_f32_avx2,
 * pv_f64_generic, ...; FN(pvt) -> pvt_f32_avx512, ... */

/* A group of R rows of pv_any (1 <= R <= PV_MR): the register tile with a
 * constant R per case, so that its R x NRV accumulators stay in registers. */
static FA_ALWAYS_INLINE void FN(pv_group)(int R, int64_t nkeys, const FA_T *p, int64_t prs,
                                          int64_t pks, const FA_T *pan, FA_T *o, int64_t ldo)
{
    switch (R) {
#define FA_PV_GROUP(r) \
    case r: FN(tile)(r, 0, nkeys, p, prs, pks, pan, NR, o, ldo, NULL); break;
    FA_PV_GROUP(1)
    FA_PV_GROUP(2)
    FA_PV_GROUP(3)
    FA_PV_GROUP(4)
#if PV_MR > 4
    FA_PV_GROUP(5)
#endif
#if PV_MR > 5
    FA_PV_GROUP(6)
#endif
#if PV_MR > 6
    FA_PV_GROUP(7)
#endif
#if PV_MR > 7
    FA_PV_GROUP(8)
#endif
#undef FA_PV_GROUP
    default: break;
    }
}
/* pv_group has a case for every R up to PV_MR.  FN(pv_group_cases) ->
 * pv_group_cases_f32_avx2, ...: an array of negative size otherwise. */
typedef char FN(pv_group_cases)[PV_MR >= 4 && PV_MR <= 8 ? 1 : -1];

/* The accumulator rows of the next group (rows r0 .. r0 + PV_MR of the
 * columns c .. c + NR; past the last row, the first rows of the next
 * columns) asked for while the current group runs: the backward's dK, dV
 * and dQ sums (1 MiB for a head at S = 1024, E = 128) come from the L2 or
 * further, and a group's first FMAs waited on them (a 1024 x 128 float32
 * backward 1.044x faster [1.004, 1.062], 8 alternating runs on an Intel
 * Xeon; 1024 x 64, 2048 causal and the forward unchanged). */
static FA_ALWAYS_INLINE void FN(pv_ask)(const FA_T *o, int64_t ldo, int64_t r0, int64_t rows,
                                        int64_t c, int64_t ncols)
{
    if (r0 >= rows) {
        if (c + NR >= ncols) return;
        r0 = 0, c += NR;
    }
    const int64_t r1 = r0 + PV_MR < rows ? r0 + PV_MR : rows;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < NR * (int64_t)sizeof(FA_T); b += 64)
            FA_PREFETCH_W((const char *)(o + r * ldo + c) + b);
}

/* o[rows x ncols] += p . vp, p[i][k] at p + i*prs + k*pks: always inlined
 * with prs or pks 1, so the broadcast of a weight is one load either way.
 * The rows go in groups of PV_MR, but a remainder is not left to groups of
 * one or two rows, whose two or four accumulators cannot hide the FMA's
 * latency (each k would wait on the previous one): it joins the last whole
 * group and the two are split evenly (a key block's 128 rows on AVX2: 20
 * groups of 6, then 4 and 4; on NEON 24 groups of 5, then 4 and 4); fewer
 * rows than PV_MR are one group.  Each element of o is one chain of fused
 * multiply-adds over k in order, whatever group it falls in, so the
 * grouping leaves the bits alone, and pvt of p^T is bitwise pv of p. */
static FA_ALWAYS_INLINE void FN(pv_any)(int64_t rows, int64_t nkeys, int64_t ncols,
                                        const FA_T *p, int64_t prs, int64_t pks,
                                        const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo)
{
    const int64_t rem = rows % PV_MR;
    const int64_t body = rows > PV_MR && rem ? rows - PV_MR - rem : rows - rem;
    const int64_t tail = rows - body, first = rows < PV_MR ? tail : (tail + 1) / 2;
    /* One panel (nkeys x NR, contiguous) at a time: it stays in L1 while every
     * row group streams its probabilities past it. */
    for (int64_t c = 0; c < ncols; c += NR) {
        const FA_T *pan = vp + (c / NR) * pstride;
        for (int64_t i = 0; i < body; i += PV_MR) {
            FN(pv_ask)(o, ldo, i + PV_MR, rows, c, ncols);
            FN(tile)(PV_MR, 0, nkeys, p + i * prs, prs, pks, pan, NR, o + i * ldo + c, ldo, NULL);
        }
        if (first > 0)
            FN(pv_group)((int)first, nkeys, p + body * prs, prs, pks, pan, o + body * ldo + c,
                         ldo);
        if (tail > first)
            FN(pv_group)((int)(tail - first), nkeys, p + (body + first) * prs, prs, pks, pan,
                         o + (body + first) * ldo + c, ldo);
    }
}

static void FN(pv)(int64_t rows, int64_t nkeys, int64_t ncols, const FA_T *p, int64_t ldp,
                   const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo)
{
    FN(pv_any)(rows, nkeys, ncols, p, ldp, 1, vp, pstride, o, ldo);
}

static void FN(pvt)(int64_t rows, int64_t nkeys, int64_t ncols, const FA_T *pt, int64_t ldp,
                    const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo)
{
    FN(pv_any)(rows, nkeys, ncols, pt, 1, ldp, vp, pstride, o, ldo);
}
