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
 * k_scale[j*ks_rs] * k[j*k_rs + 0..E), value j v_scale[j*vs_rs] *
 * v[j*v_rs + 0..Ev); with a block table (blocks not NULL: a paged cache),
 * key j is row j % block_size of block c = blocks[j / block_size], its
 * levels at k + c*k_bs + (j % block_size)*k_rs and its scale at k_scale +
 * c*ks_bs + (j % block_size)*ks_rs, values likewise.  Keys below key_lo
 * are hidden (a split's start).  part not NULL: no output, the rows'
 * unnormalised state {m, l, o[0 .. part_ld)} (natural-log units, before
 * any sink) stored at part + r*part_rs for the key-split merge. */
typedef struct fa_q8_item {
    int64_t rows, L, S, E, Ev;
    const float *q;          /* row (g, i) at q + g*q_hs + i*q_rs */
    int64_t q_hs, q_rs;
    const int8_t *k, *v;
    int64_t k_rs, v_rs;
    const float *k_scale, *v_scale;
    int64_t ks_rs, vs_rs;
    const int64_t *blocks;   /* NULL: the rows are those of block 0 */
    int64_t block_size, k_bs, v_bs, ks_bs, vs_bs, key_lo;
    float *out;              /* row (g, i) at out + g*o_hs + i*o_rs */
    int64_t o_hs, o_rs;
    float *lse;              /* NULL, or lse[g*lse_hs + i] */
    int64_t lse_hs;
    float *part;
    int64_t part_rs, part_ld;
    const uint8_t *pad;      /* NULL, or pad[j] = 1: key j hidden */
    float scale, softcap;    /* softcap <= 0: none */
    const double *alibi;     /* NULL, or alibi[g]: the slope of head g */
    const double *sinks;     /* NULL, or sinks[g] */
    int causal;
    int64_t causal_offset;   /* query i at key position i + causal_offset */
    int64_t win_left, win_right;
    float *scratch;          /* fa_q8_scratch_floats(Ev) floats, this thread's */
} fa_q8_item;

/* The accumulators' leading dimension: Ev rounded up to 32 floats (the
 * column chunks of the integer P.V, kernels/decode_q8_dot.h). */
static inline int64_t fa_q8_ldo(int64_t Ev) { return (Ev + 31) / 32 * 32; }

/* Floats of one thread's scratch: FA_Q8_ROWS x FA_Q8_KC scores, the
 * FA_Q8_ROWS output accumulators (Ev rounded up to 32), and slack. */
static inline int64_t fa_q8_scratch_floats(int64_t Ev)
{
    return FA_Q8_ROWS * FA_Q8_KC + FA_Q8_ROWS * fa_q8_ldo(Ev) + 64;
}

#endif
