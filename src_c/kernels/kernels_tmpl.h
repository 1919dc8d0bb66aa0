/* kernels_tmpl.h -- the micro-kernels, written once over simd/simd.h.
 *
 * Included by kernels_isa.c once per element type with FA_SFX (f32, f64)
 * defined; kernels_isa.c is compiled with the ISA's flags (setup.py).  Ends
 * with the table fa_kernels_<FA_SFX>_<FA_ISA_NAME>.  Every function is named
 * FN(name) -> name_<FA_SFX>_<FA_ISA_NAME>, e.g. FN(qk) -> qk_f32_avx2,
 * qk_f64_avx512, online_softmax_f32_generic, expsum2_f64_avx2, ...
 */
#define FN(name) FA_CAT3(name, FA_SFX, FA_ISA_NAME)
#define FA_T FA_TYPE(FA_SFX)                   /* float, double */
#define V(op) FA_CAT(FA_VEC(FA_SFX), op)       /* V(fma) -> vf_fma, vd_fma */
#define VC(name) FA_CAT(FA_VECU(FA_SFX), name) /* VC(MR) -> VF_MR, VD_MR */
#define VT FA_VEC(FA_SFX)                      /* the vector type: vf, vd */
#define VW VC(W)                               /* its lanes */
#define MR VC(MR)                              /* register tile: MR rows x NRV vectors */
#define NRV VC(NRV)
#define NR (NRV * VW)                          /* keys of a register tile */
#define PV_MR VC(PV_MR)                        /* rows of a P.V register tile */
/* A key block (FA_KC, blocking.h) is whole NR-key panels: qk and pack_k
 * step through it NR keys at a time.  FN(kc_whole_panels) ->
 * kc_whole_panels_f32_neon, ...: an array of negative size otherwise. */
typedef char FN(kc_whole_panels)[FA_KC % NR == 0 ? 1 : -1];

/* The register tile of Q.K^T and P.V: c[R x NR] = (zero ? 0 : c) +
 * a[R x K] . b[K x NR], a[r][k] at a + r*lda + k*ak, b rows of NR (ld
 * ldb), c row-major (ld ldc).  With vmax (R x VW), vmax[r] = lane-wise max(vmax[r],
 * row r of c), NaN ignored: the row max comes out of the registers, not a
 * pass over c.  Always inlined with a constant R <= max(MR, PV_MR) and
 * zero, so acc is R x NRV registers. */
static FA_ALWAYS_INLINE void FN(tile)(int R, int zero, int64_t K, const FA_T *restrict a,
                                      int64_t lda, int64_t ak, const FA_T *restrict b, int64_t ldb,
                                      FA_T *restrict c, int64_t ldc, FA_T *restrict vmax)
{
    VT acc[MR > PV_MR ? MR : PV_MR][NRV];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) acc[r][v] = zero ? V(zero)() : V(load)(c + r * ldc + v * VW);
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        VT bv[NRV];
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) bv[v] = V(load)(b + k * ldb + v * VW);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            VT ab = V(set1)(a[r * lda + k * ak]);
#pragma GCC unroll 4
            for (int v = 0; v < NRV; v++) acc[r][v] = V(fma)(ab, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) V(store)(c + r * ldc + v * VW, acc[r][v]);
    if (vmax) {
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            VT mx = V(load)(vmax + r * VW);
#pragma GCC unroll 4
            for (int v = 0; v < NRV; v++) mx = V(max_acc)(mx, acc[r][v]);
            V(store)(vmax + r * VW, mx);
        }
    }
}

static void FN(qk)(int64_t rows, int64_t ncols, int64_t E, const FA_T *qp, const FA_T *kp,
                   FA_T *s, int64_t lds, FA_T *vmax)
{
    if (vmax)
        for (int64_t i = 0; i < rows * VW; i++) vmax[i] = (FA_T)-INFINITY;
    for (int64_t p = 0; p < ncols / NR; p++) {
        const FA_T *panel = kp + p * E * NR;
        for (int64_t i = 0; i < rows; i += MR)
            FN(tile)(MR, 1, E, qp + i * E, E, 1, panel, NR, s + i * lds + p * NR, lds,
                     vmax ? vmax + i * VW : NULL);
    }
}

#include "kernels/pv_tmpl.h" /* pv and pvt (P^T.V of the backward) on the tile above */

