/* common.h -- helpers shared by the drivers (attention.c, softmax.c). */
#ifndef FASTATTN_COMMON_H
#define FASTATTN_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "fastattn.h"

/* Checked allocation; every driver allocates through these (and only
 * outside its parallel regions), so the test hook fa_debug_fail_alloc_after
 * can make any of them fail. */
void *fa_malloc(size_t bytes);
void *fa_calloc(size_t n, size_t size);
void fa_free(void *p);

/* Element offsets of one batch index in every operand. */
typedef struct fa_offsets {
    int64_t q, k, v, o, bm, am, pad;
} fa_offsets;

/* Threads for a call asking for `requested` (<= 0: the OpenMP default); 1 in
 * a child forked after the parent used OpenMP (libgomp's pool does not
 * survive fork(); such a child runs serially and never enters OpenMP). */
int fa_resolve_threads(int requested);

void fa_batch_offsets(const fa_attention_args *a, int64_t b, fa_offsets *off);

#endif
