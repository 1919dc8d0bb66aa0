/* alloc.c -- checked allocation with the test hook, and a small cache of
 * freed scratch blocks (see alloc.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fastattn.h"
#include "runtime/alloc.h"

static int64_t g_alloc_budget = -1; /* test hook: allocations left before failing */

void fa_debug_fail_alloc_after(int64_t n_ok) { g_alloc_budget = n_ok; }

/* Each block starts with a header holding its capacity (16 bytes keep
 * malloc's alignment for what follows). */
#define FA_ALLOC_HEADER 16

/* The cache: a call's scratch (a few hundred KiB for attention over
 * hundreds of rows) freed to malloc goes back to the system (glibc trims
 * the heap's top, and maps large blocks afresh), so the next call of the
 * same shape touches new pages, a page fault per 4 KiB: a float32 backward
 * of 8 heads x 64 rows spent two thirds of its 320 us there.  Blocks of
 * FA_CACHE_MIN .. FA_CACHE_MAX bytes are kept instead, at most
 * FA_CACHE_SLOTS of them and FA_CACHE_TOTAL bytes in all (the memory a
 * process keeps between calls); larger ones cost a fault per page but also
 * far more arithmetic per page.  A request takes the smallest cached block
 * that holds it, if that block is at most twice its size. */
#define FA_CACHE_MIN ((size_t)64 << 10)
#define FA_CACHE_MAX ((size_t)8 << 20)
#define FA_CACHE_TOTAL ((size_t)32 << 20)
#define FA_CACHE_SLOTS 16

static unsigned char *g_slot[FA_CACHE_SLOTS]; /* cached blocks (their headers), newest
                                              * first, g_nslot of them */
static int g_nslot;
static size_t g_cached;                      /* their capacities' sum */

/* Calls may run at once in several threads (each allocating outside its
 * parallel regions): the cache is used under a try-lock and bypassed when
 * another thread holds it, so nothing ever waits (nor deadlocks in a child
 * forked while the lock was held). */
#if defined(__GNUC__) || defined(__clang__)
static char g_lock;
static int fa_lock_try(void) { return !__atomic_test_and_set(&g_lock, __ATOMIC_ACQUIRE); }
static void fa_lock_give(void) { __atomic_clear(&g_lock, __ATOMIC_RELEASE); }
#elif defined(_MSC_VER)
#include <intrin.h>
static volatile long g_lock;
static int fa_lock_try(void) { return _InterlockedExchange(&g_lock, 1) == 0; }
static void fa_lock_give(void) { _InterlockedExchange(&g_lock, 0); }
#else
static int fa_lock_try(void) { return 0; } /* no atomics known: no cache */
static void fa_lock_give(void) {}
#endif

static size_t fa_cap(const unsigned char *h)
{
    size_t cap;
    memcpy(&cap, h, sizeof cap);
    return cap;
}

static int fa_cacheable(size_t cap) { return cap >= FA_CACHE_MIN && cap <= FA_CACHE_MAX; }

/* Slot i taken out of the cache (the newer ones keep their order). */
static unsigned char *fa_cache_remove(int i)
{
    unsigned char *h = g_slot[i];
    memmove(g_slot + i, g_slot + i + 1, (size_t)(g_nslot - i - 1) * sizeof *g_slot);
    g_nslot--;
    g_cached -= fa_cap(h);
    return h;
}

/* The cached block that fits `bytes` best (taken out of the cache), or NULL. */
static unsigned char *fa_cache_take(size_t bytes)
{
    if (!fa_cacheable(bytes) || !fa_lock_try()) return NULL;
    int best = -1;
    for (int i = 0; i < g_nslot; i++) {
        const size_t cap = fa_cap(g_slot[i]);
        if (cap >= bytes && cap / 2 <= bytes && (best < 0 || cap < fa_cap(g_slot[best])))
            best = i;
    }
    unsigned char *h = best >= 0 ? fa_cache_remove(best) : NULL;
    fa_lock_give();
    return h;
}

/* 1 if block h was kept in the cache, as its newest block; the oldest ones
 * make room (freed), so blocks of shapes no longer used do not stay. */
static int fa_cache_give(unsigned char *h)
{
    const size_t cap = fa_cap(h);
    if (!fa_cacheable(cap) || !fa_lock_try()) return 0;
    unsigned char *old[FA_CACHE_SLOTS];
    int nold = 0;
    while (g_nslot > 0 && (g_nslot == FA_CACHE_SLOTS || g_cached + cap > FA_CACHE_TOTAL))
        old[nold++] = fa_cache_remove(g_nslot - 1);
    memmove(g_slot + 1, g_slot, (size_t)g_nslot * sizeof *g_slot);
    g_slot[0] = h;
    g_nslot++;
    g_cached += cap;
    fa_lock_give();
    for (int i = 0; i < nold; i++) free(old[i]);
    return 1;
}

void *fa_malloc(size_t bytes)
{
    if (g_alloc_budget == 0) return NULL;
    if (g_alloc_budget > 0) g_alloc_budget--;
    if (bytes > SIZE_MAX - FA_ALLOC_HEADER) return NULL;
    unsigned char *h = fa_cache_take(bytes);
    if (!h) {
        h = (unsigned char *)malloc(bytes + FA_ALLOC_HEADER);
        if (!h) return NULL;
        memcpy(h, &bytes, sizeof bytes);
    }
    return h + FA_ALLOC_HEADER;
}

void *fa_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = fa_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void fa_free(void *p)
{
    if (!p) return;
    unsigned char *h = (unsigned char *)p - FA_ALLOC_HEADER;
    if (!fa_cache_give(h)) free(h);
}

void fa_release_cached(void)
{
    if (!fa_lock_try()) return;
    while (g_nslot > 0) free(fa_cache_remove(g_nslot - 1));
    fa_lock_give();
}

void fa_debug_poison_cached(int byte)
{
    if (!fa_lock_try()) return;
    for (int i = 0; i < g_nslot; i++)
        memset(g_slot[i] + FA_ALLOC_HEADER, byte, fa_cap(g_slot[i]));
    fa_lock_give();
}

int64_t fa_cached_bytes(void)
{
    return (int64_t)g_cached;
}
