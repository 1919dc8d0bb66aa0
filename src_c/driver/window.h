/* window.h -- the key range each query row sees by causality and the
 * sliding window, written once.  Query row i sits at key position p(i) =
 * i + causal_offset and sees keys p(i) - win_left <= j <= p(i) + win_right,
 * the right side cut to p(i) with causal.  As offsets from i: keys
 * i + lo <= j (when has_lo) and j <= i + hi (when has_hi); a side wider
 * than L + S bounds nothing, so it is dropped (no overflow, and without a
 * window the limits are exactly the causal ones).  Shared by the float
 * drivers (attention.c) and the 16-bit matrix driver (flash16.c). */
#ifndef FASTATTN_WINDOW_H
#define FASTATTN_WINDOW_H

#include <stdint.h>

#include "fastattn.h"

typedef struct fa_limits {
    int64_t lo, hi;     /* row i sees keys i + lo <= j <= i + hi */
    int has_lo, has_hi; /* 0: that side is unbounded */
} fa_limits;

/* The limits of L rows against S keys with these bounds (fa_attention_args'
 * meaning of causal, causal_offset, win_left and win_right). */
static inline fa_limits fa_limits_at(int causal, int64_t causal_offset, int64_t win_left,
                                     int64_t win_right, int64_t L, int64_t S)
{
    const int64_t wide = L + S + 1;
    int64_t right = win_right;
    fa_limits w = {0, 0, 0, 0};
    if (causal && right > 0) right = 0;
    if (right < wide) {
        w.has_hi = 1;
        w.hi = causal_offset + right;
    }
    if (win_left < wide) {
        w.has_lo = 1;
        w.lo = causal_offset - win_left;
    }
    return w;
}

static inline fa_limits fa_limits_of(const fa_attention_args *a)
{
    return fa_limits_at(a->causal, a->causal_offset, a->win_left, a->win_right, a->L, a->S);
}

/* Does the window cut the keys [kb, kb + nk) for some row of [i0, i0 + ni)? */
static inline int fa_limits_cut(const fa_limits *w, int64_t i0, int64_t ni, int64_t kb,
                                int64_t nk)
{
    return (w->has_hi && kb + nk - 1 > i0 + w->hi) || (w->has_lo && kb < i0 + ni - 1 + w->lo);
}

/* Is every key of [kb, kb + nk) outside the window of every row of
 * [i0, i0 + ni)? */
static inline int fa_limits_none(const fa_limits *w, int64_t i0, int64_t ni, int64_t kb,
                                 int64_t nk)
{
    return (w->has_hi && kb > i0 + ni - 1 + w->hi) || (w->has_lo && kb + nk - 1 < i0 + w->lo);
}

/* The keys [*lo, *hi) some row of [i0, i0 + ni) sees, of S (empty: *lo >= *hi). */
static inline void fa_limits_keys(const fa_limits *w, int64_t i0, int64_t ni, int64_t S,
                                  int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = S;
    if (w->has_lo && i0 + w->lo > *lo) *lo = i0 + w->lo;
    if (w->has_hi && i0 + ni - 1 + w->hi + 1 < *hi) *hi = i0 + ni - 1 + w->hi + 1;
}

#endif
