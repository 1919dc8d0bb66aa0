/* simd_neon.h -- the Armv8 Advanced SIMD (NEON) mapping (see simd.h for the
 * contract): 128-bit vectors, 4 floats / 2 doubles, 32 registers.
 * Included by simd.h once for the types and constants, then once per
 * element type (FA_SFX f32, f64) for the operations: V(op) -> vf_op, vd_op
 * on the intrinsics NQ(op) -> vopq_f32, vopq_f64 (vaddq_f32, vfmaq_f64 ...).
 *
 * Register tile: 5 rows x 4 vectors (16 floats, 8 doubles of keys): 20
 * accumulators + 4 key vectors + the 5 query elements of a k step (GCC loads
 * them all first, for FMLA by element) = 29 of the 32 registers; with 6 rows
 * (34) GCC keeps accumulators on the stack across k steps (bench/arm_mca.sh).
 * NR = 16 / 8 divides FA_KC (kernels_tmpl.h asserts it).
 * float16 is widened by FCVTL (vcvt_f32_f16) and narrowed by FCVTN (the
 * FPCR's rounding: nearest even, as Linux and macOS leave it); bfloat16 by
 * shifts (its bits are the upper half of a float32) and an integer
 * round-to-nearest-even, as on x86.  Reductions are written as pairwise
 * adds (FADDP) so that every build, SIMDe's included, adds in one order. */
#ifndef FA_SFX
#if defined(FA_NEON_SIMDE)
/* Test builds only (setup.py, FASTATTN_NEON_EMULATION=simde): the same
 * source on x86-64, its NEON intrinsics implemented by SIMDe (0.8.2 or later:
 * vdivq, vcvtnq) on AVX2 + FMA, so that a fused multiply-add stays
 * fused and the numbers are those of the hardware (a NaN's sign and payload
 * are x86's). */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/arm/neon.h>
#else
#include <arm_neon.h>
#endif
#include <string.h>
typedef float32x4_t vf;
typedef float64x2_t vd;
#define VF_W 4
#define VD_W 2
#define VF_MR 5
#define VF_NRV 4
#define VD_MR 5
#define VD_NRV 4
#define VF_PV_MR 5
#define VD_PV_MR 5
#define VF_TB 4
#define VD_TB 2
/* In the per-type pass (FA_SFX f32 or f64):
 *   NQ(vadd)  -> vaddq_f32, vaddq_f64;  NQU(vbic) -> vbicq_u32, vbicq_u64
 *   NQ_TO_U   -> vreinterpretq_u32_f32, vreinterpretq_u64_f64; NQ_FROM_U
 *   the reverse; NQ_TO_S, NQ_FROM_S the same with s32, s64
 *   NQ_N(vdup) -> vdupq_n_f32 ...;  NQS_N(vshl) -> vshlq_n_s32, vshlq_n_s64 */
#define FA_NQU_f32 u32
#define FA_NQU_f64 u64
#define FA_NQS_f32 s32
#define FA_NQS_f64 s64
#define FA_NMANT_f32 23 /* mantissa bits */
#define FA_NMANT_f64 52
#define NQU_ FA_PASTE(FA_NQU_, FA_SFX)
#define NQS_ FA_PASTE(FA_NQS_, FA_SFX)
#define NQ(op) FA_CAT(FA_PASTE(op, q), FA_SFX)
#define NQU(op) FA_CAT(FA_PASTE(op, q), NQU_)
#define NQ_N(op) FA_CAT3(FA_PASTE(op, q), n, FA_SFX)
#define NQS_N(op) FA_CAT3(FA_PASTE(op, q), n, NQS_)
#define NQ_TO_U FA_CAT3(vreinterpretq, NQU_, FA_SFX)
#define NQ_TO_S FA_CAT3(vreinterpretq, NQS_, FA_SFX)
#define NQ_FROM_U FA_CAT3(vreinterpretq, FA_SFX, NQU_)
#define NQ_FROM_S FA_CAT3(vreinterpretq, FA_SFX, NQS_)

/* 16-bit storage widened to a float vector, every lane exact: FCVTL
 * (float16), a shift left by 16 (bfloat16) */
static inline vf vf_load_f16(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline vf vf_load_bf16(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
/* float vector rounded to nearest even into 16-bit storage (overflow to
 * +-inf, NaN stays a quiet NaN) */
static inline void vf_store_f16(uint16_t *p, vf x)
{
    vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb));
    const uint32x4_t num = vceqq_f32(x, x); /* all-ones where x is not NaN */
    vst1_u16(p, vshrn_n_u32(vbslq_u32(num, r, vorrq_u32(u, vdupq_n_u32(0x400000))), 16));
}
#include "simd/transpose_neon.h" /* vf_transpose_block, vd_transpose_block */
/* lane i = the sum of x[i]'s lanes, for the 4 vectors x[0..4): two rounds
 * of pairwise adds */
static inline vf vf_hsum_lanes(const vf *x)
{
    return vpaddq_f32(vpaddq_f32(x[0], x[1]), vpaddq_f32(x[2], x[3]));
}
/* VF_W int8 at p (4 bytes, no more read), sign-extended and converted to
 * float (the int8 KV cache) */
static inline vf vf_load_i8(const int8_t *p)
{
    int32_t w;
    memcpy(&w, p, sizeof w);
    const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}

