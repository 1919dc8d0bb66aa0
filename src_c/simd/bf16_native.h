/* bf16_native.h -- the test hook's native instructions (fastattn.h:
 * fa_bf16_op; the native_op16 entry of the f32 table, kernels.h): one tile
 * or bfloat16 vector instruction on small arrays, the tile ones on amx
 * only.  Included by kernels_isa.c where the mapping defines FA_SIMD_BF16
 * and the build has the real instructions (not FA_BF16_EMULATED);
 * FA_CAT(bf16_native_op, FA_ISA_NAME) -> bf16_native_op_amx,
 * bf16_native_op_avx512_bf16. */
#ifndef FASTATTN_BF16_NATIVE_H
#define FASTATTN_BF16_NATIVE_H

#include "fastattn.h"
#include "simd/bf16_tiles.h"

#if defined(FA_SIMD_AMX)
/* one 16 x 16 tile product: c += a . b (64-byte rows) */
static int bf16_native_tile(int op, const void *a, const void *b, void *c)
{
#if defined(FA_AMX_FP16)
    if (op == FA_BF16_OP_TDPFP16PS && !fa_amx_fp16()) return FA_EINVAL;
#endif
    uint8_t cfg[64];
    fa_tilecfg_fill(cfg);
    fa_ldtilecfg(cfg);
    _tile_loadd(0, c, FT_COLSB);
    _tile_loadd(1, a, FT_COLSB);
    _tile_loadd(2, b, FT_COLSB);
    if (op == FA_BF16_OP_TDPBF16PS)
        _tile_dpbf16ps(0, 1, 2);
#if defined(FA_AMX_FP16)
    else if (op == FA_BF16_OP_TDPBF16PS_BYTES)
        FA_TDP_BYTES(2, 0, 1, 2); /* the encoding of FT_DP_F16, with pp = 2 */
    else
        FT_DP_F16(0, 0, 1, 2);
#endif
    _tile_stored(0, c, FT_COLSB);
    _tile_release();
    return FA_OK;
}
#endif

static int FA_CAT(bf16_native_op, FA_ISA_NAME)(int op, const void *a, const void *b, void *c)
{
    switch (op) {
#if defined(FA_SIMD_AMX)
    case FA_BF16_OP_TDPBF16PS:
#if defined(FA_AMX_FP16) /* (the instructions issued by their bytes: bf16_tiles.h) */
    case FA_BF16_OP_TDPBF16PS_BYTES:
    case FA_BF16_OP_TDPFP16PS:
#endif
        return bf16_native_tile(op, a, b, c);
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

#endif