/* has_nan NULL: no NaN detection (the streaming path finds NaN in the sum). */
static FA_T FN(rowmax)(const FA_T *x, int64_t n, int *has_nan)
{
    VT m0 = V(set1)(-INFINITY), m1 = m0;
    VT bad = V(zero)(); /* NaN (or all-ones bits, on AVX2) in the lanes that saw a NaN */
    int64_t i = 0;
    if (has_nan) {
        for (; i + 2 * VW <= n; i += 2 * VW) {
            VT a = V(load)(x + i), b = V(load)(x + i + VW);
            m0 = V(max_acc)(m0, a);
            m1 = V(max_acc)(m1, b);
            bad = V(nan_acc)(V(nan_acc)(bad, a), b);
        }
    } else {
        for (; i + 2 * VW <= n; i += 2 * VW) {
            m0 = V(max_acc)(m0, V(load)(x + i));
            m1 = V(max_acc)(m1, V(load)(x + i + VW));
        }
    }
    FA_T m = V(hmax)(V(max_acc)(m0, m1));
    FA_T sbad = V(hsum)(bad);
    for (; i < n; i++) {
        if (x[i] > m) m = x[i];
        if (x[i] != x[i]) sbad = x[i];
    }
    if (has_nan && sbad != sbad) *has_nan = 1;
    return m;
}

/* y[i] = E(x[i] - m), returning the sum: E = exp for softmax and the
 * weights, exp2 (base2) for the streaming attention (scores in log2 units).
 * Inlined, base2 a constant, into expsum and expsum2, and these into
 * online_softmax, though the table holds their addresses. */
static FA_ALWAYS_INLINE VT FN(exp_any)(VT x, int base2) { return base2 ? V(exp2)(x) : V(exp)(x); }

/* y[i] = E(x[i] - m) for i < n; returns the sums' vector (lane l: the sum
 * of the y[i] with i mod 2 VW = l or l + VW) */
static FA_ALWAYS_INLINE VT FN(expsum_lanes)(const FA_T *x, FA_T *y, int64_t n, FA_T m, int base2)
{
    VT vm = V(set1)(m), s0 = V(zero)(), s1 = V(zero)();
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        VT a = FN(exp_any)(V(sub)(V(load)(x + i), vm), base2);
        VT b = FN(exp_any)(V(sub)(V(load)(x + i + VW), vm), base2);
        V(store)(y + i, a);
        V(store)(y + i + VW, b);
        s0 = V(add)(s0, a);
        s1 = V(add)(s1, b);
    }
    if (i < n) { /* tail through a padded vector: every element sees the same exp */
        FA_T buf[2 * VW];
        int64_t t = n - i;
        for (int64_t j = 0; j < 2 * VW; j++) buf[j] = j < t ? x[i + j] : (FA_T)-INFINITY;
        VT a = FN(exp_any)(V(sub)(V(load)(buf), vm), base2);
        VT b = FN(exp_any)(V(sub)(V(load)(buf + VW), vm), base2);
        V(store)(buf, a);
        V(store)(buf + VW, b);
        for (int64_t j = 0; j < t; j++) y[i + j] = buf[j];
        s0 = V(add)(s0, a);
        s1 = V(add)(s1, b);
    }
    return V(add)(s0, s1);
}

static FA_ALWAYS_INLINE FA_T FN(expsum_any)(const FA_T *x, FA_T *y, int64_t n, FA_T m,
                                            int base2)
{
    return V(hsum)(FN(expsum_lanes)(x, y, n, m, base2));
}

static FA_ALWAYS_INLINE FA_T FN(expsum)(const FA_T *x, FA_T *y, int64_t n, FA_T m)
{
    return FN(expsum_any)(x, y, n, m, 0);
}

static FA_ALWAYS_INLINE FA_T FN(expsum2)(const FA_T *x, FA_T *y, int64_t n, FA_T m)
{
    return FN(expsum_any)(x, y, n, m, 1);
}

/* P and dS of VW keys of a backward row (grad_row): p = exp(min(0, s - l)),
 * ds = p (ds - d), times f and 0 where p is 0 if f; bad accumulates NaN
 * where some dS is NaN or Inf.  exp gives 0 or a normal number, so p < the
 * least normal is p = 0 (whatever the denormals mode). */
