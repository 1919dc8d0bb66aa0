/* transpose_neon.h -- the 4 x 4 (float) and 2 x 2 (double) transposes of one
 * block for packing K: dst[i][r] = src[r][i] (row strides srs, drs in
 * elements), by pairs of 32-bit lanes, then of 64-bit.  Advanced SIMD, so
 * shared by simd_neon.h and simd_sve.h (whose 256-bit SVE vectors pack K in
 * the same 128-bit blocks: Advanced SIMD runs beside SVE). */
static inline void vf_transpose_block(const float *src, int64_t srs, float *dst, int64_t drs)
{
    const float32x4_t r0 = vld1q_f32(src), r1 = vld1q_f32(src + srs);
    const float32x4_t r2 = vld1q_f32(src + 2 * srs), r3 = vld1q_f32(src + 3 * srs);
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
    const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
    const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
    vst1q_f32(dst + drs, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
    vst1q_f32(dst + 2 * drs, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
    vst1q_f32(dst + 3 * drs, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
}
static inline void vd_transpose_block(const double *src, int64_t srs, double *dst, int64_t drs)
{
    const float64x2_t r0 = vld1q_f64(src), r1 = vld1q_f64(src + srs);
    vst1q_f64(dst, vtrn1q_f64(r0, r1));
    vst1q_f64(dst + drs, vtrn2q_f64(r0, r1));
}
