/* alloc.c -- checked allocation with the test hook (see alloc.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fastattn.h"
#include "runtime/alloc.h"

static int64_t g_alloc_budget = -1; /* test hook: allocations left before failing */

void fa_debug_fail_alloc_after(int64_t n_ok) { g_alloc_budget = n_ok; }

void *fa_malloc(size_t bytes)
{
    if (g_alloc_budget == 0) return NULL;
    if (g_alloc_budget > 0) g_alloc_budget--;
    return malloc(bytes ? bytes : 1);
}

void *fa_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = fa_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void fa_free(void *p) { free(p); }
