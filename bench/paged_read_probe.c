/* paged_read_probe.c -- how fast one thread reads memory laid out as a paged
 * KV cache's blocks: chunks of C bytes (one block's rows of one head: 4 KiB
 * for bfloat16 at block size 16 and D = 128) in a shuffled order, against
 * the same 512 MiB read sequentially.  Each chunk is summed with AVX-512
 * loads into four accumulators; with a distance d > 0 the whole chunk d
 * places ahead is prefetched before a chunk is read ("burst"), or a line of
 * it with each line read ("spread": the requests the decoding kernels make,
 * one or two rows ahead of their loads, never a burst of a whole chunk).
 *
 *     gcc -O2 -mavx512f -o /tmp/paged_read_probe bench/paged_read_probe.c
 *     /tmp/paged_read_probe   # chunks of 2, 4, 8, 32 KiB; burst d = 0, 1, 2; spread d = 1, 2, 4, 8
 *
 * A block's end stops the hardware prefetchers, so this is the read speed
 * the layout allows a decoding step with no arithmetic at all (bench/README.md,
 * "The serving section on an AMX host"). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the c bytes at p summed; q not NULL: the chunk at q asked for a line per
 * line read ("spread") */
static __m512 sum_chunk(const char *p, const char *q, size_t c, __m512 a0)
{
    __m512 a1 = _mm512_setzero_ps(), a2 = a1, a3 = a1;
    for (size_t b = 0; b < c; b += 256) {
        if (q)
            for (size_t l = 0; l < 256; l += 64) _mm_prefetch(q + b + l, _MM_HINT_T0);
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + b));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + b + 64));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + b + 128));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + b + 192));
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

/* the best of 5 passes over the n chunks of c bytes at buf in order ord;
 * d > 0: the chunk d places ahead asked for, in a burst or spread */
static double pass_gbs(const char *buf, size_t n, size_t c, const size_t *ord, size_t d, int spread,
                       float *sink)
{
    double best = 1e30;
    __m512 acc = _mm512_setzero_ps();
    for (int r = 0; r < 5; r++) {
        const double t0 = now();
        for (size_t i = 0; i < n; i++) {
            const char *ahead = d && i + d < n ? buf + ord[i + d] * c : NULL;
            if (ahead && !spread)
                for (size_t b = 0; b < c; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
            acc = sum_chunk(buf + ord[i] * c, spread ? ahead : NULL, c, acc);
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    *sink += _mm512_reduce_add_ps(acc);
    return (double)(n * c) / best / 1e9;
}

int main(void)
{
    const size_t N = (size_t)512 << 20;
    const size_t sizes[] = {2048, 4096, 8192, 32768};
    float *buf = aligned_alloc((size_t)2 << 20, N), sink = 0;
    size_t *ord = malloc(N / sizes[0] * sizeof *ord);
    if (!buf || !ord) return 1;
    madvise(buf, N, MADV_HUGEPAGE);
    for (size_t i = 0; i < N / 4; i++) buf[i] = 1.0f;
    for (int s = 0; s < 4; s++) {
        const size_t c = sizes[s], n = N / c;
        for (size_t i = 0; i < n; i++) ord[i] = i;
        printf("chunk %5zu B: sequential %.1f GB/s", c, pass_gbs((char *)buf, n, c, ord, 0, 0, &sink));
        srand(1);
        for (size_t i = n - 1; i > 0; i--) {
            const size_t j = ((size_t)rand() * RAND_MAX + (size_t)rand()) % (i + 1), t = ord[i];
            ord[i] = ord[j], ord[j] = t;
        }
        for (size_t d = 0; d < 3; d++)
            printf(", shuffled burst d=%zu %.1f", d, pass_gbs((char *)buf, n, c, ord, d, 0, &sink));
        for (size_t d = 1; d <= 8; d *= 2)
            printf(", spread d=%zu %.1f", d, pass_gbs((char *)buf, n, c, ord, d, 1, &sink));
        printf("\n");
    }
    printf("(sum %g)\n", (double)sink);
    return 0;
}
