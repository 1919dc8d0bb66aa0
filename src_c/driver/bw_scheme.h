/* bw_scheme.h -- which of the backward's two schemes a call runs, for the
 * float backward (backward_tmpl.h) and the 16-bit one (bw16.c) alike. */
#ifndef FASTATTN_BW_SCHEME_H
#define FASTATTN_BW_SCHEME_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/blocking.h"

/* 1: the fused pass (one item per batch index, five products per pair);
 * 0: the two passes (items per key block and per query block, seven).  The
 * fused pass's time is its busiest thread's, ceil(nbatch / nt) items; the
 * two passes' items are small enough to share the nt threads evenly.  So
 * fused where 5 ceil(nbatch / nt) <= 7 nbatch / nt: always on one thread,
 * 8 batch indices on up to 11 threads but not on 12 or more, one index on
 * two threads never; and only where an item's keys, S (3E + 2Ev) elements
 * of elem bytes, fit FA_BW_FUSED_MAX_BYTES (blocking.h).  Both schemes sum
 * every gradient element over the same pairs in the same order, so the
 * choice, which depends on the thread count, never changes a bit. */
static inline int fa_bw_fuses(int64_t nbatch, int nt, int64_t S, int64_t E, int64_t Ev,
                              size_t elem)
{
    const double bytes = (double)S * (double)(3 * E + 2 * Ev) * (double)elem;
    const int64_t t = nt < 1 ? 1 : nt, busiest = (nbatch + t - 1) / t;
    return bytes <= FA_BW_FUSED_MAX_BYTES &&
           FA_BW_FUSED_PRODUCTS * busiest * t <= FA_BW_PASSES_PRODUCTS * nbatch;
}

#endif
