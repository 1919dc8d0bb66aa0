/* offsets.h -- the element offsets of one batch index in every operand of
 * a call, computed in one place for the float drivers (attention.c) and the
 * 16-bit matrix driver (flash16.c), and those of a backward call's own operands
 * (fa_bw_offsets: the float and 16-bit backward drivers). */
#ifndef FASTATTN_OFFSETS_H
#define FASTATTN_OFFSETS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fastattn.h"
#include "runtime/util.h"

/* The bytes of one element of a storage type (FA_INT8 included). */
static inline int64_t fa_storage_bytes(int st)
{
    return st == FA_FLOAT64 ? 8 : st == FA_FLOAT32 ? 4 : st == FA_INT8 ? 1 : 2;
}

/* bms: the batch index's slice of the boolean mask (mask_summary.h). */
typedef struct fa_offsets {
    int64_t q, k, v, o, bm, am, pad, bms;
    int64_t al, sk, lse; /* the score options' operands (zero when absent) */
} fa_offsets;

static inline void fa_batch_offsets(const fa_attention_args *a, int64_t b, fa_offsets *off)
{
    memset(off, 0, sizeof(*off));
    int64_t nbms = 1;
    for (int d = a->nbatch_dims - 1; d >= 0; d--) {
        int64_t n = a->batch_shape[d], i = b % n;
        b /= n;
        off->q += i * a->q.bstride[d];
        off->k += i * a->k.bstride[d];
        off->v += i * a->v.bstride[d];
        off->o += i * a->out.bstride[d];
        off->bm += i * a->bool_mask.bstride[d];
        off->am += i * a->add_mask.bstride[d];
        off->pad += i * a->pad.bstride[d];
        if (a->bool_mask.bstride[d] != 0) { off->bms += i * nbms; nbms *= n; }
        if (a->alibi.data) off->al += i * a->alibi.bstride[d];
        if (a->sinks.data) off->sk += i * a->sinks.bstride[d];
        if (a->lse.data) off->lse += i * a->lse.bstride[d];
    }
}

/* Do two batch indices read the same keys, values and key padding (then
 * what was packed of one's keys serves the other)? */
static inline int fa_same_keys(const fa_offsets *x, const fa_offsets *y)
{
    return x->k == y->k && x->v == y->v && x->pad == y->pad;
}

/* The log-sum-exp (natural log) of a row whose scores, shifted by m, sum to
 * l > 0: m + log l, from log2 units when base2. */
static inline double fa_lse_of(double m, double l, int base2)
{
    return base2 ? (m + log2(l)) * FA_LN2 : m + log(l);
}

/* The offsets of one batch index in the operands a backward call adds to
 * the forward's (the float backward, backward_tmpl.h, and the 16-bit one,
 * bw16.c); delta indexes the plan's [nbatch x L] D_i - g_i. */
typedef struct fa_bw_offsets {
    int64_t dout, lse, glse, dq, dk, dv, dsinks, dmask, delta;
} fa_bw_offsets;

static inline void fa_bw_offsets_of(const fa_backward_args *g, int64_t b, fa_bw_offsets *o)
{
    memset(o, 0, sizeof *o);
    o->delta = b * g->fwd.L;
    for (int d = g->fwd.nbatch_dims - 1; d >= 0; d--) {
        const int64_t n = g->fwd.batch_shape[d], i = b % n;
        b /= n;
        o->dout += i * g->dout.bstride[d];
        o->lse += i * g->fwd.lse.bstride[d];
        if (g->glse.data) o->glse += i * g->glse.bstride[d];
        if (g->fwd.sinks.data) o->dsinks += i * g->dsinks.bstride[d];
        if (g->dmask.data) o->dmask += i * g->dmask.bstride[d];
        o->dq += i * g->dq.bstride[d];
        o->dk += i * g->dk.bstride[d];
        o->dv += i * g->dv.bstride[d];
    }
}

#endif
