/* kernels_isa.c -- the micro-kernel tables of one ISA (see kernels.h for the
 * contract).  setup.py compiles this file once per line of
 * runtime/isa_list.h, with -DFA_ISA_NAME=<name> and the flags of
 * simd/<name>.flags; simd/simd.h then maps the vector operations to that
 * ISA.  It instantiates kernels_tmpl.h for float and double and defines
 *   fa_kernels_f32_<name>, fa_kernels_f64_<name>
 * (fa_kernels_f32_generic, fa_kernels_f32_avx2, fa_kernels_f64_avx512, ...). */
#include <string.h>

#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/half.h"
#include "simd/simd.h"

#define FA_SFX f32
#include "kernels/kernels_tmpl.h" /* qk_f32_<name>, ..., fa_kernels_f32_<name> */
#undef FA_SFX
#define FA_SFX f64
#include "kernels/kernels_tmpl.h" /* qk_f64_<name>, ..., fa_kernels_f64_<name> */
#undef FA_SFX

/* The bfloat16 flash driver (kernels.h): fa_bf16_flash_ptr_<name>, NULL
 * unless the mapping has bfloat16 dot products (FA_SIMD_BF16). */
#ifdef FA_SIMD_BF16
#include "fastattn.h"
#include "simd/bf16_tiles.h"
#include "driver/amx_flash.h" /* fa_bf16_flash_amx, fa_bf16_flash_avx512_bf16 */
const fa_bf16_flash_fn FA_PASTE(fa_bf16_flash_ptr_, FA_ISA_NAME) = FA_BF_FN;
#else
const fa_bf16_flash_fn FA_PASTE(fa_bf16_flash_ptr_, FA_ISA_NAME) = 0;
#endif
