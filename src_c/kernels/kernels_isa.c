/* kernels_isa.c -- the kernel tables of one ISA (see kernels.h for the
 * contract).  setup.py compiles this file once per line of
 * runtime/isa_list.h, with -DFA_ISA_NAME=<name> and the flags of
 * simd/<name>.flags; simd/simd.h then maps the vector operations to that
 * ISA.  It instantiates kernels_tmpl.h for float and double and defines
 *   fa_kernels_f32_<name>, fa_kernels_f64_<name>
 * (fa_kernels_f32_generic, fa_kernels_f32_avx2, fa_kernels_f64_avx512, ...);
 * the f32 table also holds the 16-bit matrix kernels (kernels/flash16_*.h,
 * where the mapping has bfloat16 dot products: FA_SIMD_BF16), the test
 * hook's native instructions (simd/bf16_native.h), the int8 KV cache's
 * kernel and quantiser (kernels/decode_q8_tmpl.h, kernels/quantize_q8_tmpl.h),
 * on the x86 bfloat16 tiers the
 * bfloat16 decoding kernels (kernels/decode_dp16.h) and the
 * 16-bit backward's products (kernels/bw16.h, amx and avx512_bf16). */
#include <float.h>
#include <string.h>

#include "kernels/blocking.h"
#include "kernels/decode_q8.h"
#include "kernels/kernels.h"
#include "runtime/half.h"
#include "simd/simd.h"

#ifdef FA_SIMD_BF16
#include "fastattn.h"
#if defined(FA_SIMD_NEON_BF16)
#include "simd/flash16_neon.h" /* the same vocabulary on Advanced SIMD + BFMMLA */
#else
#include "simd/bf16_tiles.h"
#include "simd/flash16_ops.h"
#endif
#define FL(name) FA_CAT3(flash16, name, FA_ISA_NAME) /* FL(pack_kv) -> flash16_pack_kv_amx, ... */
#if defined(FA_SIMD_AMX) || defined(FA_SIMD_NEON_BF16) /* keys per key block (blocking.h) */
#define FL_KB FA_FLASH16_KB_TILES
#else
#define FL_KB FA_FLASH16_KB_VEC
#endif
#include "kernels/flash16_pack.h"
#include "kernels/flash16_steps.h"
#include "kernels/flash16_softmax.h"
#include "kernels/flash16_blocks.h"
#if !defined(FA_SIMD_NEON_BF16) /* the bfloat16 decoding kernels */
#include "simd/dp16_rows.h"
#include "kernels/decode_dp16.h" /* qk_rows_dp16_avx512_bf16, pv_rows_dp16_amx, ... */
#define FA_DECODE_DP16 1
#if defined(FA_SIMD_AMX) /* widening: float32 queries taken exactly (kernels.h) */
#define FA_DECODE_F32Q 1
#else
#define FA_DECODE_F32Q 0
#endif
#endif
#define FA_FLASH16_ENTRIES                                                                   \
    {sizeof(fa_tilefile), FL_KB, FL16_FP16, FL(pack_kv), FL(pack_qt), FL(tiles_on),          \
     FL(tiles_off), FL(queue_qk), FL(queue_pv), FL(drain), FL(mask), FL(newmax),             \
     FL(rescale), FL(weights), FL(finish), FL(key_blocks)}
#if defined(FA_AMX_FP16)
#define FL16_FP16 1
#else
#define FL16_FP16 0
#endif
#else
#define FA_FLASH16_ENTRIES {0}
#endif

#if defined(FA_SIMD_NEON_BF16) && !defined(FA_NEON_SIMDE)
#define FA_NATIVE_OP16 FA_CAT(bf16_native_op, FA_ISA_NAME) /* in simd/flash16_neon.h */
#elif defined(FA_SIMD_BF16) && !defined(FA_SIMD_NEON_BF16) && !defined(FA_BF16_EMULATED)
#include "simd/bf16_native.h"
#define FA_NATIVE_OP16 FA_CAT(bf16_native_op, FA_ISA_NAME)
#else
#define FA_NATIVE_OP16 NULL
#endif

/* the int8 KV cache's kernel, defined after the f32 kernels it calls, and
 * its quantiser */
static void FA_CAT(fa_decode_q8_item, FA_ISA_NAME)(const fa_q8_item *it);
#include "kernels/quantize_q8_tmpl.h" /* fa_quantize_q8_rows_<name> */
#if defined(FA_SIMD_BF16) && !defined(FA_SIMD_NEON_BF16)
#include "kernels/bw16.h" /* bw16_gemm_amx, bw16_grad_pair_avx512_bf16, ... */
#define FA_BW16_ENTRIES {BW(gemm), BW(trans), BW(grad_pair), BW(inter), BW(cols), BW(dots)}
#else
#define FA_BW16_ENTRIES {0}
#endif
#define FA_F32_ONLY_ENTRIES                                                                  \
    FA_FLASH16_ENTRIES, FA_NATIVE_OP16, FA_CAT(fa_decode_q8_item, FA_ISA_NAME),             \
        FA_CAT(fa_quantize_q8_rows, FA_ISA_NAME), FA_BW16_ENTRIES

#define FA_SFX f32
#include "kernels/kernels_tmpl.h" /* qk_f32_<name>, ..., fa_kernels_f32_<name> */
#undef FA_SFX
#define FA_SFX f64
#include "kernels/kernels_tmpl.h" /* qk_f64_<name>, ..., fa_kernels_f64_<name> */
#undef FA_SFX

#define FA_SFX f32
#include "kernels/decode_q8_tmpl.h" /* fa_decode_q8_item_<name>, on the f32 kernels above */
#undef FA_SFX
