/* quantize_q8_tmpl.h -- the int8 rows of fa_quantize_q8 (fastattn.h): for
 * each row of n floats, scale = max|x| / 127 and the levels x / scale
 * rounded half to even, clamped to +-127.  Plain C, compiled once per ISA
 * by kernels/kernels_isa.c so that its loops vectorise with that ISA's
 * registers (the quantize_q8 entry of its f32 table); every level is the
 * exact quotient's, so the bits are the same on every ISA.  The rows are
 * finite (driver/decode_q8.c checks them first).  Names:
 * FA_CAT(fa_quantize_q8_rows, FA_ISA_NAME) -> fa_quantize_q8_rows_avx2, ...;
 * its helpers Q8Q(name) -> name_q8q_<FA_ISA_NAME> (row_scale_q8q_avx2, ...). */
#define Q8Q(name) FA_CAT3(name, q8q, FA_ISA_NAME)

/* One row's scale: max|x| / 127, nudged up by ulps while a level would
 * round past 127 (only when the quotient is subnormal); 0 for zeros. */
static float Q8Q(row_scale)(const float *x, int64_t n)
{
    /* max |x| on the bits (finite x: magnitudes order as their bit
     * patterns), so that the loop vectorises */
    uint32_t mbits = 0;
    for (int64_t c = 0; c < n; c++) {
        uint32_t u;
        memcpy(&u, x + c, sizeof u);
        u &= 0x7fffffffu;
        mbits = u > mbits ? u : mbits;
    }
    float amax;
    memcpy(&amax, &mbits, sizeof amax);
    if (amax == 0) return 0;
    float s = amax / 127.0f;
    if (s == 0) s = nextafterf(0.0f, 1.0f);
    while ((double)amax / (double)s > 127.5) s = nextafterf(s, INFINITY);
    return s;
}

/* The level of x in a row of scale s > 0: x / s in double is correctly rounded
 * enough that rint (round half to even, the default mode) rounds the exact
 * quotient; clamped to +-127. */
static int8_t Q8Q(level)(float x, float s)
{
    double t = rint((double)x / (double)s);
    t = t > 127 ? 127 : (t < -127 ? -127 : t);
    return (int8_t)t;
}

/* The levels of row x (n floats) at scale s > 0 into y.  First in float32
 * with a product by 1 / s, which vectorises (all lanes 32-bit): its
 * quotient is within 2^-15 of the exact one (|x / s| <= 127.5, a few
 * roundings of 2^-24 relative), so rounding it to nearest even gives the
 * exact quotient's level unless it lies within 2^-14 of a half level; only
 * then is the row redone by Q8Q(level)'s division. */
static void Q8Q(row_levels)(const float *x, int64_t n, float s, int8_t *y)
{
    /* rounding half to even by adding and taking away 1.5 2^23 (exact for
     * |q| < 2^22, in the default rounding mode): plain arithmetic, which
     * vectorises on every ISA (rintf needs SSE4.1 on x86) */
    const float inv = 1.0f / s, big = 0x1.8p23f;
    int32_t near = 0;
    for (int64_t c = 0; c < n; c++) {
        const float q = x[c] * inv, t = (q + big) - big;
        near |= fabsf(fabsf(q - t) - 0.5f) < 0x1p-14f;
        int32_t i = (int32_t)t; /* |t| <= 128: 127.5 rounds to 128 */
        i -= i > 127;
        i += i < -127;
        y[c] = (int8_t)i;
    }
    if (near)
        for (int64_t c = 0; c < n; c++) y[c] = Q8Q(level)(x[c], s);
}

/* Each row's scale to scale[r], its levels to y + r*y_rs. */
static void FA_CAT(fa_quantize_q8_rows, FA_ISA_NAME)(int64_t rows, int64_t n, const float *x,
                                                    int64_t x_rs, int8_t *y, int64_t y_rs,
                                                    float *scale)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_rs;
        int8_t *yr = y + r * y_rs;
        const float s = Q8Q(row_scale)(xr, n);
        scale[r] = s;
        if (s == 0)
            memset(yr, 0, (size_t)n);
        else if (s < 0x1p-100f) /* 1 / s past float32's range or precision */
            for (int64_t c = 0; c < n; c++) yr[c] = Q8Q(level)(xr[c], s);
        else
            Q8Q(row_levels)(xr, n, s, yr);
    }
}

#undef Q8Q
