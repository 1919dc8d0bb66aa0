/* bw16.h -- the 16-bit backward's kernels (contract: kernels.h,
 * fa_bw16_kernels): one product on the matrix instructions, a float32
 * transpose, the step from scores and dP to P and dS rounded to their
 * operands, the pair interleave and the transpose of 16-bit rows, and the
 * rows' dot products of D.  Over simd/bf16_tiles.h and simd/flash16_ops.h;
 * included by kernels_isa.c where the mapping defines FA_SIMD_BF16 on x86
 * (amx: tiles, avx512_bf16: VDPBF16PS on registers).
 * BW(name) -> bw16_<name>_<isa>: bw16_gemm_amx, bw16_grad_pair_avx512_bf16, ... */
#define BW(name) FA_CAT3(bw16, name, FA_ISA_NAME)

#if defined(FA_SIMD_AMX)
#if defined(FA_AMX_FP16)
#define BW_DP(f16, tf, c, a, b)                                                                \
    do {                                                                                       \
        if (f16) FT_DP_F16(tf, c, a, b); else FT_DP(tf, c, a, b);                             \
    } while (0)
#else
#define BW_DP(f16, tf, c, a, b) FT_DP(tf, c, a, b)
#endif
/* C tiles 0-3 (2 x 2 tiles of 16 x 16 float32: rows i0.., columns j0..),
 * A tiles 4-5 (16 rows x 16 pairs of a), B tiles 6-7 (16 pair rows x 16
 * columns of b); a tile of the 2 x 2 block past m or n is left out. */
static void BW(gemm)(void *tfv, int f16, int zero, int64_t m, int64_t n, int64_t k,
                     const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                     int64_t ldc)
{
    fa_tilefile *tf = (fa_tilefile *)tfv;
    (void)tf, (void)f16;
    const int64_t ab = lda * 2, bb = ldb * 2, cb = ldc * 4;
    for (int64_t i0 = 0; i0 < m; i0 += 2 * FT_ROWS)
        for (int64_t j0 = 0; j0 < n; j0 += 2 * FT_ROWS) {
            const int ti = i0 + FT_ROWS < m, tj = j0 + FT_ROWS < n;
            float *c0 = c + i0 * ldc + j0, *c1 = c0 + FT_ROWS * ldc;
            if (zero) {
                FT_ZERO(tf, 0);
                FT_ZERO(tf, 1);
                FT_ZERO(tf, 2);
                FT_ZERO(tf, 3);
            } else {
                FT_LOAD(tf, 0, c0, cb);
                if (tj) FT_LOAD(tf, 1, c0 + FT_ROWS, cb);
                if (ti) FT_LOAD(tf, 2, c1, cb);
                if (ti && tj) FT_LOAD(tf, 3, c1 + FT_ROWS, cb);
            }
            for (int64_t kk = 0; kk < k; kk += 2 * FT_ROWS) {
                const uint16_t *a0 = a + i0 * lda + kk, *b0 = b + kk / 2 * ldb + 2 * j0;
                FT_LOAD(tf, 4, a0, ab);
                FT_LOAD(tf, 6, b0, bb);
                BW_DP(f16, tf, 0, 4, 6);
                if (tj) { FT_LOAD(tf, 7, b0 + 2 * FT_ROWS, bb); BW_DP(f16, tf, 1, 4, 7); }
                if (ti) { FT_LOAD(tf, 5, a0 + FT_ROWS * lda, ab); BW_DP(f16, tf, 2, 5, 6); }
                if (ti && tj) BW_DP(f16, tf, 3, 5, 7);
            }
            FT_STORE(tf, 0, c0, cb);
            if (tj) FT_STORE(tf, 1, c0 + FT_ROWS, cb);
            if (ti) FT_STORE(tf, 2, c1, cb);
            if (ti && tj) FT_STORE(tf, 3, c1 + FT_ROWS, cb);
        }
}
#undef BW_DP
#else
/* avx512_bf16: a register tile of FA_DP16_ROWS rows of c x nv (1 or 2)
 * vectors of 16 columns, each lane one VDPBF16PS chain over the pairs in
 * order (from 0 where zero): per pair, nv rows of b loaded and a row's pair
 * broadcast. */
