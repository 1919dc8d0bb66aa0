/* parallel.h -- the one place OpenMP is used (runtime/parallel.c, behind one
 * #ifdef _OPENMP: a compiler without OpenMP builds a serial extension, and
 * setup.py warns when it does).  The drivers never write an OpenMP pragma. */
#ifndef FASTATTN_PARALLEL_H
#define FASTATTN_PARALLEL_H

#include <stdint.h>

/* Threads for a call asking for `requested` (<= 0: the OpenMP default); 1 in
 * a child forked after the parent used OpenMP (libgomp's pool does not
 * survive fork(); such a child runs serially and never enters OpenMP). */
int fa_resolve_threads(int requested);

/* fn(ctx, i, tid) for i = 0 .. n-1 on a team of nt threads (tid: the
 * thread's index, < nt), scheduled statically or dynamically one item at a
 * time; when nt <= 1, serially on the calling thread with tid 0, without
 * entering OpenMP. */
enum { FA_SCHED_STATIC = 0, FA_SCHED_DYNAMIC = 1 };
typedef void (*fa_item_fn)(void *ctx, int64_t i, int tid);
void fa_parallel_for(int nt, int sched, int64_t n, fa_item_fn fn, void *ctx);

/* Phases of one parallel region (fa_parallel_phases): fn(ctx, i, tid) for
 * i = 0 .. n-1, scheduled as sched says. */
typedef struct fa_phase {
    int sched;
    int64_t n;
    fa_item_fn fn;
    void *ctx;
} fa_phase;

/* The np phases in order in ONE parallel region of nt threads, every
 * thread waiting at a barrier between two phases (phase p + 1 reads what
 * phase p wrote): one fork and join per call, however many phases.  When
 * nt <= 1, serially on the calling thread with tid 0, without entering
 * OpenMP. */
void fa_parallel_phases(int nt, int np, const fa_phase *ph);

/* fn(ctx) once on each thread of a team of nt threads; returns the team
 * size the runtime gave (1 in a serial build). */
int fa_parallel_team(int nt, void (*fn)(void *ctx), void *ctx);

#endif
