/* simd_neon_bf16.h -- the neon_bf16 mapping (Armv8.6 Advanced SIMD with
 * FEAT_BF16): for float32, float64 and float16 exactly the neon mapping
 * (simd_neon.h: same kernels, same results); FA_SIMD_BF16 tells
 * kernels/kernels_isa.c to add the 16-bit matrix kernels
 * (kernels/flash16_*.h) for bfloat16, and FA_SIMD_NEON_BF16 that their
 * vocabulary is simd/flash16_neon.h (BFMMLA steps on registers).  A
 * compiler without the bfloat16 intrinsics (no
 * __ARM_FEATURE_BF16_VECTOR_ARITHMETIC for the flags of neon_bf16.flags)
 * builds the tier without them: bfloat16 then runs the neon kernels. */
#include "simd/simd_neon.h"
#if !defined(FA_SFX) && (defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC) || defined(FA_NEON_SIMDE))
#define FA_SIMD_BF16 1
#define FA_SIMD_NEON_BF16 1
#endif
