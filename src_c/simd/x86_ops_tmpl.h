/* x86_ops_tmpl.h -- the operations both x86 mappings spell alike but for
 * the width of their intrinsics: included by simd_avx2.h and simd_avx512.h
 * in their per-type pass (FA_SFX f32, f64; MM(op) the intrinsic, e.g.
 * MM(add) -> _mm256_add_ps: see x86.h), defining V(load), V(store),
 * V(set1), V(zero), V(fma), V(fnma), V(add), V(sub), V(mul), V(max), V(min),
 * V(max_acc), V(exp_bits), V(div), V(abs), V(copysign): vf_load ...
 * vd_copysign. */
static inline VT V(load)(const FA_T *p) { return MM(loadu)(p); }
static inline void V(store)(FA_T *p, VT a) { MM(storeu)(p, a); }
static inline VT V(set1)(FA_T a) { return MM(set1)(a); }
static inline VT V(zero)(void) { return MM(setzero)(); }
static inline VT V(fma)(VT a, VT b, VT c) { return MM(fmadd)(a, b, c); }
static inline VT V(fnma)(VT a, VT b, VT c) { return MM(fnmadd)(a, b, c); }
static inline VT V(add)(VT a, VT b) { return MM(add)(a, b); }
static inline VT V(sub)(VT a, VT b) { return MM(sub)(a, b); }
static inline VT V(mul)(VT a, VT b) { return MM(mul)(a, b); }
/* max(a, b), min(a, b): b where either is NaN */
static inline VT V(max)(VT a, VT b) { return MM(max)(a, b); }
static inline VT V(min)(VT a, VT b) { return MM(min)(a, b); }
/* max ignoring a NaN in x: acc where x is NaN */
static inline VT V(max_acc)(VT acc, VT x) { return MM(max)(x, acc); }
/* the integer image of x shifted into the exponent field */
static inline VT V(exp_bits)(VT x) { return MM_FROM_INT(MM_INT(slli)(MM_TO_INT(x), FA_PASTE(FA_MANT_, FA_SFX))); }
static inline VT V(div)(VT a, VT b) { return MM(div)(a, b); }
/* |x|, and the magnitude of m with the sign of s, by the sign bit */
static inline VT V(abs)(VT x)
{
    return MM_FROM_INT(MM_SI(andnot)(MM_TO_INT(V(set1)((FA_T)-0.0)), MM_TO_INT(x)));
}
static inline VT V(copysign)(VT m, VT s)
{
    const VT sign = V(set1)((FA_T)-0.0);
    return MM_FROM_INT(MM_SI(or)(MM_SI(andnot)(MM_TO_INT(sign), MM_TO_INT(m)),
                                 MM_SI(and)(MM_TO_INT(sign), MM_TO_INT(s))));
}