static FA_ALWAYS_INLINE void BW(tile)(int nv, int zero, int64_t k, const uint16_t *a,
                                      int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                                      int64_t ldc)
{
    vf acc[FA_DP16_ROWS][2];
    for (int r = 0; r < FA_DP16_ROWS; r++)
        for (int v = 0; v < nv; v++)
            acc[r][v] = zero ? vf_zero() : vf_load(c + r * ldc + v * M16_W);
    for (int64_t p = 0; p < k / 2; p++) {
        const m16_vi b0 = m16_load(b + p * ldb), b1 = nv > 1 ? m16_load(b + p * ldb + 2 * M16_W) : b0;
        for (int r = 0; r < FA_DP16_ROWS; r++) {
            const m16_vi x = m16_bcast_pair(a + r * lda + 2 * p);
            acc[r][0] = fa_dpbf16(acc[r][0], x, b0);
            if (nv > 1) acc[r][1] = fa_dpbf16(acc[r][1], x, b1);
        }
    }
    for (int r = 0; r < FA_DP16_ROWS; r++)
        for (int v = 0; v < nv; v++) vf_store(c + r * ldc + v * M16_W, acc[r][v]);
}

static void BW(gemm)(void *tf, int f16, int zero, int64_t m, int64_t n, int64_t k,
                     const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                     int64_t ldc)
{
    (void)tf, (void)f16;
    for (int64_t i0 = 0; i0 < m; i0 += FA_DP16_ROWS) {
        const uint16_t *ai = a + i0 * lda;
        float *ci = c + i0 * ldc;
        int64_t j0 = 0;
        for (; j0 + 2 * M16_W <= n; j0 += 2 * M16_W)
            if (zero) BW(tile)(2, 1, k, ai, lda, b + 2 * j0, ldb, ci + j0, ldc);
            else BW(tile)(2, 0, k, ai, lda, b + 2 * j0, ldb, ci + j0, ldc);
        if (j0 < n) BW(tile)(1, zero, k, ai, lda, b + 2 * j0, ldb, ci + j0, ldc);
    }
}
#endif

/* grad_pair's slow path: y pair row p = rows 2p, 2p + 1 of x rounded,
 * side by side per column */
static void BW(pairs)(int f16, const float *x, int64_t ldx, int64_t rows, int64_t n, uint16_t *y,
                      int64_t ldy)
{
    for (int64_t p = 0; p < rows / 2; p++) {
        const float *x0 = x + 2 * p * ldx, *x1 = x0 + ldx;
        for (int64_t j = 0; j < n; j += M16_W)
            m16_store(y + p * ldy + 2 * j, m16_pairs(f16, vf_load(x1 + j), vf_load(x0 + j)));
    }
}

/* grad_pair's slow path: y row i = row i of x rounded */
static void BW(rows)(int f16, const float *x, int64_t ldx, int64_t rows, int64_t n, uint16_t *y,
                     int64_t ldy)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j += 2 * M16_W)
            m16_store(y + i * ldy + j,
                      m16_cvt2(f16, vf_load(x + i * ldx + j + M16_W), vf_load(x + i * ldx + j)));
}

/* P and dS of one vector of a live row (kernels.h: grad_pair); with the
 * soft cap's derivative f, dS is 0 wherever P is (P below the least
 * subnormal, 2^-149: P = 0; NaN kept).  bad sums dS: not finite if a dS
 * is NaN or Inf (or, harmlessly, where the sum overflows: the slow path
 * then computes what the fast one would, up to the sign of a zero).  w:
 * P = 2^(s vc - vl) by the forward's weights' exp2 (vc, vl in base 2),
 * else e^(s vc - vl) by the table's exp. */
static FA_ALWAYS_INLINE void BW(grad_vec)(int w, const float *s, const float *ds, const float *f,
                                          vf vc, vf vl, vf vd, vf *p, vf *r, vf *bad)
{
    /* s vc - vl is <= 0 but for rounding, which at scores of ~1e9 would
     * overflow P: P is never above 1 (one rounding: vl is lse, not a rounded
     * product, so there is no exact 0 to keep as the forward's m16_mulsub
     * keeps its maximum's) */
    const vf x = m16_nonpos(m16_fmsub(vf_load(s), vc, vl));
    *p = w ? m16_exp2w(x) : vf_exp(x);
    vf d = vf_mul(*p, vf_sub(vf_load(ds), vd));
    if (f) d = vf_where_below(vf_zero(), vf_mul(d, vf_load(f)), *p, 0x1p-149f);
    *bad = vf_add(*bad, d);
    *r = d;
}

/* grad_vec's scale and row offset (w: in base 2) */
static FA_ALWAYS_INLINE vf BW(base)(int w, float x)
{
    return vf_set1(w ? (float)((double)x * FA_LOG2E) : x);
}

/* One row of grad_pair in place, in float32 (its slow path): P and dS
 * stored, then, where a dS is NaN or Inf (without f: with f grad_vec has
 * done it), dS = 0 wherever P = 0 for j < n; P = dS = 0 past n. */
