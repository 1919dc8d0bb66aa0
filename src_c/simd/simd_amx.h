/* simd_amx.h -- the amx mapping: for float32 and float64 exactly the
 * AVX-512F mapping (simd_avx512.h: same kernels, same results, never a
 * lower precision); FA_SIMD_BF16 and FA_SIMD_AMX tell kernels/kernels_isa.c
 * to add the bfloat16 flash driver (driver/amx_flash_tmpl.h) over the AMX
 * tiles (TDPBF16PS). */
#include "simd/simd_avx512.h"
#ifndef FA_SFX
#define FA_SIMD_BF16 1
#define FA_SIMD_AMX 1
#endif
