/* overlap_probe.c -- how much of one core's memory reading hides behind its
 * vector arithmetic: the question a decoding step's time turns on (a paged
 * bfloat16 step at block size 128 takes about its arithmetic's time with the
 * pool in the L2 plus its bytes at the read probe's rate; bench/README.md,
 * tenth session).
 *
 *     gcc -O2 -mavx512f -o /tmp/overlap_probe bench/overlap_probe.c
 *     /tmp/overlap_probe      # W = 8, 16, 32 FMAs per 64-byte line
 *
 * "compute": chunks of 32 KiB that stay in the L2 (16 of them, in turn),
 * each line loaded and fed to W FMAs over 8 accumulators.  Then the same
 * arithmetic while the core also asks for every line of 512 MiB read in
 * shuffled 32 KiB chunks (one line asked per line computed, never used):
 * by PREFETCHT0, T1 or T2, or by a load.  "stream alone": those 512 MiB
 * asked for with no arithmetic.  Perfect overlap would take the larger of
 * "compute" and "stream alone"; no overlap, their sum. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 32768

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static __m512 acc[8];

/* the W FMAs of each line of chunk p; pf not NULL: the same line of pf asked
 * for (hint 0-2: PREFETCHT0-T2, 3: a load) */
static void chunk(const char *p, const char *pf, int hint, int w)
{
    __m512 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    __m512 a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];
    const __m512 m = _mm512_set1_ps(0.999f);
    for (size_t b = 0; b < CHUNK; b += 64) {
        if (pf) {
            if (hint == 0) _mm_prefetch(pf + b, _MM_HINT_T0);
            else if (hint == 1) _mm_prefetch(pf + b, _MM_HINT_T1);
            else if (hint == 2) _mm_prefetch(pf + b, _MM_HINT_T2);
            else (void)*(volatile const char *)(pf + b);
        }
        const __m512 x = _mm512_load_ps(p + b);
        for (int i = 0; i < w; i += 8) {
            a0 = _mm512_fmadd_ps(a0, m, x), a1 = _mm512_fmadd_ps(a1, m, x);
            a2 = _mm512_fmadd_ps(a2, m, x), a3 = _mm512_fmadd_ps(a3, m, x);
            a4 = _mm512_fmadd_ps(a4, m, x), a5 = _mm512_fmadd_ps(a5, m, x);
            a6 = _mm512_fmadd_ps(a6, m, x), a7 = _mm512_fmadd_ps(a7, m, x);
        }
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    acc[4] = a4, acc[5] = a5, acc[6] = a6, acc[7] = a7;
}

/* the best of 3 passes: n chunks of arithmetic over hot, each with the
 * chunk ord[i] of buf asked for (buf NULL: none); w = 0: the asking alone */
static double pass_ms(const char *hot, const char *buf, const size_t *ord, size_t n, int hint,
                      int w)
{
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        const double t0 = now();
        for (size_t i = 0; i < n; i++)
            chunk(hot + (i % 16) * CHUNK, buf ? buf + ord[i] * CHUNK : NULL, hint, w);
        const double t = now() - t0;
        best = t < best ? t : best;
    }
    return best * 1e3;
}

int main(void)
{
    const size_t n = (size_t)1 << 14; /* 512 MiB */
    char *buf = aligned_alloc(1 << 21, n * CHUNK), *hot = aligned_alloc(64, 16 * CHUNK);
    size_t *ord = malloc(n * sizeof *ord);
    if (!buf || !hot || !ord) return 1;
    memset(buf, 1, n * CHUNK);
    memset(hot, 1, 16 * CHUNK);
    for (size_t i = 0; i < n; i++) ord[i] = i;
    srand(1);
    for (size_t i = n - 1; i > 0; i--) {
        const size_t j = (size_t)rand() % (i + 1), t = ord[i];
        ord[i] = ord[j], ord[j] = t;
    }
    const char *names[] = {"T0", "T1", "T2", "load"};
    printf("stream alone (T1): %.1f ms\n", pass_ms(hot, buf, ord, n, 1, 0));
    const int ws[] = {8, 16, 32};
    for (int k = 0; k < 3; k++) {
        printf("W=%2d compute %.1f ms; with the stream:", ws[k],
               pass_ms(hot, NULL, ord, n, 0, ws[k]));
        for (int h = 0; h < 4; h++)
            printf(" %s %.1f", names[h], pass_ms(hot, buf, ord, n, h, ws[k]));
        printf(" ms\n");
    }
    float s = 0;
    for (int i = 0; i < 8; i++) s += acc[i][0];
    return s == 12345.0f; /* keeps the arithmetic */
}
