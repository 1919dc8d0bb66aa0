/* pack_v_tmpl.h -- the vp panels of kernels.h ([nk x NR] per panel of NR
 * value columns, zero beyond Ev) from values of element type PV_SRC, each
 * vector loaded (and widened) by PV_LOAD and each scalar by PV_TO, watching
 * for NaN/Inf (returns 1 if a value is one).  Included with these set,
 * after the macros of kernels_tmpl.h's pass:
 *   kernels_tmpl.h:      PV_NAME FN(pack_v)  (pack_v_f32_avx2, ...)   PV_SRC FA_T
 *   kernels_half_tmpl.h: PV_NAME HN(pack_v)  (pack_v_bf16_avx512, ...) PV_SRC uint16_t
 * and leaves them undefined. */
static int PV_NAME(int64_t nk, int64_t Ev, int64_t ldv, const PV_SRC *v, int64_t vrs, FA_T *vp,
                   int64_t pstride)
{
    const int64_t full = Ev / NR; /* panels with no padding */
    VT bad = V(zero)();
    FA_T sbad = 0;
    for (int64_t j = 0; j < nk; j++) {
        const PV_SRC *src = v + j * vrs;
        for (int64_t c = 0; c < full; c++) {
            FA_T *dst = vp + c * pstride + j * NR;
#pragma GCC unroll 4
            for (int u = 0; u < NRV; u++) {
                VT x = PV_LOAD(src + c * NR + u * VW);
                V(store)(dst + u * VW, x);
                bad = V(nan_acc)(bad, V(sub)(x, x));
            }
        }
        if (full * NR < ldv) {
            FA_T *dst = vp + full * pstride + j * NR;
            const int64_t w = Ev - full * NR;
            for (int64_t c = 0; c < w; c++) {
                dst[c] = PV_TO(src[full * NR + c]);
                sbad += dst[c] - dst[c];
            }
            for (int64_t c = w; c < NR; c++) dst[c] = 0;
        }
    }
    FA_T hb = V(hsum)(bad);
    return hb != hb || sbad != sbad;
}
#undef PV_NAME
#undef PV_SRC
#undef PV_LOAD
#undef PV_TO
