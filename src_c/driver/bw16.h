/* bw16.h -- the 16-bit backward on the matrix instructions (bw16.c), for
 * backward.c: whether it runs a call, and the pass itself. */
#ifndef FASTATTN_BW16_H
#define FASTATTN_BW16_H

#include "fastattn.h"

/* 1 where the ISA in use has the 16-bit backward's kernels for the call's
 * storage: bfloat16 on amx and avx512_bf16, float16 on amx with AMX-FP16
 * (kernels.h: fa_bw16_kernels); 0 otherwise (the float kernels widen). */
int fa_backward16_runs(const fa_attention_args *a);
/* The backward of a call fa_backward16_runs accepts, its arguments checked
 * by fa_attention_backward: FA_OK, FA_ENOMEM or FA_ELSE (nothing written). */
int fa_backward16(const fa_backward_args *g);

#endif
