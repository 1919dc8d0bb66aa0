/* mask_summary.h -- the boolean mask summarised once per call.  For every
 * distinct mask slice (batch dimensions the mask broadcasts over, stride 0,
 * share one slice), query tile (mcp rows) and key block (FA_KC keys), one
 * byte says whether the block is hidden from every row of the tile (it is
 * skipped: neither packed nor computed), visible to every row (it runs
 * without the per-element mask, on the fast path) or mixed (the mask is
 * applied).  The table is allocated with the rest of the scratch and filled
 * before the work items run.  Included once by attention.c. */
#ifndef FASTATTN_MASK_SUMMARY_H
#define FASTATTN_MASK_SUMMARY_H

#include <stdint.h>

#include "fastattn.h"
#include "kernels/blocking.h"
#include "runtime/util.h"

enum { FA_BLK_HIDDEN = 0, FA_BLK_MIXED = 1, FA_BLK_VISIBLE = 2 };

/* The table: state[(slice * ntiles + tile) * nkb + key block]. */
typedef struct fa_mask_summary {
    const fa_attention_args *a;
    uint8_t *state;          /* NULL: no boolean mask */
    int64_t nslices, ntiles, nkb, mcp;
} fa_mask_summary;

/* The state of the mask rows [0, ni) x keys [0, nk) at m (strides rs, cs;
 * rs == 0: every row is the first): byte max / min reductions (any / every
 * entry nonzero), which the compiler vectorises on contiguous rows. */
static int fa_bool_block_state(const uint8_t *m, int64_t rs, int64_t cs, int64_t ni, int64_t nk)
{
    uint8_t any = 0, all = 1;
    if (rs == 0 && ni > 1) ni = 1;
    for (int64_t i = 0; i < ni; i++) {
        const uint8_t *row = m + i * rs;
        uint8_t hi = 0, lo = 0xff;
        if (cs == 1) {
            for (int64_t j = 0; j < nk; j++) {
                hi = row[j] > hi ? row[j] : hi;
                lo = row[j] < lo ? row[j] : lo;
            }
        } else {
            for (int64_t j = 0; j < nk; j++) {
                hi = row[j * cs] > hi ? row[j * cs] : hi;
                lo = row[j * cs] < lo ? row[j * cs] : lo;
            }
        }
        any |= hi != 0;
        all &= lo != 0;
        if (any && !all) return FA_BLK_MIXED;
    }
    if (!any || nk == 0) return FA_BLK_HIDDEN;
    return all ? FA_BLK_VISIBLE : FA_BLK_MIXED;
}

/* Distinct mask slices: the product of the batch dimensions along which the
 * mask does not broadcast.  fa_batch_offsets numbers them (off->bms). */
static int64_t fa_bool_slices(const fa_attention_args *a)
{
    int64_t n = 1;
    for (int d = 0; d < a->nbatch_dims; d++)
        if (a->bool_mask.bstride[d] != 0) n *= a->batch_shape[d];
    return n;
}

/* Element offset of mask slice s (the inverse of fa_batch_offsets' bms). */
static int64_t fa_bool_slice_offset(const fa_attention_args *a, int64_t s)
{
    int64_t off = 0;
    for (int d = a->nbatch_dims - 1; d >= 0; d--) {
        if (a->bool_mask.bstride[d] == 0) continue;
        off += (s % a->batch_shape[d]) * a->bool_mask.bstride[d];
        s /= a->batch_shape[d];
    }
    return off;
}

/* The sizes of the table of call a (tiles of mcp rows); its bytes. */
static inline int64_t fa_mask_summary_init(fa_mask_summary *ms, const fa_attention_args *a,
                                           int64_t mcp)
{
    ms->a = a;
    ms->state = NULL;
    ms->mcp = mcp;
    ms->ntiles = fa_div_up(a->L, mcp);
    ms->nkb = fa_div_up(a->S, FA_KC);
    ms->nslices = a->bool_mask.data ? fa_bool_slices(a) : 0;
    return ms->nslices * ms->ntiles * ms->nkb;
}

/* Work item it = (slice, tile): the states of its key blocks (a
 * fa_parallel_for item; ctx: the fa_mask_summary). */
static inline void fa_mask_summary_fill(void *ctx, int64_t it, int tid)
{
    const fa_mask_summary *ms = (const fa_mask_summary *)ctx;
    const fa_attention_args *a = ms->a;
    const int64_t s = it / ms->ntiles, t = it % ms->ntiles, i0 = t * ms->mcp;
    const int64_t ni = fa_min64(a->L - i0, ms->mcp), rs = a->bool_mask.rs, cs = a->bool_mask.cs;
    const uint8_t *m = (const uint8_t *)a->bool_mask.data + fa_bool_slice_offset(a, s) + i0 * rs;
    uint8_t *row = ms->state + it * ms->nkb;
    (void)tid;
    for (int64_t kbi = 0; kbi < ms->nkb; kbi++) {
        const int64_t kb = kbi * FA_KC;
        const int64_t nk = fa_min64(a->S - kb, FA_KC);
        row[kbi] = (uint8_t)fa_bool_block_state(m + kb * cs, rs, cs, ni, nk);
    }
}

/* The state of mask slice bms, tile t, key block kbi. */
static inline int fa_mask_summary_at(const fa_mask_summary *ms, int64_t bms, int64_t t,
                                     int64_t kbi)
{
    return ms->state[(bms * ms->ntiles + t) * ms->nkb + kbi];
}

#endif
