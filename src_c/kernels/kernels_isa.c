/* kernels_isa.c -- the micro-kernel tables of one ISA (see kernels.h for the
 * contract).  setup.py compiles this file once per line of
 * runtime/isa_list.h, with -DFA_ISA_NAME=<name> and the flags of
 * simd/<name>.flags; simd/simd.h then maps the vector operations to that
 * ISA.  It instantiates kernels_tmpl.h for float and double and defines
 *   fa_kernels_f32_<name>, fa_kernels_f64_<name>
 * (fa_kernels_f32_generic, fa_kernels_f32_avx2, fa_kernels_f64_avx512, ...),
 * and the int8 KV cache's kernel fa_decode_q8_item_<name> (driver/decode_q8_tmpl.h). */
#include <string.h>

#include "driver/decode_q8.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "simd/simd.h"

#define FA_SFX f32
#include "kernels/kernels_tmpl.h" /* qk_f32_<name>, ..., fa_kernels_f32_<name> */
#undef FA_SFX
#define FA_SFX f64
#include "kernels/kernels_tmpl.h" /* qk_f64_<name>, ..., fa_kernels_f64_<name> */
#undef FA_SFX
#define FA_SFX f32
#include "driver/decode_q8_tmpl.h" /* fa_decode_q8_item_<name>, on the f32 kernels above */
#undef FA_SFX