#else /* the operations of element type FA_SFX */
static inline VT V(load)(const FA_T *p) { return NQ(vld1)(p); }
static inline void V(store)(FA_T *p, VT a) { NQ(vst1)(p, a); }
static inline VT V(set1)(FA_T a) { return NQ_N(vdup)(a); }
static inline VT V(zero)(void) { return V(set1)((FA_T)0); }
/* a*b + c and c - a*b = c + (-a)*b, fused (FMLA; FMLS, which compilers
 * make of the negated FMLA: SIMDe's vfmsq is a multiply and a subtraction) */
static inline VT V(fma)(VT a, VT b, VT c) { return NQ(vfma)(c, a, b); }
static inline VT V(fnma)(VT a, VT b, VT c) { return NQ(vfma)(c, NQ(vneg)(a), b); }
static inline VT V(add)(VT a, VT b) { return NQ(vadd)(a, b); }
static inline VT V(sub)(VT a, VT b) { return NQ(vsub)(a, b); }
static inline VT V(mul)(VT a, VT b) { return NQ(vmul)(a, b); }
static inline VT V(div)(VT a, VT b) { return NQ(vdiv)(a, b); }
static inline VT V(abs)(VT x) { return NQ(vabs)(x); }
/* a where x < lo, else b (NaN x: b) */
static inline VT V(where_below)(VT a, VT b, VT x, FA_T lo)
{
    return NQ(vbsl)(NQ(vclt)(x, V(set1)(lo)), a, b);
}
/* max(a, b): b where either is NaN (as x86's max; FMAX would give the NaN) */
static inline VT V(max)(VT a, VT b) { return NQ(vbsl)(NQ(vcgt)(a, b), a, b); }
/* min(a, b): b where either is NaN (as x86's min) */
static inline VT V(min)(VT a, VT b) { return NQ(vbsl)(NQ(vclt)(a, b), a, b); }
/* max ignoring a NaN in x: acc where x is NaN (FMAXNM; acc is never NaN) */
static inline VT V(max_acc)(VT acc, VT x) { return NQ(vmaxnm)(acc, x); }
/* the magnitude of m with the sign of s, by the sign bit */
static inline VT V(copysign)(VT m, VT s)
{
    return NQ(vbsl)(NQ_TO_U(V(set1)((FA_T)-0.0)), s, m);
}
static inline VT V(round)(VT x) { return NQ(vrndn)(x); } /* FRINTN: ties to even */
/* p, or 0 where x < lo (NaN x: p) */
static inline VT V(zero_below)(VT p, VT x, FA_T lo)
{
    return NQ_FROM_U(NQU(vbic)(NQ_TO_U(p), NQ(vclt)(x, V(set1)(lo))));
}
/* the integer image of x shifted into the exponent field */
static inline VT V(exp_bits)(VT x)
{
    return NQ_FROM_S(NQS_N(vshl)(NQ_TO_S(x), FA_PASTE(FA_NMANT_, FA_SFX)));
}
#if !FA_IS_F64(FA_SFX)
/* lanes of acc become all-ones bits (a NaN) where x is NaN (x != x) */
static inline vf vf_nan_acc(vf acc, vf x)
{
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(acc), vmvnq_u32(vceqq_f32(x, x))));
}
/* 1 if every lane of x is < lo (NaN is not) */
static inline int vf_all_below(vf x, float lo)
{
    return vminvq_u32(vcltq_f32(x, vdupq_n_f32(lo))) != 0;
}
/* p * 2^n by the exponent bits of 2^n: normal for n in [-126, 0] */
static inline vf vf_ldexp(vf p, vf n)
{
    int32x4_t e = vcvtnq_s32_f32(vmaxq_f32(n, vdupq_n_f32(-126.0f)));
    e = vshlq_n_s32(vaddq_s32(e, vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
/* horizontal max (FMAXNMV: NaN ignored) and sum ((a0 + a1) + (a2 + a3)) */
static inline float vf_hmax(vf a) { return vmaxnmvq_f32(a); }
static inline float vf_hsum(vf a)
{
    const float32x4_t t = vpaddq_f32(a, a);
    return vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 1);
}
#else
/* lanes of acc become all-ones bits (a NaN) where x is NaN (no 64-bit
 * NOT: the all-ones / all-zeros mask negated as 32-bit lanes) */
static inline vd vd_nan_acc(vd acc, vd x)
{
    const uint64x2_t nan = vreinterpretq_u64_u32(vmvnq_u32(vreinterpretq_u32_u64(vceqq_f64(x, x))));
    return vreinterpretq_f64_u64(vorrq_u64(vreinterpretq_u64_f64(acc), nan));
}
static inline int vd_all_below(vd x, double lo)
{
    return vminvq_u32(vreinterpretq_u32_u64(vcltq_f64(x, vdupq_n_f64(lo)))) != 0;
}
/* p * 2^n by the exponent bits of 2^n: normal for n in [-1022, 0] */
static inline vd vd_ldexp(vd p, vd n)
{
    int64x2_t e = vcvtnq_s64_f64(vmaxq_f64(n, vdupq_n_f64(-1022.0)));
    e = vshlq_n_s64(vaddq_s64(e, vdupq_n_s64(1023)), 52);
    return vmulq_f64(p, vreinterpretq_f64_s64(e));
}
static inline double vd_hmax(vd a) { return vmaxnmvq_f64(a); }
static inline double vd_hsum(vd a) { return vgetq_lane_f64(a, 0) + vgetq_lane_f64(a, 1); }
#endif
/* p 2^n where x >= lo (or x is NaN), 0 where x < lo */
static inline VT V(ldexp_from)(VT p, VT n, VT x, FA_T lo)
{
    return V(zero_below)(V(ldexp)(p, n), x, lo);
}
#endif
