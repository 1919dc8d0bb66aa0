/* bf16_hooks.c -- the test hook fa_bf16_op (fastattn.h): one tile or
 * bfloat16 instruction on small arrays, by the plain-C emulation of
 * simd/bf16_emulate.h (x86) and simd/bf16_emulate_arm.h (Arm: BFDOT,
 * BFMMLA) or (native) by the instruction itself, through
 * fa_bf16_native_op (the native_op16 entries of the f32 tables), so the
 * tests can pin the emulation to hand-computed cases and to the hardware. */
#include <string.h>

#include "fastattn.h"
#include "kernels/kernels.h"
#include "simd/bf16_emulate.h"
#include "simd/bf16_emulate_arm.h"

static int emulated_op(int op, const void *a, const void *b, void *c)
{
    switch (op) {
    case FA_BF16_OP_TDPBF16PS:
    case FA_BF16_OP_TDPBF16PS_BYTES:
    case FA_BF16_OP_TDPFP16PS: {
        fa_emu_tiles st;
        uint8_t cfg[64] = {1};
        for (int t = 0; t < 3; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
        fa_emu_tile_loadconfig(&st, cfg);
        fa_emu_tile_loadd(&st, 0, c, 64);
        fa_emu_tile_loadd(&st, 1, a, 64);
        fa_emu_tile_loadd(&st, 2, b, 64);
        if (op != FA_BF16_OP_TDPFP16PS)
            fa_emu_tile_dpbf16ps(&st, 0, 1, 2);
        else
            fa_emu_tile_dpfp16ps(&st, 0, 1, 2);
        fa_emu_tile_stored(&st, 0, c, 64);
        fa_emu_tile_release(&st);
        return FA_OK;
    }
    case FA_BF16_OP_VDPBF16PS:
        fa_emu_dpbf16_ps((float *)c, (const uint16_t *)a, (const uint16_t *)b);
        return FA_OK;
    case FA_BF16_OP_VCVTNE2PS2BF16:
        fa_emu_cvtne2ps_pbh((uint16_t *)c, (const float *)a, (const float *)b);
        return FA_OK;
    case FA_BF16_OP_VCVTNEPS2BF16:
        fa_emu_cvtneps_pbh((uint16_t *)c, (const float *)a);
        return FA_OK;
    case FA_BF16_OP_BFDOT:
        fa_emu_bfdot((float *)c, (const uint16_t *)a, (const uint16_t *)b);
        return FA_OK;
    case FA_BF16_OP_BFMMLA:
        fa_emu_bfmmla((float *)c, (const uint16_t *)a, (const uint16_t *)b);
        return FA_OK;
    default:
        return FA_EINVAL;
    }
}

int fa_bf16_op(int op, int native, const void *a, const void *b, void *c)
{
    if (!native) return emulated_op(op, a, b, c);
    const fa_bf16_op_fn fn = fa_bf16_native_op();
    return fn ? fn(op, a, b, c) : FA_EINVAL;
}
