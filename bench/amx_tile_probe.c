/* amx_tile_probe.c -- what one core's AMX tiles do: TDPBF16PS on four
 * independent accumulator tiles with no tile load in the loop (the
 * instruction's peak), and the 16-bit backward's tile loop (kernels/bw16.h,
 * the amx gemm: 2 x 2 C tiles of 16 x 16 float32, two A and two B tiles
 * loaded per 32-element k step, C zeroed or loaded, then stored, per block)
 * over L1/L2-resident operands at the backward's product shape (128 x 128 x
 * 128 per query block and key block) and at longer k.
 *
 *     gcc -O2 -mamx-tile -mamx-bf16 -o /tmp/amx_tile_probe bench/amx_tile_probe.c \
 *         && /tmp/amx_tile_probe
 *
 * Linux only (it asks for the tile state with arch_prctl).  GFLOP/s count 2
 * per multiply-add (16 x 16 x 32 per instruction).  Figures in
 * bench/README.md ("AMX on a 2-core Intel Xeon VM"). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "amx_probe_tiles.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double peak(long reps)
{
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    const double t = now();
    for (long r = 0; r < reps; r++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    return 4.0 * reps * 2 * 16 * 16 * 32 / (now() - t) / 1e9;
}

/* c (m x n) = or += a (m x k rows) . b (k/2 pair rows of 2n): bw16.h's loop */
static void gemm(int zero, long m, long n, long k, const uint16_t *a, const uint16_t *b, float *c)
{
    const long ab = k * 2, bb = 4 * n, cb = n * 4;
    for (long i0 = 0; i0 < m; i0 += 32)
        for (long j0 = 0; j0 < n; j0 += 32) {
            float *c0 = c + i0 * n + j0, *c1 = c0 + 16 * n;
            if (zero) {
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            } else {
                _tile_loadd(0, c0, cb); _tile_loadd(1, c0 + 16, cb);
                _tile_loadd(2, c1, cb); _tile_loadd(3, c1 + 16, cb);
            }
            for (long kk = 0; kk < k; kk += 32) {
                const uint16_t *a0 = a + i0 * k + kk, *b0 = b + kk / 2 * 2 * n + 2 * j0;
                _tile_loadd(4, a0, ab);
                _tile_loadd(6, b0, bb);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, b0 + 32, bb);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, a0 + 16 * k, ab);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c0, cb); _tile_stored(1, c0 + 16, cb);
            _tile_stored(2, c1, cb); _tile_stored(3, c1 + 16, cb);
        }
}

static void run(int zero, long m, long n, long k, long reps)
{
    uint16_t *a = aligned_alloc(64, (size_t)(m * k * 2)), *b = aligned_alloc(64, (size_t)(k * n * 2));
    float *c = aligned_alloc(64, (size_t)(m * n * 4));
    for (long i = 0; i < m * k; i++) a[i] = 0x3f80; /* 1.0 */
    for (long i = 0; i < k * n; i++) b[i] = 0x3c00; /* 2^-7: sums stay finite */
    memset(c, 0, (size_t)(m * n * 4));
    const double t = now();
    for (long r = 0; r < reps; r++) gemm(zero, m, n, k, a, b, c);
    const double s = now() - t;
    printf("2x2 tile loop, m %ld n %ld k %ld, C %s: %.2f us a call, %.0f GFLOP/s\n", m, n, k,
           zero ? "zeroed" : "loaded", 1e6 * s / reps, 2.0 * m * n * k * reps / s / 1e9);
    free(a), free(b), free(c);
}

int main(void)
{
    if (tiles_permitted() != 0) {
        fprintf(stderr, "no AMX tile state granted\n");
        return 1;
    }
    tiles_on();
    printf("four independent TDPBF16PS chains: %.0f GFLOP/s\n", peak(20000000));
    run(1, 128, 128, 128, 20000);
    run(0, 128, 128, 128, 20000);
    run(0, 128, 128, 512, 5000);
    run(0, 256, 256, 1024, 500);
    _tile_release();
    return 0;
}
