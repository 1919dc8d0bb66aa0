/* amx_resume_probe.c -- what a burst of AMX tile products costs after the
 * tiles have sat idle: a fixed burst (BURST TDPBF16PS on four independent
 * accumulator tiles, operands already in tile registers: no memory at all)
 * timed alone, back to back, and after a gap of G microseconds spent
 * spinning on the time-stamp counter (scalar work) or on AVX-512 FMAs (what
 * a kernel's vector phase between two tile phases does).  A decoding step
 * or a backward pair that alternates tile products with vector work pays
 * the difference once per switch.
 *
 *     gcc -O2 -mamx-tile -mamx-bf16 -mavx512f -o /tmp/amx_resume_probe \
 *         bench/amx_resume_probe.c && /tmp/amx_resume_probe [products per burst]
 *
 * Linux only (it asks for the tile state with arch_prctl).  Times in
 * time-stamp counter cycles (rdtsc); the median of ROUNDS bursts per gap.
 * Figures in bench/README.md ("twelfth session"). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <x86intrin.h>

#define ROUNDS 301
static int BURST = 64; /* products per burst: argv[1] */

#include "amx_probe_tiles.h"

static int cmp(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* BURST products, four independent chains (no product waits on another's
 * result beyond its own chain) */
static float sink[256]; /* the stored result, outside the timed burst's work */

static uint64_t burst(void)
{
    const uint64_t t0 = __rdtsc();
    for (int i = 0; i < BURST; i += 4) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, sink, 64); /* the burst's end: its last chain's result */
    return __rdtsc() - t0;
}

static __m512 fma_acc[8];

/* a gap of about `cycles` TSC cycles: scalar spinning, or AVX-512 FMAs */
static void gap(uint64_t cycles, int vector)
{
    const uint64_t t0 = __rdtsc();
    if (vector) {
        const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
        while (__rdtsc() - t0 < cycles)
            for (int r = 0; r < 16; r++)
                for (int i = 0; i < 8; i++) fma_acc[i] = _mm512_fmadd_ps(fma_acc[i], b, c);
    } else {
        while (__rdtsc() - t0 < cycles) _mm_pause();
    }
}

int main(int argc, char **argv)
{
    if (argc > 1) BURST = atoi(argv[1]) / 4 * 4;
    if (BURST < 4) BURST = 4;
    if (tiles_permitted()) {
        fprintf(stderr, "no AMX tile state from the kernel\n");
        return 1;
    }
    for (int i = 0; i < 8; i++) fma_acc[i] = _mm512_set1_ps(1.0f);
    tiles_on();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    /* the TSC rate, from a 20 ms sleep */
    const uint64_t c0 = __rdtsc();
    usleep(20000);
    const double ghz = (double)(__rdtsc() - c0) / 2e7; /* cycles per ns */
    const double gaps_us[] = {0, 0.25, 0.5, 1, 2, 4, 8, 16, 64};
    printf("TSC %.2f GHz; a burst of %d TDPBF16PS, median of %d (TSC cycles)\n", ghz, BURST,
           ROUNDS);
    printf("%10s %14s %14s\n", "gap (us)", "after spinning", "after FMAs");
    for (size_t g = 0; g < sizeof gaps_us / sizeof gaps_us[0]; g++) {
        uint64_t t[2][ROUNDS];
        for (int vector = 0; vector < 2; vector++) {
            for (int r = 0; r < 8; r++) burst(); /* warm */
            for (int r = 0; r < ROUNDS; r++) {
                gap((uint64_t)(gaps_us[g] * ghz * 1e3), vector);
                t[vector][r] = burst();
            }
            qsort(t[vector], ROUNDS, sizeof(uint64_t), cmp);
        }
        printf("%10.2f %14llu %14llu\n", gaps_us[g], (unsigned long long)t[0][ROUNDS / 2],
               (unsigned long long)t[1][ROUNDS / 2]);
    }
    float f[16];
    _mm512_storeu_ps(f, fma_acc[3]);
    _tile_release();
    return f[0] == 12345.0f; /* keeps the FMAs */
}
