/* vmath_tmpl.h -- exp and exp2 over a mapping's primitives (see vmath.h for
 * the algorithms and constants).  Included by simd.h after each per-type
 * pass of the mapping (FA_SFX f32, f64; VT, V, VC as there); defines
 *   V(exp), V(exp2) -> vf_exp, vf_exp2, vd_exp, vd_exp2. */
#define VPOLY(p, r, P) FA_PASTE(FA_HORNER_, VC(DEG))(VT, p, r, P)

static inline VT V(exp)(VT x)
{
    VT n = V(round)(V(mul)(x, V(set1)(VC(LOG2E))));
    VT r = V(fnma)(n, V(set1)(VC(LN2_HI)), x);
    r = V(fnma)(n, V(set1)(VC(LN2_LO)), r);
    VT p;
    VPOLY(p, r, VC(EXP_P));
    return V(zero_below)(V(ldexp)(p, n), x, VC(EXP_LO));
}

static inline VT V(exp2)(VT x)
{
    x = V(max)(V(set1)(VC(EXP2_MIN)), x); /* NaN: max gives its 2nd operand */
    VT n = V(round)(x);
    VT r = V(sub)(x, n);
    VT p;
    VPOLY(p, r, VC(EXP2_P));
    return V(mul)(p, V(exp_bits)(V(add)(n, V(set1)(VC(EXP2_MAGIC)))));
}

#undef VPOLY
