/* pv_tmpl.h -- o += p . vp over the register tile of kernels_tmpl.h, for the
 * weights row-major (the forward's P.V) or transposed (the backward's P^T.dO
 * and dS^T.Q, whose weight tiles come out of Q.K^T with the queries on
 * rows).  Part of kernels_tmpl.h (FA_SFX, FA_ISA_NAME; FN, FA_T, NR, PV_MR,
 * FN(tile)): FN(pv_any) -> pv_any_f32_avx2, ...; FN(pv) -> pv_f32_avx2,
 * pv_f64_generic, ...; FN(pvt) -> pvt_f32_avx512, ... */

/* o[rows x ncols] += p . vp, p[i][k] at p + i*prs + k*pks: always inlined
 * with prs or pks 1, so the broadcast of a weight is one load either way.
 * Each element of o is one chain of fused multiply-adds over k in order,
 * whatever row group it falls in, so pvt of p^T is bitwise pv of p. */
static FA_ALWAYS_INLINE void FN(pv_any)(int64_t rows, int64_t nkeys, int64_t ncols,
                                        const FA_T *p, int64_t prs, int64_t pks,
                                        const FA_T *vp, int64_t pstride, FA_T *o, int64_t ldo)
{
    /* One panel (nkeys x NR, contiguous) at a time: it stays in L1 while every
     * row group streams its probabilities past it. */
    for (int64_t c = 0; c < ncols; c += NR) {
        const FA_T *pan = vp + (c / NR) * pstride;
        int64_t i = 0;
        for (; i + PV_MR <= rows; i += PV_MR)
            FN(tile)(PV_MR, 0, nkeys, p + i * prs, prs, pks, pan, NR, o + i * ldo + c, ldo, NULL);
        for (; i + PV_MR / 2 <= rows; i += PV_MR / 2)
            FN(tile)(PV_MR / 2, 0, nkeys, p + i * prs, prs, pks, pan, NR, o + i * ldo + c, ldo,
                     NULL);
        for (; i < rows; i++)
            FN(tile)(1, 0, nkeys, p + i * prs, prs, pks, pan, NR, o + i * ldo + c, ldo, NULL);
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
