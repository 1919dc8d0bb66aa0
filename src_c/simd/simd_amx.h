/* simd_amx.h -- the amx mapping: for float32 and float64 exactly the
 * AVX-512F mapping (simd_avx512.h: same kernels, same results, never a
 * lower precision); FA_SIMD_BF16 and FA_SIMD_AMX tell kernels/kernels_isa.c
 * to add the 16-bit matrix kernels (kernels/flash16_*.h) over the AMX tiles
 * of simd/bf16_tiles.h (TDPBF16PS; TDPFP16PS where the CPU has AMX-FP16). */
#include "simd/simd_avx512.h"
#ifndef FA_SFX
#define FA_SIMD_BF16 1
/* the int8 KV cache's integer dot products (AVX512-VNNI) */
#define FA_SIMD_Q8_DOT "simd/q8_dot_avx512.h"
#define FA_SIMD_AMX 1
#endif