static void BW(grad_row)(int w, float *s, float *ds, const float *f, int64_t n, int64_t npad,
                         int live, float sc, float l, float d)
{
    const int64_t nv = live ? fa_round_up(n, M16_W) : 0;
    const vf vc = BW(base)(w, sc), vl = BW(base)(w, l), vd = vf_set1(d);
    vf bad = vf_zero(), p, r;
    for (int64_t j = 0; j < nv; j += M16_W) {
        BW(grad_vec)(w, s + j, ds + j, f ? f + j : NULL, vc, vl, vd, &p, &r, &bad);
        vf_store(s + j, p);
        vf_store(ds + j, r);
    }
    if (live && !f && !isfinite(vf_hsum(bad)))
        for (int64_t j = 0; j < n; j++) ds[j] = s[j] != 0 ? ds[j] : 0;
    for (int64_t j = live ? n : 0; j < npad; j++) s[j] = ds[j] = 0;
}

/* Rows 0 and 1 of a pair (kernels.h: grad_pair), 2 M16_W columns a step,
 * each step's P and dS rounded as they come, s and ds only read.  The keys
 * from n to the next vector read as hidden (s -inf, ds d, f 0), so they
 * give P = dS = 0.  If a dS of a row came out NaN or Inf (without f), the
 * two rows run again through grad_row and are rounded from there.  P of
 * bfloat16 by the weights' exp2 (w: relative error 1.02e-4, under 2^-13,
 * where the operand's rounding is 2^-8: a third fewer operations per
 * vector, the forward's own P), of float16 (2^-11) by the table's exp. */
static FA_ALWAYS_INLINE void BW(grad_pair_w)(int w, int f16, float *s, float *ds, float *f,
                                             int64_t ld, int64_t n, int64_t npad,
                                             const int *live, float sc, const float *l,
                                             const float *d, uint16_t *pp, uint16_t *dsp,
                                             uint16_t *dsr, int64_t ldr)
{
    const int64_t nv = fa_round_up(n, M16_W);
    const vf vc = BW(base)(w, sc);
    const vf vl[2] = {BW(base)(w, live[0] ? l[0] : 0), BW(base)(w, live[1] ? l[1] : 0)};
    const vf vd[2] = {vf_set1(live[0] ? d[0] : 0), vf_set1(live[1] ? d[1] : 0)};
    vf bad[2] = {vf_zero(), vf_zero()};
    for (int e = 0; e < 2; e++)
        for (int64_t j = n; live[e] && j < nv; j++) {
            s[e * ld + j] = -INFINITY;
            ds[e * ld + j] = d[e];
            if (f) f[e * ld + j] = 0;
        }
    for (int64_t j = 0; j < npad; j += 2 * M16_W) {
        vf p[2][2], r[2][2];
        for (int e = 0; e < 2; e++)
            for (int h = 0; h < 2; h++) {
                const int64_t c = e * ld + j + h * M16_W;
                p[e][h] = r[e][h] = vf_zero();
                if (live[e] && j + h * M16_W < nv)
                    BW(grad_vec)(w, s + c, ds + c, f ? f + c : NULL, vc, vl[e], vd[e],
                                 &p[e][h], &r[e][h], &bad[e]);
            }
        for (int h = 0; h < 2; h++) {
            const int64_t c = 2 * (j + h * M16_W);
            if (pp) m16_store(pp + c, m16_pairs(f16, p[1][h], p[0][h]));
            if (dsp) m16_store(dsp + c, m16_pairs(f16, r[1][h], r[0][h]));
        }
        if (dsr) {
            m16_store(dsr + j, m16_cvt2(f16, r[0][1], r[0][0]));
            m16_store(dsr + ldr + j, m16_cvt2(f16, r[1][1], r[1][0]));
        }
    }
    if (f || isfinite(vf_hsum(vf_add(bad[0], bad[1])))) return;
    for (int e = 0; e < 2; e++)
        BW(grad_row)(w, s + e * ld, ds + e * ld, f, n, npad, live[e], sc, l[e], d[e]);
    if (pp) BW(pairs)(f16, s, ld, 2, npad, pp, 0);
    if (dsp) BW(pairs)(f16, ds, ld, 2, npad, dsp, 0);
    if (dsr) BW(rows)(f16, ds, ld, 2, npad, dsr, ldr);
}

