/* simd_avx512_bf16.h -- the avx512_bf16 mapping: for float32 and float64
 * exactly the AVX-512F mapping (simd_avx512.h: same kernels, same results);
 * FA_SIMD_BF16 tells kernels/kernels_isa.c to add the bfloat16 flash driver
 * (driver/amx_flash.h) over VDPBF16PS (FA_SIMD_AMX undefined: its steps
 * accumulate on zmm registers, simd/bf16_tiles.h). */
#include "simd/simd_avx512.h"
#ifndef FA_SFX
#define FA_SIMD_BF16 1
#endif
