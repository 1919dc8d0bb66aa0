/* score_row_tmpl.h -- the score options of one row of scores, in registers:
 * the soft cap (softcap) and the soft cap and ALiBi fused in one pass
 * (score_row, on score_vec, the vector's operations, and score_row_any, its
 * loop with the options as constants).  Part of kernels_tmpl.h, included
 * there per element type and ISA (FA_SFX, FA_ISA_NAME; FN, FA_T, V, VC, VT,
 * VW): FN(softcap) -> softcap_f32_avx2, softcap_f64_generic, ...;
 * FN(score_vec) -> score_vec_f32_avx512, ...; FN(score_row_any) ->
 * score_row_any_f32_neon, ...; FN(score_row) -> score_row_f64_avx2, ... */

/* One vector of softcap: x = vc tanh(x vi), and where f, its derivative
 * 1 - t t, t = x vi of the capped x (a product, then a difference: no
 * fused step, the bits of the C expression). */
static FA_ALWAYS_INLINE void FN(softcap_vec)(FA_T *x, FA_T *f, VT vc, VT vi)
{
    const VT y = V(mul)(vc, V(tanh)(V(mul)(V(load)(x), vi)));
    V(store)(x, y);
    if (f) {
        const VT t = V(mul)(y, vi);
        V(store)(f, V(sub)(V(set1)((FA_T)1), V(mul)(t, t)));
    }
}

/* x[i] = cap tanh(x[i] / cap) for i < n: the soft cap of the scores (cap
 * > 0; x[i] / cap as x[i] * (1 / cap); cap = 1 is plain tanh, exactly);
 * f: see kernels.h.  The tail through a padded vector, so every element
 * sees the same tanh. */
static void FN(softcap)(FA_T *x, FA_T *f, int64_t n, FA_T cap)
{
    const VT vc = V(set1)(cap), vi = V(set1)((FA_T)1 / cap);
    int64_t i = 0;
    if (f)
        for (; i + VW <= n; i += VW) FN(softcap_vec)(x + i, f + i, vc, vi);
    else
        for (; i + VW <= n; i += VW) FN(softcap_vec)(x + i, NULL, vc, vi);
    if (i < n) {
        FA_T buf[VW], fb[VW];
        for (int64_t j = 0; j < VW; j++) buf[j] = i + j < n ? x[i + j] : (FA_T)0;
        FN(softcap_vec)(buf, f ? fb : NULL, vc, vi);
        for (int64_t j = 0; i + j < n; j++) {
            x[i + j] = buf[j];
            if (f) f[i + j] = fb[j];
        }
    }
}

/* One vector of scores x at key positions j (relative to the row's first
 * key): the soft cap (do_cap: vc tanh(x vi), vi = 1 / vc), then ALiBi
 * (do_al: x -= vs |vp - j|, exact distances), as the reference orders them.
 * With vmath_tmpl.h's tanh, the cap of a lane with y = x vi, y^2 <
 * TANH_SMALL^2 (tanh's small branch, see simd/vmath.h) is x + x z R(z),
 * z = y^2: c tanh(y) = c y (1 + z R(z)) without the round trip through y;
 * of any other lane vc tanh(y).  Each
 * lane's result depends on its own score only (the vector's other lanes
 * choose no branch for it). */
static FA_ALWAYS_INLINE VT FN(score_vec)(VT x, VT j, int do_cap, VT vc, VT vi, int do_al, VT vp,
                                         VT vs)
{
#ifdef FA_SIMD_LIBM_EXP /* the C library's tanh (generic): no branch of ours */
    if (do_cap) x = V(mul)(vc, V(tanh)(V(mul)(x, vi)));
#else
    if (do_cap) {
        const FA_T small2 = VC(TANH_SMALL) * VC(TANH_SMALL); /* exact: 0.390625 */
        const VT y = V(mul)(x, vi), z = V(mul)(y, y);
        VT r;
        VC(TANH_R)(VT, r, z);
        const VT near0 = V(fma)(V(mul)(x, z), r, x);
        x = V(all_below)(z, small2) ? near0
                                    : V(where_below)(near0, V(mul)(vc, V(tanh)(y)), z, small2);
    }
#endif
    if (do_al) x = V(fnma)(vs, V(abs)(V(sub)(vp, j)), x);
    return x;
}

/* score_row with do_cap and do_al constants (inlined three ways below). */
static FA_ALWAYS_INLINE void FN(score_row_any)(FA_T *x, int64_t n, FA_T cap, FA_T p, FA_T slope,
                                               FA_T *vmax, int do_cap, int do_al)
{
    FA_T lane[VW];
    for (int64_t l = 0; l < VW; l++) lane[l] = (FA_T)l;
    const VT vc = V(set1)(cap), vi = V(set1)(do_cap ? (FA_T)1 / cap : (FA_T)1);
    const VT vs = V(set1)(slope), vp = V(set1)(p), step = V(set1)((FA_T)VW);
    VT j = V(load)(lane), mx = V(set1)((FA_T)-INFINITY);
    int64_t i = 0;
    for (; i + VW <= n; i += VW, j = V(add)(j, step)) {
        const VT y = FN(score_vec)(V(load)(x + i), j, do_cap, vc, vi, do_al, vp, vs);
        V(store)(x + i, y);
        mx = V(max_acc)(mx, y);
    }
    if (i < n) { /* the tail through a padded vector: the same operations */
        FA_T buf[VW];
        for (int64_t l = 0; l < VW; l++) buf[l] = i + l < n ? x[i + l] : (FA_T)0;
        V(store)(buf, FN(score_vec)(V(load)(buf), j, do_cap, vc, vi, do_al, vp, vs));
        for (int64_t l = 0; l < VW; l++) {
            if (i + l < n) x[i + l] = buf[l];
            else buf[l] = (FA_T)-INFINITY;
        }
        mx = V(max_acc)(mx, V(load)(buf));
    }
    if (vmax) V(store)(vmax, mx);
}

/* x[j] = cap tanh(x[j] / cap) if cap > 0, then x[j] -= slope |p - j| if
 * slope != 0, for j < n, in one pass (p integral, |p| + n exact in FA_T);
 * vmax NULL or [VW]: the lane-wise max of the results, NaN ignored. */
static void FN(score_row)(FA_T *x, int64_t n, FA_T cap, FA_T p, FA_T slope, FA_T *vmax)
{
    if (cap > 0 && slope != 0)
        FN(score_row_any)(x, n, cap, p, slope, vmax, 1, 1);
    else if (cap > 0)
        FN(score_row_any)(x, n, cap, p, slope, vmax, 1, 0);
    else if (slope != 0)
        FN(score_row_any)(x, n, cap, p, slope, vmax, 0, 1);
    else
        FN(score_row_any)(x, n, cap, p, slope, vmax, 0, 0);
}
