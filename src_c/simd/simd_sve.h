/* simd_sve.h -- the SVE mapping at a vector length of 256 bits (see simd.h
 * for the contract): 8 floats / 4 doubles, 32 registers.
 * Included by simd.h once for the types and constants, then once per
 * element type (FA_SFX f32, f64) for the operations: V(op) -> vf_op, vd_op
 * on ACLE's overloaded intrinsics (svmla_x, svadd_x, ...) under the
 * all-true predicate SVP (svptrue_b32(), svptrue_b64()).
 *
 * SVE's own types are sizeless: they cannot be array elements, and the
 * kernels keep their register tile in arrays (VT acc[MR][NRV]).  So the
 * tier is compiled for one vector length (-msve-vector-bits=256, sve.flags)
 * and its vectors are the fixed-size types of arm_sve_vector_bits(256),
 * which may be array elements.  That code gives wrong results at any other
 * length: the tier requires FA_CPU_ARM_SVE256 (runtime/cpu_aarch64.c sets
 * it when this thread's vector length is exactly 256 bits).
 *
 * Register tile: 5 rows x 4 vectors (32 floats, 16 doubles of keys): 20
 * accumulators + 4 key vectors + the 5 broadcast query elements of a k step
 * (LD1RW; GCC loads them all first) = 29 of the 32 registers; with 6 rows
 * (34) GCC keeps accumulators on the stack across k steps (bench/arm_mca.sh).
 * NR = 32 / 16 divides FA_KC (kernels_tmpl.h asserts it).  float16 is widened by
 * FCVT from the low half of each 32-bit lane (LD1H zero-extends into it) and
 * narrowed by FCVT (the FPCR's rounding: nearest even, as Linux leaves it);
 * bfloat16 by shifts and an integer round-to-nearest-even, as neon and x86.
 * Horizontal sums are FADDV, whose order the architecture fixes (pairwise
 * halves); vf_hsum_lanes uses it per vector, so it adds as vf_hsum does.
 * The K-packing transposes are 4 x 4 / 2 x 2 NEON blocks (Advanced SIMD is
 * part of every SVE target; TB does not need the vector's width). */
#ifndef FA_SFX
#include <arm_neon.h>
#include <arm_sve.h>
#include <string.h>
#if !defined(__ARM_FEATURE_SVE_BITS) || __ARM_FEATURE_SVE_BITS != 256
#error "simd_sve.h: compile with -msve-vector-bits=256 (simd/sve.flags)"
#endif
typedef svfloat32_t vf __attribute__((arm_sve_vector_bits(256)));
typedef svfloat64_t vd __attribute__((arm_sve_vector_bits(256)));
#define VF_W 8
#define VD_W 4
#define VF_MR 5
#define VF_NRV 4
#define VD_MR 5
#define VD_NRV 4
#define VF_PV_MR 5
#define VD_PV_MR 5
#define VF_TB 4
#define VD_TB 2
/* In the per-type pass (FA_SFX f32 or f64):
 *   SVP       -> svptrue_b32(), svptrue_b64()
 *   SV_DUP    -> svdup_n_f32, svdup_n_f64
 *   SV_TO_U, SV_TO_S -> svreinterpret_u32 / _s32, svreinterpret_u64 / _s64
 *   SV_FROM   -> svreinterpret_f32, svreinterpret_f64 (from any) */
#define FA_SVE_BITS_f32 32
#define FA_SVE_BITS_f64 64
#define FA_NMANT_f32 23 /* mantissa bits */
#define FA_NMANT_f64 52
#define SV_BITS FA_PASTE(FA_SVE_BITS_, FA_SFX)
#define SVP FA_PASTE(svptrue_b, SV_BITS)()
#define SV_DUP FA_CAT3(svdup, n, FA_SFX)
#define SV_TO_U FA_PASTE(svreinterpret_u, SV_BITS)
#define SV_TO_S FA_PASTE(svreinterpret_s, SV_BITS)
#define SV_FROM FA_CAT(svreinterpret, FA_SFX)

/* 16-bit storage widened to a float vector, every lane exact */
static inline vf vf_load_f16(const uint16_t *p)
{
    const svbool_t pg = svptrue_b32();
    return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(svld1uh_u32(pg, p)));
}
static inline vf vf_load_bf16(const uint16_t *p)
{
    const svbool_t pg = svptrue_b32();
    return svreinterpret_f32_u32(svlsl_n_u32_x(pg, svld1uh_u32(pg, p), 16));
}
/* float vector rounded to nearest even into 16-bit storage (overflow to
 * +-inf, NaN stays a quiet NaN) */
static inline void vf_store_f16(uint16_t *p, vf x)
{
    const svbool_t pg = svptrue_b32();
    svst1h_u32(pg, p, svreinterpret_u32_f16(svcvt_f16_f32_x(pg, x)));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const svbool_t pg = svptrue_b32();
    const svuint32_t u = svreinterpret_u32_f32(x);
    const svuint32_t lsb = svand_n_u32_x(pg, svlsr_n_u32_x(pg, u, 16), 1);
    const svuint32_t r = svadd_u32_x(pg, u, svadd_n_u32_x(pg, lsb, 0x7fff));
    const svuint32_t b = svsel_u32(svcmpuo_f32(pg, x, x), svorr_n_u32_x(pg, u, 0x400000), r);
    svst1h_u32(pg, p, svlsr_n_u32_x(pg, b, 16));
}
#include "simd/transpose_neon.h" /* vf_transpose_block, vd_transpose_block */
/* lane i = the sum of x[i]'s lanes (FADDV, as vf_hsum), for x[0..8) */
static inline vf vf_hsum_lanes(const vf *x)
{
    const svbool_t pg = svptrue_b32();
    float t[VF_W];
    for (int i = 0; i < VF_W; i++) t[i] = svaddv_f32(pg, x[i]);
    return svld1_f32(pg, t);
}
/* VF_W int8 at p (8 bytes, no more read), sign-extended and converted to
 * float (the int8 KV cache) */