static FA_ALWAYS_INLINE VT FN(grad_lanes)(FA_T *s, FA_T *ds, const FA_T *f, VT l, VT d, VT bad)
{
    const VT p = V(exp)(V(min)(V(zero)(), V(sub)(V(load)(s), l))); /* NaN kept: min's 2nd */
    VT r = V(mul)(p, V(sub)(V(load)(ds), d));
    if (f) r = V(where_below)(V(zero)(), V(mul)(r, V(load)(f)), p, FA_TYPE_MIN(FA_SFX));
    V(store)(s, p);
    V(store)(ds, r);
    return V(add)(bad, V(mul)(r, V(zero)()));
}

/* grad_row over whole vectors j < n - n % VW, with f or without (fv: the
 * compiler's copy of the loop for each). */
static FA_ALWAYS_INLINE VT FN(grad_vectors)(FA_T *s, FA_T *ds, const FA_T *f, int fv, int64_t n,
                                            VT vl, VT vdel)
{
    VT bad = V(zero)();
    for (int64_t j = 0; j + VW <= n; j += VW)
        bad = FN(grad_lanes)(s + j, ds + j, fv ? f + j : NULL, vl, vdel, bad);
    return bad;
}

/* One row of a backward pair in one pass: s[j] = P = exp(min(0, s[j] - l)),
 * which is expsum's exp(s[j] - l) where s[j] <= l and exactly 1 above (P
 * never above 1; NaN kept), ds[j] = P (ds[j] - d) (ds holding dP), with f
 * (a soft cap's factor) P (ds[j] - d) f[j] where P is not 0, else 0, j < n;
 * without f, 1 if some dS is NaN or Inf.  The tail runs through a padded
 * vector (s -inf, ds 0, f 0: P = 0 there, and dS NaN only where d is not
 * finite, which a real key's dS is then too). */
static int FN(grad_row)(FA_T *s, FA_T *ds, const FA_T *f, int64_t n, FA_T l, FA_T d)
{
    const VT vl = V(set1)(l), vdel = V(set1)(d);
    VT bad = f ? FN(grad_vectors)(s, ds, f, 1, n, vl, vdel)
               : FN(grad_vectors)(s, ds, NULL, 0, n, vl, vdel);
    const int64_t j = n - n % VW;
    if (j < n) {
        FA_T bs[VW], bd[VW], bf[VW];
        const int64_t t = n - j;
        for (int64_t i = 0; i < VW; i++) {
            bs[i] = i < t ? s[j + i] : (FA_T)-INFINITY;
            bd[i] = i < t ? ds[j + i] : 0;
            bf[i] = f && i < t ? f[j + i] : 0;
        }
        bad = FN(grad_lanes)(bs, bd, f ? bf : NULL, vl, vdel, bad);
        for (int64_t i = 0; i < t; i++) s[j + i] = bs[i], ds[j + i] = bd[i];
    }
    return !f && V(hsum)(bad) != 0;
}

