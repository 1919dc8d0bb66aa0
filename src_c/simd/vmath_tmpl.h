/* vmath_tmpl.h -- exp and exp2 over a mapping's primitives (see vmath.h for
 * the algorithms and constants).  Included by simd.h once per element type
 * with FA_T (float/double), FA_VP (vf/vd: the mapping's prefix) and FA_VPU
 * (VF/VD: its constants' prefix) defined; defines
 *   V(exp), V(exp2) -> vf_exp, vf_exp2, vd_exp, vd_exp2. */
#define V(op) FA_CAT(FA_VP, op)
#define VC(name) FA_CAT(FA_VPU, name)
#define VPOLY(p, r, P) FA_PASTE(FA_HORNER_, VC(DEG))(FA_VP, p, r, P)

static inline FA_VP V(exp)(FA_VP x)
{
    FA_VP n = V(round)(V(mul)(x, V(set1)(VC(LOG2E))));
    FA_VP r = V(fnma)(n, V(set1)(VC(LN2_HI)), x);
    r = V(fnma)(n, V(set1)(VC(LN2_LO)), r);
    FA_VP p;
    VPOLY(p, r, VC(EXP_P));
    return V(zero_below)(V(ldexp)(p, n), x, VC(EXP_LO));
}

static inline FA_VP V(exp2)(FA_VP x)
{
    x = V(max)(V(set1)(VC(EXP2_MIN)), x); /* NaN: max gives its 2nd operand */
    FA_VP n = V(round)(x);
    FA_VP r = V(sub)(x, n);
    FA_VP p;
    VPOLY(p, r, VC(EXP2_P));
    return V(mul)(p, V(exp_bits)(V(add)(n, V(set1)(VC(EXP2_MAGIC)))));
}

#undef V
#undef VC
#undef VPOLY
