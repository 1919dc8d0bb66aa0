/* bf16_tiles.h -- the tile and dot-product vocabulary of the 16-bit matrix
 * kernels (kernels/flash16_steps.h), mapped once per ISA; included by
 * kernels_isa.c after simd.h when the mapping defines FA_SIMD_BF16 (the
 * rest of those kernels' vector operations: simd/flash16_ops.h).
 *
 * On amx, eight tile registers of 16 rows x 64 bytes (float32: 16 x 16;
 * bfloat16 pairs: 16 x 16 pairs), all configured alike (fa_cvt2bf16 on
 * both tiers):
 *   FT_CONFIG(tf), FT_RELEASE(tf)        set up / give back the tiles
 *   FT_LOAD(tf, t, p, stride), FT_STORE  16 rows of 64 bytes at p + r*stride
 *   FT_ZERO(tf, t)                       tile t = 0
 *   FT_DP(tf, c, a, b)                   C[m][n] += sum_k A[m][2k+e] B[k][2n+e]
 *                                        (bfloat16 pairs, float32 C: TDPBF16PS)
 *   fa_cvt2bf16(hi, lo)                  32 bfloat16 (round to nearest even):
 *                                        lo's 16 first, then hi's (VCVTNE2PS2BF16)
 * and, on amx only (FA_AMX_FP16: the float16 path):
 *   FT_DP_F16(tf, c, a, b)               FT_DP on float16 pairs (TDPFP16PS,
 *                                        AMX-FP16; fa_amx_fp16() says whether
 *                                        the CPU has it)
 *   fa_cvt2f16(hi, lo)                   32 float16 (nearest even), lo's 16
 *                                        first (VCVTPS2PH twice)
 * Implementations:
 *   amx (FA_SIMD_AMX):   the AMX instructions; tf is unused;
 *   avx512_bf16:         no tiles: FT_CONFIG and FT_RELEASE do nothing, and
 *                        the steps accumulate on zmm registers with
 *                        fa_dpbf16(acc, a, b) (VDPBF16PS: acc + a.b per
 *                        dword lane, bfloat16 pairs) -- the same products,
 *                        summed in another order than TDPBF16PS;
 *   FA_BF16_EMULATED:    either of the above on simd/bf16_emulate.h (plain C:
 *                        the emulation build runs both paths on any x86-64). */
#ifndef FASTATTN_BF16_TILES_H
#define FASTATTN_BF16_TILES_H

#include <stdint.h>

#include "runtime/half.h"
#include "runtime/util.h"
#include "simd/bf16_emulate.h"

#define FT_ROWS 16    /* rows of a tile */
#define FT_COLSB 64   /* bytes of a tile row */

/* The 64-byte tile configuration (LDTILECFG): palette 1, 8 tiles of 16 x 64 */
static inline void fa_tilecfg_fill(uint8_t cfg[64])
{
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = FT_COLSB;
        cfg[48 + t] = FT_ROWS;
    }
}

#if defined(FA_SIMD_AMX) && !defined(FA_BF16_EMULATED)
/* LDTILECFG of the 64 bytes at cfg.  Not _tile_loadconfig on gcc/clang: gcc
 * 12's tells the compiler that it reads 8 bytes ("m" of a pointer), so the
 * stores of the rest of cfg may be dropped as dead, and the instruction then
 * faults on a configuration whose column and row bytes are garbage.  Here
 * the operand is all 64 bytes. */
static inline void fa_ldtilecfg(const uint8_t cfg[64])
{
#if defined(__GNUC__) || defined(__clang__)
    typedef struct { uint8_t b[64]; } fa_tilecfg_bytes;
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const fa_tilecfg_bytes *)(const void *)cfg));
#else
    _tile_loadconfig(cfg);
#endif
}
#endif

