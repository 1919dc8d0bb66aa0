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

/* The test hook's native instructions (kernels.h): fa_bf16_native_ptr_<name>;
 * the tile ones on amx only */
#if defined(FA_SIMD_BF16) && !defined(FA_BF16_EMULATED)
static int native_op(int op, const void *a, const void *b, void *c)
{
    switch (op) {
#if defined(FA_SIMD_AMX)
    case FA_BF16_OP_TDPBF16PS:
#if defined(FA_AMX_FP16) /* (the instructions issued by their bytes: bf16_tiles.h) */
    case FA_BF16_OP_TDPBF16PS_BYTES:
    case FA_BF16_OP_TDPFP16PS:
#endif
    {
        if (op == FA_BF16_OP_TDPFP16PS && !fa_amx_fp16()) return FA_EINVAL;
        uint8_t cfg[64];
        fa_tilecfg_fill(cfg);
        _tile_loadconfig(cfg);
        _tile_loadd(0, c, 64);
        _tile_loadd(1, a, 64);
        _tile_loadd(2, b, 64);
        if (op == FA_BF16_OP_TDPBF16PS)
            _tile_dpbf16ps(0, 1, 2);
#if defined(FA_AMX_FP16)
        else if (op == FA_BF16_OP_TDPBF16PS_BYTES)
            FA_TDP_BYTES(2, 0, 1, 2); /* the encoding of FT_DP_F16, with pp = 2 */
        else
            FT_DP_F16(0, 0, 1, 2);
#endif
        _tile_stored(0, c, 64);
        _tile_release();
        return FA_OK;
    }
#endif
    case FA_BF16_OP_VDPBF16PS:
        _mm512_storeu_ps(c, _mm512_dpbf16_ps(_mm512_loadu_ps(c), (__m512bh)_mm512_loadu_si512(a),
                                             (__m512bh)_mm512_loadu_si512(b)));
        return FA_OK;
    case FA_BF16_OP_VCVTNE2PS2BF16:
        _mm512_storeu_si512(c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
        return FA_OK;
    case FA_BF16_OP_VCVTNEPS2BF16:
        _mm256_storeu_si256((__m256i *)c, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a)));
        return FA_OK;
    default:
        return FA_EINVAL;
    }
}
const fa_bf16_op_fn FA_PASTE(fa_bf16_native_ptr_, FA_ISA_NAME) = native_op;
#else
const fa_bf16_op_fn FA_PASTE(fa_bf16_native_ptr_, FA_ISA_NAME) = 0;
#endif
#define FA_SFX f32
#include "driver/decode_q8_tmpl.h" /* fa_decode_q8_item_<name>, on the f32 kernels above */
#undef FA_SFX
