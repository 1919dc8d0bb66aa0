/* transpose_x86.h -- transposes of one TB x TB block for packing K:
 * dst[i][r] = src[r][i] (row strides srs, drs in elements); 256-bit for both
 * x86 mappings (every AVX-512 CPU has AVX2).  Included by simd_avx2.h and
 * simd_avx512.h. */
#define VF_TB 8
#define VD_TB 4
static inline void vf_transpose_block(const float *src, int64_t srs, float *dst, int64_t drs)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + srs);
    __m256 r2 = _mm256_loadu_ps(src + 2 * srs), r3 = _mm256_loadu_ps(src + 3 * srs);
    __m256 r4 = _mm256_loadu_ps(src + 4 * srs), r5 = _mm256_loadu_ps(src + 5 * srs);
    __m256 r6 = _mm256_loadu_ps(src + 6 * srs), r7 = _mm256_loadu_ps(src + 7 * srs);
    /* pairs of rows interleaved, then quadruples, then the 128-bit halves */
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + drs, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * drs, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * drs, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * drs, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * drs, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * drs, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * drs, _mm256_permute2f128_ps(u3, u7, 0x31));
}
static inline void vd_transpose_block(const double *src, int64_t srs, double *dst, int64_t drs)
{
    __m256d r0 = _mm256_loadu_pd(src), r1 = _mm256_loadu_pd(src + srs);
    __m256d r2 = _mm256_loadu_pd(src + 2 * srs), r3 = _mm256_loadu_pd(src + 3 * srs);
    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    _mm256_storeu_pd(dst, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(dst + drs, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(dst + 2 * drs, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(dst + 3 * drs, _mm256_permute2f128_pd(t1, t3, 0x31));
}
