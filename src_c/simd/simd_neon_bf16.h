/* simd_neon_bf16.h -- the neon_bf16 mapping (Armv8.6 Advanced SIMD with
 * FEAT_BF16): for float32, float64 and float16 exactly the neon mapping
 * (simd_neon.h: same kernels, same results); FA_SIMD_BF16 tells
 * kernels/kernels_isa.c to add the 16-bit matrix kernels
 * (kernels/flash16_*.h) for bfloat16, and FA_SIMD_NEON_BF16 that their
 * vocabulary is simd/flash16_neon.h (BFDOT steps on registers, as
 * avx512_bf16's VDPBF16PS steps). */
#include "simd/simd_neon.h"
#ifndef FA_SFX
#define FA_SIMD_BF16 1
#define FA_SIMD_NEON_BF16 1
/* The register tile of those steps: FA_DP16_ROWS rows of C x 32 query
 * lanes, 16 accumulators + 2 B rows (8 registers) + 2 broadcasts, 26 of the
 * 32 registers (a divisor of 16, the rows of a key tile). */
#define FA_DP16_ROWS 2
#endif
