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
#include "simd/simd.h"

#define FA_SFX f32
#include "kernels/kernels_tmpl.h" /* qk_f32_<name>, pv_f32_<name>, ... */
#undef FA_SFX
#define FA_SFX f64
#include "kernels/kernels_tmpl.h" /* qk_f64_<name>, pv_f64_<name>, ... */
#undef FA_SFX

/* FA_TABLE(f32, VF) -> const fa_kernels_f32 fa_kernels_f32_<name> = {...} */
#define FA_TABLE(SFX, VPU)                                                            \
    const fa_kernels_##SFX FA_CAT3(fa_kernels, SFX, FA_ISA_NAME) = {                  \
        FA_STR(FA_ISA_NAME), VPU##_MR, VPU##_NRV * VPU##_W, VPU##_W,                  \
        FA_CAT3(qk, SFX, FA_ISA_NAME),     FA_CAT3(pv, SFX, FA_ISA_NAME),             \
        FA_CAT3(qk_direct, SFX, FA_ISA_NAME), FA_CAT3(pv_direct, SFX, FA_ISA_NAME),   \
        FA_CAT3(rowmax, SFX, FA_ISA_NAME), FA_CAT3(expsum, SFX, FA_ISA_NAME),         \
        FA_CAT3(expsum2, SFX, FA_ISA_NAME),                                           \
        FA_CAT3(scal, SFX, FA_ISA_NAME), FA_CAT3(online_softmax, SFX, FA_ISA_NAME),   \
        FA_CAT3(pack_k, SFX, FA_ISA_NAME), FA_CAT3(pack_v, SFX, FA_ISA_NAME),         \
        FA_CAT3(fma_probe, SFX, FA_ISA_NAME)};

FA_TABLE(f32, VF)
FA_TABLE(f64, VD)
