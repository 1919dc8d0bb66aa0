/* parallel.c -- OpenMP behind one #ifdef (see parallel.h), the thread count
 * of a call, and the fork handler. */
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define FA_HAVE_ATFORK 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fastattn.h"
#include "runtime/parallel.h"

static volatile int g_forked_child = 0;

#ifdef FA_HAVE_ATFORK
static void fa_atfork_child(void) { g_forked_child = 1; }
#endif

void fa_init_threads(void)
{
#ifdef FA_HAVE_ATFORK
    static int done = 0;
    if (!done) {
        pthread_atfork(NULL, NULL, fa_atfork_child);
        done = 1;
    }
#endif
}

static void fa_phases_serial(int np, const fa_phase *ph)
{
    for (int p = 0; p < np; p++)
        for (int64_t i = 0; i < ph[p].n; i++) ph[p].fn(ph[p].ctx, i, 0);
}

#ifdef _OPENMP
int fa_openmp_enabled(void) { return 1; }
int fa_max_threads(void) { return omp_get_max_threads(); }
void fa_set_default_threads(int n)
{
    if (n > 0) omp_set_num_threads(n);
}

void fa_parallel_for(int nt, int sched, int64_t n, fa_item_fn fn, void *ctx)
{
    if (nt <= 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
    } else if (sched == FA_SCHED_DYNAMIC) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t i = 0; i < n; i++) fn(ctx, i, omp_get_thread_num());
    } else {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i++) fn(ctx, i, omp_get_thread_num());
    }
}

/* Every thread meets the same worksharing loops in the same order (np and
 * the schedules are shared), each ending in its implicit barrier. */
void fa_parallel_phases(int nt, int np, const fa_phase *ph)
{
    if (nt <= 1) {
        fa_phases_serial(np, ph);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        for (int p = 0; p < np; p++) {
            const fa_phase *f = ph + p;
            if (f->sched == FA_SCHED_DYNAMIC) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t i = 0; i < f->n; i++) f->fn(f->ctx, i, tid);
            } else {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < f->n; i++) f->fn(f->ctx, i, tid);
            }
        }
    }
}

int fa_parallel_team(int nt, void (*fn)(void *ctx), void *ctx)
{
    int team = 0;
#pragma omp parallel num_threads(nt) reduction(+ : team)
    {
        fn(ctx);
        team += 1;
    }
    return team;
}
#else /* a serial build */
int fa_openmp_enabled(void) { return 0; }
int fa_max_threads(void) { return 1; }
void fa_set_default_threads(int n) { (void)n; }

void fa_parallel_for(int nt, int sched, int64_t n, fa_item_fn fn, void *ctx)
{
    (void)nt;
    (void)sched;
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
}

void fa_parallel_phases(int nt, int np, const fa_phase *ph)
{
    (void)nt;
    fa_phases_serial(np, ph);
}

int fa_parallel_team(int nt, void (*fn)(void *ctx), void *ctx)
{
    (void)nt;
    fn(ctx);
    return 1;
}
#endif

int fa_resolve_threads(int requested)
{
    if (g_forked_child) return 1;
    return requested > 0 ? requested : fa_max_threads();
}

const char *fa_openmp_runtime(void)
{
#if !defined(_OPENMP)
    return "none (serial build)";
#elif defined(__clang__)
    return "LLVM OpenMP (libomp)";
#elif defined(_MSC_VER)
    return "MSVC OpenMP (vcomp)";
#elif defined(__GNUC__)
    return "GNU OpenMP (libgomp)";
#else
    return "unknown";
#endif
}