#if defined(FA_SIMD_AMX) && defined(FA_BF16_EMULATED)
typedef fa_emu_tiles fa_tilefile;
#define FT_CONFIG(tf) do { uint8_t c_[64]; fa_tilecfg_fill(c_); fa_emu_tile_loadconfig(tf, c_); } while (0)
#define FT_RELEASE(tf) fa_emu_tile_release(tf)
#define FT_LOAD(tf, t, p, s) fa_emu_tile_loadd(tf, t, p, s)
#define FT_STORE(tf, t, p, s) fa_emu_tile_stored(tf, t, p, s)
#define FT_DP(tf, c, a, b) fa_emu_tile_dpbf16ps(tf, c, a, b)
#define FT_ZERO(tf, t) fa_emu_tile_zero(tf, t)
#define FT_DP_F16(tf, c, a, b) fa_emu_tile_dpfp16ps(tf, c, a, b)
#define FA_AMX_FP16 1
#elif defined(FA_SIMD_AMX)
typedef struct { int unused; } fa_tilefile;
#define FT_CONFIG(tf) do { uint8_t c_[64]; fa_tilecfg_fill(c_); fa_ldtilecfg(c_); } while (0)
#define FT_RELEASE(tf) _tile_release()
#define FT_LOAD(tf, t, p, s) _tile_loadd(t, p, s)
#define FT_STORE(tf, t, p, s) _tile_stored(t, p, s)
#define FT_DP(tf, c, a, b) _tile_dpbf16ps(c, a, b)
#define FT_ZERO(tf, t) _tile_zero(t)
#if defined(__GNUC__) || defined(__clang__)
/* A tile dot product by its bytes (gcc < 13 has no -mamx-fp16, and the
 * wheel's compiler may not either): VEX.128.<pp>.0F38.W0 5C /r, that is
 * c4 e2 ((~b & 15) << 3 | pp) 5c (c0 | c << 3 | a) for C = tile c, A = a,
 * B = b (literal tile numbers); pp 3 (F2) is TDPFP16PS ("tdpfp16ps
 * %tmm<b>, %tmm<a>, %tmm<c>" to the disassembler), pp 2 (F3) TDPBF16PS,
 * which the tests run against the intrinsic to pin the encoding. */
#define FA_TDP_BYTES(pp, c, a, b)                                                              \
    __asm__ volatile(".byte 0xc4, 0xe2, (((~(" FA_STR(b) ")) & 15) << 3) | " FA_STR(pp)       \
                     ", 0x5c, 0xc0 | ((" FA_STR(c) ") << 3) | (" FA_STR(a) ")" ::: "memory")
#define FT_DP_F16(tf, c, a, b) FA_TDP_BYTES(3, c, a, b)
#define FA_AMX_FP16 1
#endif
#else
/* avx512_bf16: no tile registers; the steps run on zmm registers
 * (kernels/flash16_steps.h) with fa_dpbf16, one VDPBF16PS */
typedef struct { int unused; } fa_tilefile;
#define FT_CONFIG(tf) ((void)(tf))
#define FT_RELEASE(tf) ((void)(tf))
#endif

/* VDPBF16PS, on both tiers (amx's decoding kernels run it too) */
#if defined(FA_BF16_EMULATED)
static inline __m512 fa_dpbf16(__m512 acc, __m512i a, __m512i b)
{
    float f[16];
    uint16_t x[32], y[32];
    _mm512_storeu_ps(f, acc);
    _mm512_storeu_si512((void *)x, a);
    _mm512_storeu_si512((void *)y, b);
    fa_emu_dpbf16_ps(f, x, y);
    return _mm512_loadu_ps(f);
}
#else
static inline __m512 fa_dpbf16(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

#if defined(FA_BF16_EMULATED)
static inline __m512i fa_cvt2bf16(__m512 hi, __m512 lo)
{
    float a[16], b[16];
    uint16_t o[32];
    _mm512_storeu_ps(a, hi);
    _mm512_storeu_ps(b, lo);
    fa_emu_cvtne2ps_pbh(o, a, b);
    return _mm512_loadu_si512((const void *)o);
}
#else
static inline __m512i fa_cvt2bf16(__m512 hi, __m512 lo)
{
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}
#endif

#if defined(FA_AMX_FP16) && defined(FA_BF16_EMULATED)
static inline __m512i fa_cvt2f16(__m512 hi, __m512 lo)
{
    float a[32];
    uint16_t o[32];
    _mm512_storeu_ps(a, lo);
    _mm512_storeu_ps(a + 16, hi);
    for (int i = 0; i < 32; i++) o[i] = fa_f32_to_f16(a[i]);
    return _mm512_loadu_si512((const void *)o);
}
#elif defined(FA_AMX_FP16)
static inline __m512i fa_cvt2f16(__m512 hi, __m512 lo)
{
#define FA_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, FA_RNE)),
                              _mm512_cvtps_ph(hi, FA_RNE), 1);
#undef FA_RNE
}
#endif

#endif
