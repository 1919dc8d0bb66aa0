/* simd_generic.h -- portable C: one-lane "vectors"; the compiler may
 * auto-vectorise the loops (see simd.h for the contract).  Its exp, exp2
 * and tanh are the C library's (FA_SIMD_LIBM_EXP: vmath_tmpl.h is not used).
 * Included by simd.h once for the types and constants, then once per
 * element type (FA_SFX f32, f64) for the operations: V(op) -> vf_op, vd_op. */
#ifndef FA_SFX
typedef float vf;
typedef double vd;
#define VF_W 1
#define VD_W 1
#define VF_MR 4
#define VF_NRV 4
#define VD_MR 4
#define VD_NRV 4
#define VF_PV_MR 4
#define VD_PV_MR 4
#define VF_TB 4
#define VD_TB 4
#define FA_SIMD_LIBM_EXP 1
#include "runtime/half.h"
/* 16-bit storage widened to float (runtime/half.h: exact) */
static inline vf vf_load_f16(const uint16_t *p) { return fa_f16_to_f32(*p); }
static inline vf vf_load_bf16(const uint16_t *p) { return fa_bf16_to_f32(*p); }
/* float rounded to nearest even into 16-bit storage (runtime/half.h) */
static inline void vf_store_f16(uint16_t *p, vf x) { *p = fa_f32_to_f16(x); }
static inline void vf_store_bf16(uint16_t *p, vf x) { *p = fa_f32_to_bf16(x); }

#else /* the operations of element type FA_SFX */
static inline VT V(load)(const FA_T *p) { return *p; }
static inline void V(store)(FA_T *p, VT a) { *p = a; }
static inline VT V(set1)(FA_T a) { return a; }
static inline VT V(zero)(void) { return 0; }
static inline VT V(fma)(VT a, VT b, VT c) { return a * b + c; }
static inline VT V(add)(VT a, VT b) { return a + b; }
static inline VT V(sub)(VT a, VT b) { return a - b; }
static inline VT V(mul)(VT a, VT b) { return a * b; }
static inline VT V(fnma)(VT a, VT b, VT c) { return c - a * b; }
static inline VT V(abs)(VT a) { return a < 0 ? -a : a; }
static inline VT V(max_acc)(VT acc, VT x) { return x > acc ? x : acc; }
static inline VT V(min)(VT a, VT b) { return a < b ? a : b; } /* b where either is NaN */
static inline VT V(nan_acc)(VT acc, VT x) { return x != x ? x : acc; }
static inline FA_T V(hmax)(VT a) { return a; }
/* 1 if x < lo (NaN is not) */
static inline int V(all_below)(VT x, FA_T lo) { return x < lo; }
/* a where x < lo, else b (NaN x: b) */
static inline VT V(where_below)(VT a, VT b, VT x, FA_T lo) { return x < lo ? a : b; }
static inline FA_T V(hsum)(VT a) { return a; }
#if !FA_IS_F64(FA_SFX)
static inline vf vf_load_i8(const int8_t *p) { return (float)*p; } /* the int8 KV cache */
static inline vf vf_hsum_lanes(const vf *x) { return x[0]; }
static inline vf vf_exp(vf x) { return x < VF_EXP_LO ? 0.0f : expf(x); }
static inline vf vf_exp2(vf x) { return x < -126.0f ? 0.0f : exp2f(x); }
static inline vf vf_tanh(vf x) { return tanhf(x); }
#else
static inline vd vd_exp(vd x) { return x < VD_EXP_LO ? 0.0 : exp(x); }
static inline vd vd_exp2(vd x) { return x < -1022.0 ? 0.0 : exp2(x); }
static inline vd vd_tanh(vd x) { return tanh(x); }
#endif
static inline void V(transpose_block)(const FA_T *src, int64_t srs, FA_T *dst, int64_t drs)
{
    for (int r = 0; r < VC(TB); r++)
        for (int i = 0; i < VC(TB); i++) dst[i * drs + r] = src[r * srs + i];
}
#endif