static void FN(scal)(FA_T *x, int64_t n, FA_T a)
{
    VT va = V(set1)(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V(store)(x + i, V(mul)(V(load)(x + i), va));
    for (; i < n; i++) x[i] *= a;
}

#include "kernels/score_row_tmpl.h" /* softcap, score_row: the soft cap and ALiBi of a row */

/* One key block of the streaming (online) softmax, over the rows of a score
 * tile s[rows x n] (ld lds) and their running max m, lane-wise sums lv
 * [rows x VW] and output o: per row i, mn = max(m[i], max_j s[i][j]) (NaN
 * ignored), a = E(m[i] - mn), s[i][j] = E(s[i][j] - mn), lv[i] = lv[i] * a
 * + the lanes of sum_j s[i][j] (expsum_lanes), o[i][0 .. ldo) *= a, m[i] =
 * mn; E = 2^x (base2: scores in log2 units) or e^x.  The row's sum l[i] is
 * the sum of lv[i]'s lanes, taken once after the last block: no horizontal
 * sum per block.  A row with no visible key yet (mn = -inf) is zeroed
 * instead, lv[i] = NaN if it holds a NaN.  vmax: NULL, or the rows'
 * lane-wise maxima from qk (max_j s[i][j] = hmax(vmax[i])); a row whose
 * lanes are all below m[i] keeps it with no horizontal max (the common case
 * once a row has seen a few blocks).  The rescaling factors of VW rows are
 * one vector exp. */
static void FN(online_softmax)(int64_t rows, int64_t n, FA_T *s, int64_t lds, FA_T *m, FA_T *lv,
                               FA_T *o, int64_t ldo, int base2, const FA_T *vmax)
{
    for (int64_t g = 0; g < rows; g += VW) {
        const int64_t ng = rows - g < VW ? rows - g : VW;
        FA_T mn[VW], d[VW], a[VW];
        for (int64_t r = 0; r < VW; r++) d[r] = 0;
        for (int64_t r = 0; r < ng; r++) {
            const FA_T mo = m[g + r];
            mn[r] = mo;
            if (vmax && V(all_below)(V(load)(vmax + (g + r) * VW), mo)) continue;
            const FA_T mx = vmax ? V(hmax)(V(load)(vmax + (g + r) * VW))
                                 : FN(rowmax)(s + (g + r) * lds, n, NULL);
            if (mx > mo) mn[r] = mx;
            if (mn[r] != mo) d[r] = mo - mn[r]; /* < 0; -inf for a first visible key */
        }
        V(store)(a, base2 ? V(exp2)(V(load)(d)) : V(exp)(V(load)(d)));
        for (int64_t r = 0; r < ng; r++) {
            const int64_t i = g + r;
            FA_T *row = s + i * lds, *li = lv + i * VW;
            if (mn[r] == (FA_T)-INFINITY) {
                for (int64_t j = 0; j < n; j++)
                    if (row[j] != row[j]) { li[0] = (FA_T)NAN; break; }
                memset(row, 0, (size_t)n * sizeof(FA_T));
                continue;
            }
            const VT sum = FN(expsum_lanes)(row, row, n, mn[r], base2);
            VT l0 = V(load)(li);
            if (d[r] != 0) {
                FN(scal)(o + i * ldo, ldo, a[r]);
                l0 = V(mul)(l0, V(set1)(a[r]));
            }
            V(store)(li, V(add)(l0, sum));
            m[i] = mn[r];
        }
    }
}

/* l[i] = the sum of lv[i]'s VW lanes (online_softmax's lane-wise sums), in
 * lane order, for i < rows */
static void FN(lane_sums)(int64_t rows, const FA_T *lv, FA_T *l)
{
    for (int64_t i = 0; i < rows; i++) {
        FA_T t = lv[i * VW];
        for (int64_t j = 1; j < VW; j++) t += lv[i * VW + j];
        l[i] = t;
    }
}

/* Packing (see kernels.h): K panels by TB x TB block transposes, V panels by
 * whole-vector copies that also watch for NaN/Inf (x - x is NaN only then). */
static void FN(pack_k)(int64_t nk, int64_t ncols, int64_t E, const FA_T *k, int64_t krs,
                       FA_T *kp)
{
    const int64_t Eb = E / VC(TB) * VC(TB);
    for (int64_t j0 = 0; j0 < ncols; j0 += NR) {
        FA_T *pan = kp + (j0 / NR) * E * NR;
        int64_t jb = 0;
        for (; jb + VC(TB) <= NR && j0 + jb + VC(TB) <= nk; jb += VC(TB)) {
            const FA_T *src = k + (j0 + jb) * krs;
            for (int64_t d = 0; d < Eb; d += VC(TB)) V(transpose_block)(src + d, krs, pan + d * NR + jb, NR);
            for (int64_t d = Eb; d < E; d++)
                for (int64_t i = 0; i < VC(TB); i++) pan[d * NR + jb + i] = src[i * krs + d];
        }
        for (; jb < NR; jb++) { /* the last keys one at a time, zeros past nk */
            FA_T *dst = pan + jb;
            if (j0 + jb < nk) {
                const FA_T *src = k + (j0 + jb) * krs;
                for (int64_t d = 0; d < E; d++) dst[d * NR] = src[d];
            } else {
                for (int64_t d = 0; d < E; d++) dst[d * NR] = 0;
            }
        }
    }
}

/* the direct P.V and the vp panels (kernels.h) from FA_T values */
#define DV_NAME FN(pv_direct) /* pv_direct_f32_avx2, pv_direct_f64_generic, ... */
#define PV_NAME FN(pack_v)    /* pack_v_f32_avx2, pack_v_f64_generic, ... */
#define PV_SRC FA_T
#define PV_LOAD V(load)
#define PV_TO(x) (x)
#include "kernels/pv_direct_tmpl.h"
#include "kernels/pack_v_tmpl.h"

/* the direct decoding kernels over a block's row pointers, FA_T rows */
#define DR(name) FN(name)    /* qk_tile_f32_avx2, pv_tile_f64_generic, ... */
#define DR_QK FN(qk_rows)    /* qk_rows_f32_avx2, qk_rows_f64_generic, ... */
#define DR_QKD FN(qk_direct) /* qk_direct_f32_avx512, ... */
#define DR_PV FN(pv_rows)    /* pv_rows_f32_avx2, ... */
#define DR_SRC FA_T
#define DR_LOAD V(load)
#define DR_TO(x) (x)
#define DR_WIDEN 0
#include "kernels/decode_rows_tmpl.h"

/* acc[c] = acc[c] * x + y, n times per chain: a contraction towards
 * y / (1 - x), so the values stay finite for any n. */
static FA_T FN(fma_probe)(int64_t n)
{
    VT acc[FA_PROBE_CHAINS];
    const VT x = V(set1)((FA_T)0.999), y = V(set1)((FA_T)0.001);
#pragma GCC unroll 16
    for (int c = 0; c < FA_PROBE_CHAINS; c++) acc[c] = V(set1)((FA_T)c);
    for (int64_t i = 0; i < n; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < FA_PROBE_CHAINS; c++) acc[c] = V(fma)(acc[c], x, y);
    }
    VT s = acc[0];
#pragma GCC unroll 16
    for (int c = 1; c < FA_PROBE_CHAINS; c++) s = V(add)(s, acc[c]);
    return V(hsum)(s);
}

