/* pv_direct_tmpl.h -- the direct (decoding) P.V of kernels.h from values of
 * element type PV_SRC, each vector loaded (and widened) by PV_LOAD and each
 * scalar by PV_TO: o[i][:Ev] += sum_j p[i][j] v[j][:Ev] for i < rows, value
 * j at v + j*vrs (unit column stride); zero weights are skipped (so a
 * NaN/Inf value behind a zero weight never reaches o).  FA_DIRECT_PV_VECS
 * vectors of a row of o are held in registers over the keys (the same sums,
 * in the same order, as accumulating in memory), and the value row
 * FA_DIRECT_PF_KEYS keys ahead is prefetched (blocking.h).  Included with
 * DV_NAME and pack_v_tmpl.h's PV_SRC, PV_LOAD, PV_TO set, before that
 * template (which undefines those three):
 *   kernels_tmpl.h:      DV_NAME FN(pv_direct)  (pv_direct_f32_avx2, ...)   PV_SRC FA_T
 *   kernels_half_tmpl.h: DV_NAME HN(pv_direct)  (pv_direct_bf16_avx512, ...) PV_SRC uint16_t
 * and leaves DV_NAME undefined. */
static void DV_NAME(int64_t rows, int64_t nkeys, int64_t Ev, const FA_T *p, int64_t ldp,
                    const PV_SRC *v, int64_t vrs, FA_T *o, int64_t ldo)
{
    for (int64_t i = 0; i < rows; i++) {
        FA_T *oi = o + i * ldo;
        const FA_T *pi = p + i * ldp;
        int64_t c = 0;
        for (; c + FA_DIRECT_PV_VECS * VW <= Ev; c += FA_DIRECT_PV_VECS * VW) {
            VT acc[FA_DIRECT_PV_VECS];
#pragma GCC unroll 8
            for (int u = 0; u < FA_DIRECT_PV_VECS; u++) acc[u] = V(load)(oi + c + u * VW);
            for (int64_t j = 0; j < nkeys; j++) {
                const FA_T w = pi[j];
                if (w == 0) continue;
                const PV_SRC *vj = v + j * vrs + c;
                if (j + FA_DIRECT_PF_KEYS < nkeys)
                    for (int64_t b = 0; b < FA_DIRECT_PV_VECS * VW * (int64_t)sizeof(PV_SRC); b += 64)
                        FA_PREFETCH((const char *)(vj + FA_DIRECT_PF_KEYS * vrs) + b);
                const VT vw = V(set1)(w);
#pragma GCC unroll 8
                for (int u = 0; u < FA_DIRECT_PV_VECS; u++) acc[u] = V(fma)(vw, PV_LOAD(vj + u * VW), acc[u]);
            }
#pragma GCC unroll 8
            for (int u = 0; u < FA_DIRECT_PV_VECS; u++) V(store)(oi + c + u * VW, acc[u]);
        }
        for (int64_t j = 0; j < nkeys && c < Ev; j++) { /* the last columns */
            const FA_T w = pi[j];
            if (w == 0) continue;
            const PV_SRC *vj = v + j * vrs;
            const VT vw = V(set1)(w);
            int64_t cc = c;
            for (; cc + VW <= Ev; cc += VW) V(store)(oi + cc, V(fma)(vw, PV_LOAD(vj + cc), V(load)(oi + cc)));
            for (; cc < Ev; cc++) oi[cc] += w * PV_TO(vj[cc]);
        }
    }
}

#undef DV_NAME
