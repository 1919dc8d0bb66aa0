/* scratch.h -- the layout of one thread's scratch, computed in one place:
 * the drivers size the allocation with it (plan_tmpl.h) and carve the
 * arrays out of it (scratch_tmpl.h). */
#ifndef FASTATTN_SCRATCH_H
#define FASTATTN_SCRATCH_H

#include <stdint.h>

#include "kernels/blocking.h"

/* Offsets of the arrays in one thread's scratch, in elements, and its size. */
typedef struct fa_scratch_layout {
    int64_t qp;    /* packed queries: rows x Epad */
    int64_t kp;    /* packed key block: FA_KC x Epad (nr-key panels) */
    int64_t vp;    /* packed value block: FA_KC x ldv (nr-column panels) */
    int64_t st;    /* score tile: mcp x FA_KC */
    int64_t o;     /* unnormalised output: rows x ldv */
    int64_t m, l;  /* running max and sum: rows each */
    int64_t lv;    /* the sums kept lane-wise while streaming: rows x vw */
    int64_t vmax;  /* Q.K^T's lane-wise row maxima: mcp x vw */
    int64_t w;     /* the weights of one tile, when the caller's are 16-bit: wlen */
    int64_t total; /* elements to allocate (64 of slack) */
} fa_scratch_layout;

/* rows: query rows of a work item (a chunk of tiles); mcp: rows of one
 * tile; Epad: E, at least 1; ldv: Ev rounded up to nr; vw: vector lanes. */
static inline fa_scratch_layout fa_scratch_layout_of(int64_t rows, int64_t mcp, int64_t Epad,
                                                     int64_t ldv, int64_t vw, int64_t wlen)
{
    fa_scratch_layout s;
    s.qp = 0;
    s.kp = s.qp + rows * Epad;
    s.vp = s.kp + FA_KC * Epad;
    s.st = s.vp + FA_KC * ldv;
    s.o = s.st + mcp * FA_KC;
    s.m = s.o + rows * ldv;
    s.l = s.m + rows;
    s.lv = s.l + rows;
    s.vmax = s.lv + rows * vw;
    s.w = s.vmax + mcp * vw;
    s.total = s.w + wlen + 64;
    return s;
}

#endif
