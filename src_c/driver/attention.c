/* attention.c -- the attention drivers: work split over OpenMP threads
 * (batch x query chunk, keys split for decoding), per-thread scratch, the
 * streaming loop and the loop that materialises the weights.  The
 * arithmetic goes through the micro-kernel table of the ISA in use. */
#include <float.h>
#include <math.h>
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define FA_HAVE_ATFORK 1
#endif
#include <stdlib.h>
#include <string.h>

#include "blocking.h"
#include "common.h"
#include "fastattn.h"
#include "kernels.h"
#include "omp_shim.h"

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

void fa_batch_offsets(const fa_attention_args *a, int64_t b, fa_offsets *off)
{
    memset(off, 0, sizeof(*off));
    for (int d = a->nbatch_dims - 1; d >= 0; d--) {
        int64_t n = a->batch_shape[d], i = b % n;
        b /= n;
        off->q += i * a->q.bstride[d];
        off->k += i * a->k.bstride[d];
        off->v += i * a->v.bstride[d];
        off->o += i * a->out.bstride[d];
        off->bm += i * a->bool_mask.bstride[d];
        off->am += i * a->add_mask.bstride[d];
        off->pad += i * a->pad.bstride[d];
    }
}

#define FA_LOG2E 1.44269504088896340735992468100189214

#define FA_T float
#define FA_T_MAX FLT_MAX
#define FA_UINT uint32_t
#define FA_EXP_MASK 0x7f800000u
#define FA_SFX f32
#define KT fa_kernels_f32
#define KCUR fa_kernels_f32_current
#include "attention_tmpl.h"
#undef FA_T
#undef FA_T_MAX
#undef FA_UINT
#undef FA_EXP_MASK
#undef FA_SFX
#undef KT
#undef KCUR

#define FA_T double
#define FA_T_MAX DBL_MAX
#define FA_UINT uint64_t
#define FA_EXP_MASK 0x7ff0000000000000ull
#define FA_SFX f64
#define KT fa_kernels_f64
#define KCUR fa_kernels_f64_current
#include "attention_tmpl.h"
#undef FA_T
#undef FA_T_MAX
#undef FA_UINT
#undef FA_EXP_MASK
#undef FA_SFX
#undef KT
#undef KCUR

int fa_attention(const fa_attention_args *a)
{
    if (a->nbatch_dims < 0 || a->nbatch_dims > FA_MAX_BATCH_DIMS || a->L < 0 || a->S < 0 ||
        a->E < 0 || a->Ev < 0)
        return FA_EINVAL;
    if (a->dtype == FA_FLOAT32) return attention_f32(a);
    if (a->dtype == FA_FLOAT64) return attention_f64(a);
    return FA_EINVAL;
}

int fa_fma_probe(int dtype, int64_t n, int num_threads, double *flops)
{
    if (n < 0 || (dtype != FA_FLOAT32 && dtype != FA_FLOAT64)) return FA_EINVAL;
    const int nt = fa_resolve_threads(num_threads);
    const int64_t per = dtype == FA_FLOAT32
                            ? 2 * fa_kernels_f32_current()->vw * FA_PROBE_CHAINS
                            : 2 * fa_kernels_f64_current()->vw * FA_PROBE_CHAINS;
    int64_t team = 0; /* the threads the runtime gave */
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : team)
#endif
    {
        if (dtype == FA_FLOAT32)
            (void)fa_kernels_f32_current()->fma_probe(n);
        else
            (void)fa_kernels_f64_current()->fma_probe(n);
        team += 1;
    }
    (void)nt; /* serial build */
    *flops = (double)team * (double)n * (double)per;
    return FA_OK;
}

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

int fa_resolve_threads(int requested)
{
    if (g_forked_child) return 1;
    return requested > 0 ? requested : FA_OMP_MAX_THREADS();
}

int fa_openmp_enabled(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

void fa_set_default_threads(int n)
{
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

int fa_max_threads(void) { return FA_OMP_MAX_THREADS(); }

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