#if !FA_IS_F64(FA_SFX)
/* The 16-bit storage kernels, once per storage type: HN(name) ->
 * name_f16_<FA_ISA_NAME>, name_bf16_<FA_ISA_NAME> */
#define FA_HSFX f16
#include "kernels/kernels_half_tmpl.h" /* pack_k_f16_avx2, qk_direct_f16_avx512, ... */
#undef FA_HSFX
#define FA_HSFX bf16
#include "kernels/kernels_half_tmpl.h" /* pack_k_bf16_avx2, ... */
#undef FA_HSFX
#define FA_HALF_ENTRIES(name) {FA_CAT3(name, f16, FA_ISA_NAME), FA_CAT3(name, bf16, FA_ISA_NAME)}
#define FA_ROWS_ENTRIES(name) {FN(name), FA_CAT3(name, f16, FA_ISA_NAME), FA_CAT3(name, bf16, FA_ISA_NAME)}
#else
#define FA_HALF_ENTRIES(name) {NULL, NULL}
#define FA_ROWS_ENTRIES(name) {FN(name), NULL, NULL}
#endif
#if !FA_IS_F64(FA_SFX) && defined(FA_DECODE_DP16) /* (kernels_isa.c) */
#define FA_DECODE_DP16_ENTRIES                                                             \
    FA_CAT3(qk_rows, dp16, FA_ISA_NAME), FA_CAT3(pv_rows, dp16, FA_ISA_NAME), FA_DECODE_F32Q
#else
#define FA_DECODE_DP16_ENTRIES NULL, NULL, 0
#endif

/* The table of this ISA and element type (kernels.h):
 * FA_CAT3(fa_kernels, FA_SFX, FA_ISA_NAME) -> fa_kernels_f32_avx2, ... */
const FA_CAT(fa_kernels, FA_SFX) FA_CAT3(fa_kernels, FA_SFX, FA_ISA_NAME) = {
    FA_STR(FA_ISA_NAME), MR, NR, VW,
    FN(qk), FN(pv), FN(qk_direct), FN(pv_direct), FN(rowmax), FN(expsum), FN(expsum2),
    FN(scal), FN(online_softmax), FN(lane_sums), FN(pack_k), FN(pack_v), FN(fma_probe), FN(softcap),
    FN(score_row), FA_HALF_ENTRIES(pack_k), FA_HALF_ENTRIES(pack_v), FA_HALF_ENTRIES(qk_direct),
    FA_HALF_ENTRIES(pv_direct), FA_HALF_ENTRIES(widen), FA_HALF_ENTRIES(narrow),
    FA_ROWS_ENTRIES(qk_rows), FA_ROWS_ENTRIES(pv_rows), FA_DECODE_DP16_ENTRIES,
#if !FA_IS_F64(FA_SFX)
    FA_F32_ONLY_ENTRIES, /* (kernels_isa.c) */
#endif
    FN(pvt), FN(grad_row),
};
#undef FA_HALF_ENTRIES
#undef FA_ROWS_ENTRIES
#undef FA_DECODE_DP16_ENTRIES

#undef FN
#undef FA_T
#undef V
#undef VC
#undef VT
#undef VW
#undef MR
#undef NRV
#undef NR
#undef PV_MR
