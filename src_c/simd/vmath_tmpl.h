/* vmath_tmpl.h -- exp and exp2 over a mapping's primitives (see vmath.h for
 * the algorithms and constants).  Included by simd.h after each per-type
 * pass of the mapping (FA_SFX f32, f64; VT, V, VC as there); defines
 *   V(exp), V(exp2), V(tanh) -> vf_exp, vf_exp2, vf_tanh, vd_exp, vd_exp2,
 *   vd_tanh. */
#define VPOLY(p, r, P) FA_PASTE(FA_HORNER_, VC(DEG))(VT, p, r, P)

static inline VT V(exp)(VT x)
{
    VT n = V(round)(V(mul)(x, V(set1)(VC(LOG2E))));
    VT r = V(fnma)(n, V(set1)(VC(LN2_HI)), x);
    r = V(fnma)(n, V(set1)(VC(LN2_LO)), r);
    VT p;
    VPOLY(p, r, VC(EXP_P));
    return V(ldexp_from)(p, n, x, VC(EXP_LO));
}

static inline VT V(exp2)(VT x)
{
#ifdef FA_SIMD_SCALEF /* ldexp exact for any n: no clamp, no exponent bits */
    VT n = V(round)(x), r = V(sub)(x, n), p;
    VPOLY(p, r, VC(EXP2_P));
    return V(ldexp_from)(p, n, x, VC(EXP2_LO));
#else
    x = V(max)(V(set1)(VC(EXP2_MIN)), x); /* NaN: max gives its 2nd operand */
    VT n = V(round)(x);
    VT r = V(sub)(x, n);
    VT p;
    VPOLY(p, r, VC(EXP2_P));
    return V(mul)(p, V(exp_bits)(V(add)(n, V(set1)(VC(EXP2_MAGIC)))));
#endif
}

/* tanh(|x|): a + a z R(z) for a = |x| < TANH_SMALL, else (1 - t) / (1 + t),
 * t = exp(-2a) (both computed, one chosen per lane, unless every lane is
 * small: the common case of soft-capped scores); then x's sign (tanh is
 * odd, so tanh(-0) = -0) */
static inline VT V(tanh)(VT x)
{
    const VT one = V(set1)((FA_T)1);
    VT ax = V(abs)(x), z = V(mul)(x, x), r;
    VC(TANH_R)(VT, r, z);
    VT small = V(fma)(V(mul)(ax, z), r, ax);
    if (V(all_below)(ax, VC(TANH_SMALL))) return V(copysign)(small, x);
    VT t = V(exp)(V(mul)(ax, V(set1)((FA_T)-2)));
    VT big = V(div)(V(sub)(one, t), V(add)(one, t));
    return V(copysign)(V(where_below)(small, big, ax, VC(TANH_SMALL)), x);
}

#undef VPOLY
