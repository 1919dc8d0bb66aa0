/* decode_q8.h -- one work item of fa_decode_q8 (driver/decode_q8.c): the
 * query rows of one (batch, kv head) against that head's int8 keys and
 * values, computed by the kernel of the ISA in use (decode_q8_tmpl.h, built
 * into kernels/kernels_isa.c once per ISA: the decode_q8 entry of its f32
 * table, kernels.h). */
#ifndef FASTATTN_DECODE_Q8_H
#define FASTATTN_DECODE_Q8_H

#include <stdint.h>

#include "kernels/blocking.h"

/* Row r < rows of an item is query i = r % L of its head g = r / L (the
 * item's G = rows / L query heads share its kv head).  Key j (< S) is
 * k_scale[j] * k[j*k_rs + 0..E), value j v_scale[j] * v[j*v_rs + 0..Ev). */
typedef struct fa_q8_item {
    int64_t rows, L, S, E, Ev;
    const float *q;          /* row (g, i) at q + g*q_hs + i*q_rs */
    int64_t q_hs, q_rs;
    const int8_t *k, *v;
    int64_t k_rs, v_rs;
    const float *k_scale, *v_scale;
    float *out;              /* row (g, i) at out + g*o_hs + i*o_rs */
    int64_t o_hs, o_rs;
    float *lse;              /* NULL, or lse[g*L + i] */
    const uint8_t *pad;      /* NULL, or pad[j] = 1: key j hidden */
    float scale, softcap;    /* softcap <= 0: none */
    const double *alibi;     /* NULL, or alibi[g]: the slope of head g */
    const double *sinks;     /* NULL, or sinks[g] */
    int causal;
    int64_t causal_offset;   /* query i at key position i + causal_offset */
    int64_t win_left, win_right;
    float *scratch;          /* fa_q8_scratch_floats(Ev) floats, this thread's */
} fa_q8_item;

/* The accumulators' leading dimension: Ev rounded up to 16 floats. */
static inline int64_t fa_q8_ldo(int64_t Ev) { return (Ev + 15) / 16 * 16; }

/* Floats of one thread's scratch: FA_Q8_ROWS x FA_Q8_KC scores, the
 * FA_Q8_ROWS output accumulators (Ev rounded up to 16), and slack. */
static inline int64_t fa_q8_scratch_floats(int64_t Ev)
{
    return FA_Q8_ROWS * FA_Q8_KC + FA_Q8_ROWS * fa_q8_ldo(Ev) + 64;
}

#endif
