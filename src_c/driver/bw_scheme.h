/* bw_scheme.h -- which of the backward's two schemes a call runs, and the
 * grouped query heads its dK/dV items sum over, for the float backward
 * (backward_tmpl.h) and the 16-bit one (bw16.c) alike. */
#ifndef FASTATTN_BW_SCHEME_H
#define FASTATTN_BW_SCHEME_H

#include <stddef.h>
#include <stdint.h>

#include "fastattn.h"
#include "kernels/blocking.h"

/* 1: the fused pass (one item per key head, nkh of them: a batch index
 * each without grouped query heads, fa_bw_group; five products per pair);
 * 0: the two passes (items per key block and per query block, seven).  The
 * fused pass's time is its busiest thread's, ceil(nkh / nt) items; the two
 * passes' items are small enough to share the nt threads evenly.  So fused
 * where 5 ceil(nkh / nt) <= 7 nkh / nt: always on one thread, 8 key heads
 * on up to 11 threads but not on 12 or more, one head on two threads
 * never; and only where an item's keys, S (3E + 2Ev) elements of elem
 * bytes, fit FA_BW_FUSED_MAX_BYTES (blocking.h).  Both schemes sum every
 * gradient element over the same pairs in the same order, so the choice,
 * which depends on the thread count, never changes a bit. */
static inline int fa_bw_fuses(int64_t nkh, int nt, int64_t S, int64_t E, int64_t Ev,
                              size_t elem)
{
    const double bytes = (double)S * (double)(3 * E + 2 * Ev) * (double)elem;
    const int64_t t = nt < 1 ? 1 : nt, busiest = (nkh + t - 1) / t;
    return bytes <= FA_BW_FUSED_MAX_BYTES &&
           FA_BW_FUSED_PRODUCTS * busiest * t <= FA_BW_PASSES_PRODUCTS * nkh;
}

/* The grouped query heads that share one key head's dK and dV: the length
 * of the last batch dimension where dk and dv are both broadcast along it
 * (stride 0: the grouped-query layout (..., Hkv, g)), else 1.  The drivers
 * then run one dK/dV item per key head over its g batch indices in order,
 * so each key's gradient is summed over the group in one fixed order.  -1
 * (refused) where some other batch dimension of length > 1 has a gradient
 * broadcast along it, or dk alone or dv alone along the last: two items
 * would write one element. */
static inline int64_t fa_bw_group(const fa_backward_args *g)
{
    const int nd = g->fwd.nbatch_dims;
    int64_t grp = 1;
    for (int d = 0; d < nd; d++) {
        if (g->fwd.batch_shape[d] <= 1) continue;
        const int zk = g->dk.bstride[d] == 0, zv = g->dv.bstride[d] == 0;
        if (g->dq.bstride[d] == 0 || zk != zv || (zk && d != nd - 1)) return -1;
        if (zk) grp = g->fwd.batch_shape[d];
    }
    return grp;
}

/* Whether the mask's gradient (if asked for) has one element per batch
 * index, row and key: no stride 0 where two items would write one element. */
static inline int fa_bw_dmask_ok(const fa_backward_args *g)
{
    const fa_operand *m = &g->dmask;
    if (!m->data) return 1;
    for (int d = 0; d < g->fwd.nbatch_dims; d++)
        if (g->fwd.batch_shape[d] > 1 && m->bstride[d] == 0) return 0;
    return !(g->fwd.L > 1 && m->rs == 0) && !(g->fwd.S > 1 && m->cs == 0);
}

#endif
