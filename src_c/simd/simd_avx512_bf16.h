/* simd_avx512_bf16.h -- the avx512_bf16 mapping: for float32 and float64
 * exactly the AVX-512F mapping (simd_avx512.h: same kernels, same results);
 * FA_SIMD_BF16 tells kernels/kernels_isa.c to add the 16-bit matrix kernels
 * (kernels/flash16_*.h) over VDPBF16PS (FA_SIMD_AMX undefined: their steps
 * accumulate on zmm registers, simd/bf16_tiles.h). */
#include "simd/simd_avx512.h"
#ifndef FA_SFX
#define FA_SIMD_BF16 1
/* the int8 KV cache's integer dot products (AVX512-VNNI) */
#define FA_SIMD_Q8_DOT "simd/q8_dot_avx512.h"
/* The register tile of those steps: FA_DP16_ROWS rows of C x 32 query lanes,
 * 16 accumulators + 2 B rows + a broadcast, 19 of the 32 zmm registers (a
 * divisor of 16, the rows of a key tile; half as many rows would load each
 * B row twice as often per product). */
#define FA_DP16_ROWS 8
#endif
