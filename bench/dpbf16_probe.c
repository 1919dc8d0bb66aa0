/* dpbf16_probe.c -- what one core's VDPBF16PS can do: a register-only loop
 * (16 independent accumulators, no memory operand: the instruction's peak),
 * and the 16-bit backward's register tile (kernels/bw16.h: 8 rows x 2
 * vectors of 16 columns, the a operand broadcast a pair at a time, the b
 * operand two vector loads per pair row) over L1-resident operands at the
 * backward's product shapes, with C loaded (or zeroed) and stored per tile.
 *
 *     gcc -O3 -funroll-loops -mavx512f -mavx512bw -mavx512bf16 \
 *         -o /tmp/dpbf16_probe bench/dpbf16_probe.c && /tmp/dpbf16_probe
 *
 * GFLOP/s count 2 per multiply-add (64 per instruction).  The backward's
 * products are compared with these in bench/README.md. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ROWS 8 /* the register tile's rows (FA_DP16_ROWS) */
#define NV 2   /* and its vectors of 16 columns */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double peak(void)
{
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x10001);
    const long n = 10000000;
    double best = 1e9;
    for (int r = 0; r < 10; r++) {
        double t = now();
        for (long it = 0; it < n; it++) {
            for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
            __asm__ volatile("" : "+v"(x)); /* keeps the loop from being folded */
        }
        t = now() - t;
        best = t < best ? t : best;
    }
    float s = 0;
    for (int i = 0; i < 16; i++) s += _mm512_reduce_add_ps(acc[i]);
    if (s == 1234.5f) printf("!");
    return 16.0 * 64 * (double)n / best / 1e9;
}

static inline __attribute__((always_inline)) void tile(int zero, int64_t k, const uint16_t *a,
                                                       int64_t lda, const uint16_t *b,
                                                       int64_t ldb, float *c, int64_t ldc)
{
    __m512 acc[ROWS][NV];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16 * v);
    for (int64_t p = 0; p < k / 2; p++) {
        __m512i bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_si512(b + p * ldb + 32 * v);
        for (int r = 0; r < ROWS; r++) {
            const __m512i x = _mm512_set1_epi32(*(const int32_t *)(a + r * lda + 2 * p));
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)x, (__m512bh)bv[v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

static __attribute__((noinline)) void gemm(int zero, int64_t m, int64_t n, int64_t k,
                                           const uint16_t *a, const uint16_t *b, float *c,
                                           int64_t ldc)
{
    for (int64_t i0 = 0; i0 < m; i0 += ROWS)
        for (int64_t j0 = 0; j0 < n; j0 += 16 * NV) {
            if (zero) tile(1, k, a + i0 * k, k, b + 2 * j0, 2 * n, c + i0 * ldc + j0, ldc);
            else tile(0, k, a + i0 * k, k, b + 2 * j0, 2 * n, c + i0 * ldc + j0, ldc);
        }
}

static uint16_t A[128 * 128] __attribute__((aligned(64)));
static uint16_t B[64 * 256] __attribute__((aligned(64)));
static float C[128 * 1024] __attribute__((aligned(64)));

int main(void)
{
    for (int i = 0; i < 128 * 128; i++) A[i] = 0x3f80;
    for (int i = 0; i < 64 * 256; i++) B[i] = 0x3c00;
    printf("VDPBF16PS, 16 accumulators in registers: %.0f GFLOP/s\n", peak());
    /* m, n, k, zero, ldc: S = Q.K^T (from 0), dQ += dS.K, dV^T += dO^T.P
     * (accumulators at a 1024-key stride, as the fused pass's dK^T, dV^T) */
    const int64_t shapes[][5] = {{128, 128, 128, 1, 128}, {128, 128, 128, 0, 128},
                                 {128, 128, 128, 0, 1024}};
    for (int s = 0; s < 3; s++) {
        const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ldc = shapes[s][4];
        const int zero = (int)shapes[s][3];
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t = now();
            for (int it = 0; it < 200; it++) gemm(zero, m, n, k, A, B, C, ldc);
            t = now() - t;
            best = t < best ? t : best;
        }
        printf("tile %dx%d, m %ld n %ld k %ld, C %s, ldc %ld: %.0f GFLOP/s\n", ROWS, 16 * NV,
               (long)m, (long)n, (long)k, zero ? "zeroed" : "loaded", (long)ldc,
               2.0 * (double)(m * n * k) * 200 / best / 1e9);
    }
    return 0;
}