static void BW(grad_pair)(int f16, float *s, float *ds, float *f, int64_t ld, int64_t n,
                          int64_t npad, const int *live, float sc, const float *l,
                          const float *d, uint16_t *pp, uint16_t *dsp, uint16_t *dsr, int64_t ldr)
{
    if (f16)
        BW(grad_pair_w)(0, 1, s, ds, f, ld, n, npad, live, sc, l, d, pp, dsp, dsr, ldr);
    else
        BW(grad_pair_w)(1, 0, s, ds, f, ld, n, npad, live, sc, l, d, pp, dsp, dsr, ldr);
}

/* y[j*ldy + i] = x[i*ldx + j]: 16 x 16 blocks, each 16 rows loaded,
 * transposed in registers and stored as 16 rows */
static void BW(trans)(const float *x, int64_t ldx, int64_t rows, int64_t n, float *y,
                      int64_t ldy)
{
    for (int64_t i0 = 0; i0 < rows; i0 += M16_W)
        for (int64_t j0 = 0; j0 < n; j0 += M16_W) {
            m16_vi r[M16_W];
            for (int i = 0; i < M16_W; i++) r[i] = m16_as_vi(vf_load(x + (i0 + i) * ldx + j0));
            m16_transpose(r);
            for (int j = 0; j < M16_W; j++) vf_store(y + (j0 + j) * ldy + i0, m16_as_vf(r[j]));
        }
}

/* y pair row p = rows 2p, 2p + 1 of x: per 16 columns, row 2p widened to
 * the low halves of dwords, row 2p + 1 to the high halves, or-ed */
static int BW(inter)(const uint16_t *x, int64_t xs, int64_t rows, int64_t n, uint16_t eb,
                     uint16_t *y, int64_t ldy)
{
    unsigned bad = 0;
    for (int64_t p = 0; p < rows / 2; p++)
        for (int64_t c = 0; c < n; c += M16_W) {
            m16_vi w = m16_or(m16_widen(x + 2 * p * xs + c, M16_W, 0),
                              m16_widen(x + (2 * p + 1) * xs + c, M16_W, 1));
            m16_store(y + p * ldy + 2 * c, w);
            bad |= m16_clear_nonfinite(&w, eb); /* on the copy left in w */
        }
    return bad != 0;
}

/* 16 rows x 16 dwords loaded, dword-transposed, each dword's halves to
 * columns 2c and 2c + 1 */
static int BW(cols)(const uint16_t *x, int64_t xs, int64_t rows, int64_t n, uint16_t eb,
                    uint16_t *y, int64_t ldy)
{
    unsigned bad = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += M16_W)
        for (int64_t c0 = 0; c0 < n; c0 += 2 * M16_W) {
            m16_vi t[M16_W];
            for (int i = 0; i < M16_W; i++) {
                t[i] = m16_load(x + (r0 + i) * xs + c0);
                m16_vi w = t[i];
                bad |= m16_clear_nonfinite(&w, eb);
            }
            m16_transpose(t);
            for (int j = 0; j < M16_W; j++) {
                m16_store_half(y + (c0 + 2 * j) * ldy + r0, t[j], 0);
                m16_store_half(y + (c0 + 2 * j + 1) * ldy + r0, t[j], 1);
            }
        }
    return bad != 0;
}

/* w <= M16_W halves at p widened (the rest 0), never read past p + w */
static inline vf BW(widen_n)(int f16, const uint16_t *p, int64_t w)
{
    uint16_t t[M16_W] = {0};
    if (w < M16_W) {
        memcpy(t, p, (size_t)w * 2);
        p = t;
    }
    return f16 ? vf_load_f16(p) : vf_load_bf16(p);
}

/* a lane per row: 16 rows x 16 columns widened and multiplied (each
 * product rounded as the scalar loop rounds it), the products transposed,
 * then added per column, in column order */
static void BW(dots)(int f16, const uint16_t *x, int64_t xs, const uint16_t *y, int64_t ys,
                     int64_t rows, int64_t n, float *d)
{
    for (int64_t r0 = 0; r0 < rows; r0 += M16_W) {
        vf acc = vf_zero();
        for (int64_t c0 = 0; c0 < n; c0 += M16_W) {
            const int64_t w = n - c0 < M16_W ? n - c0 : M16_W;
            m16_vi p[M16_W];
            for (int r = 0; r < M16_W; r++)
                p[r] = m16_as_vi(vf_mul(BW(widen_n)(f16, x + (r0 + r) * xs + c0, w),
                                        BW(widen_n)(f16, y + (r0 + r) * ys + c0, w)));
            m16_transpose(p);
            for (int64_t c = 0; c < w; c++) acc = vf_add(acc, m16_as_vf(p[c]));
        }
        vf_store(d + r0, acc);
    }
}