static inline vf vf_load_i8(const int8_t *p)
{
    const svbool_t pg = svptrue_b32();
    return svcvt_f32_s32_x(pg, svld1sb_s32(pg, p));
}

#else /* the operations of element type FA_SFX */
static inline VT V(load)(const FA_T *p) { return svld1(SVP, p); }
static inline void V(store)(FA_T *p, VT a) { svst1(SVP, p, a); }
static inline VT V(set1)(FA_T a) { return SV_DUP(a); }
static inline VT V(zero)(void) { return V(set1)((FA_T)0); }
/* a*b + c and c - a*b, fused (FMLA, FMLS) */
static inline VT V(fma)(VT a, VT b, VT c) { return svmla_x(SVP, c, a, b); }
static inline VT V(fnma)(VT a, VT b, VT c) { return svmls_x(SVP, c, a, b); }
static inline VT V(add)(VT a, VT b) { return svadd_x(SVP, a, b); }
static inline VT V(sub)(VT a, VT b) { return svsub_x(SVP, a, b); }
static inline VT V(mul)(VT a, VT b) { return svmul_x(SVP, a, b); }
static inline VT V(div)(VT a, VT b) { return svdiv_x(SVP, a, b); }
static inline VT V(abs)(VT x) { return svabs_x(SVP, x); }
/* a where x < lo, else b (NaN x: b) */
static inline VT V(where_below)(VT a, VT b, VT x, FA_T lo)
{
    return svsel(svcmplt(SVP, x, V(set1)(lo)), a, b);
}
/* max(a, b): b where either is NaN (as x86's max; FMAX would give the NaN) */
static inline VT V(max)(VT a, VT b) { return svsel(svcmpgt(SVP, a, b), a, b); }
/* min(a, b): b where either is NaN (as x86's min) */
static inline VT V(min)(VT a, VT b) { return svsel(svcmplt(SVP, a, b), a, b); }
/* max ignoring a NaN in x: acc where x is NaN (FMAXNM; acc is never NaN) */
static inline VT V(max_acc)(VT acc, VT x) { return svmaxnm_x(SVP, acc, x); }
/* the magnitude of m with the sign of s, by the sign bit */
static inline VT V(copysign)(VT m, VT s)
{
    const VT sign = V(set1)((FA_T)-0.0);
    return SV_FROM(svorr_x(SVP, svand_x(SVP, SV_TO_U(s), SV_TO_U(sign)),
                           svbic_x(SVP, SV_TO_U(m), SV_TO_U(sign))));
}
static inline VT V(round)(VT x) { return svrintn_x(SVP, x); } /* FRINTN: ties to even */
/* p, or 0 where x < lo (NaN x: p) */
static inline VT V(zero_below)(VT p, VT x, FA_T lo)
{
    return svsel(svcmplt(SVP, x, V(set1)(lo)), V(zero)(), p);
}
/* the integer image of x shifted into the exponent field */
static inline VT V(exp_bits)(VT x)
{
    return SV_FROM(svlsl_x(SVP, SV_TO_S(x), FA_PASTE(FA_NMANT_, FA_SFX)));
}
/* lanes of acc become all-ones bits (a NaN) where x is NaN */
static inline VT V(nan_acc)(VT acc, VT x)
{
    return svsel(svcmpuo(SVP, x, x), SV_FROM(svdup_n_s32(-1)), acc);
}
/* 1 if every lane of x is < lo (NaN is not) */
static inline int V(all_below)(VT x, FA_T lo)
{
    return !svptest_any(SVP, svnot_z(SVP, svcmplt(SVP, x, V(set1)(lo))));
}
/* horizontal max (FMAXNMV: NaN ignored) and sum (FADDV: pairwise halves) */
static inline FA_T V(hmax)(VT a) { return svmaxnmv(SVP, a); }
static inline FA_T V(hsum)(VT a) { return svaddv(SVP, a); }
#if !FA_IS_F64(FA_SFX)
/* p * 2^n by the exponent bits of 2^n: normal for n in [-126, 0] (n
 * integral: FCVTZS is exact on it) */
static inline vf vf_ldexp(vf p, vf n)
{
    const svbool_t pg = svptrue_b32();
    svint32_t e = svcvt_s32_f32_x(pg, svmax_n_f32_x(pg, n, -126.0f));
    e = svlsl_n_s32_x(pg, svadd_n_s32_x(pg, e, 127), 23);
    return svmul_f32_x(pg, p, svreinterpret_f32_s32(e));
}
#else
/* p * 2^n by the exponent bits of 2^n: normal for n in [-1022, 0] */
static inline vd vd_ldexp(vd p, vd n)
{
    const svbool_t pg = svptrue_b64();
    svint64_t e = svcvt_s64_f64_x(pg, svmax_n_f64_x(pg, n, -1022.0));
    e = svlsl_n_s64_x(pg, svadd_n_s64_x(pg, e, 1023), 52);
    return svmul_f64_x(pg, p, svreinterpret_f64_s64(e));
}
#endif
/* p 2^n where x >= lo (or x is NaN), 0 where x < lo */
static inline VT V(ldexp_from)(VT p, VT n, VT x, FA_T lo)
{
    return V(zero_below)(V(ldexp)(p, n), x, lo);
}
#endif
