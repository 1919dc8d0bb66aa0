/* alloc.h -- checked allocation.  Every driver allocates through these (and
 * only outside its parallel regions), so the test hook
 * fa_debug_fail_alloc_after (fastattn.h) can make any of them fail; freed
 * scratch of a call's size is kept for the next call (alloc.c). */
#ifndef FASTATTN_ALLOC_H
#define FASTATTN_ALLOC_H

#include <stddef.h>

void *fa_malloc(size_t bytes);
void *fa_calloc(size_t n, size_t size);
void fa_free(void *p); /* a block of FA_CACHE_MIN .. FA_CACHE_MAX bytes may be
                       * kept for the next fa_malloc (alloc.c) */

#endif
