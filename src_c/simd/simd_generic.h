/* simd_generic.h -- portable C: one-lane "vectors"; the compiler may
 * auto-vectorise the loops (see simd.h for the contract).  Its exp and exp2
 * are the C library's (FA_SIMD_LIBM_EXP: vmath_tmpl.h is not used). */
typedef float vf;
typedef double vd;
#define VF_W 1
#define VD_W 1
#define VF_MR 4
#define VF_NRV 4
#define VD_MR 4
#define VD_NRV 4
#define VF_PV_MR 4
#define VD_PV_MR 4
#define VF_TB 4
#define VD_TB 4
#define FA_SIMD_LIBM_EXP 1
static inline vf vf_load(const float *p) { return *p; }
static inline void vf_store(float *p, vf a) { *p = a; }
static inline vf vf_set1(float a) { return a; }
static inline vf vf_zero(void) { return 0.0f; }
static inline vf vf_fma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_max_acc(vf acc, vf x) { return x > acc ? x : acc; }
static inline vf vf_nan_acc(vf acc, vf x) { return x != x ? x : acc; }
static inline float vf_hmax(vf a) { return a; }
static inline float vf_hsum(vf a) { return a; }
static inline vf vf_exp(vf x) { return x < VF_EXP_LO ? 0.0f : expf(x); }
static inline vf vf_exp2(vf x) { return x < -126.0f ? 0.0f : exp2f(x); }
static inline vd vd_load(const double *p) { return *p; }
static inline void vd_store(double *p, vd a) { *p = a; }
static inline vd vd_set1(double a) { return a; }
static inline vd vd_zero(void) { return 0.0; }
static inline vd vd_fma(vd a, vd b, vd c) { return a * b + c; }
static inline vd vd_add(vd a, vd b) { return a + b; }
static inline vd vd_sub(vd a, vd b) { return a - b; }
static inline vd vd_mul(vd a, vd b) { return a * b; }
static inline vd vd_max_acc(vd acc, vd x) { return x > acc ? x : acc; }
static inline vd vd_nan_acc(vd acc, vd x) { return x != x ? x : acc; }
static inline double vd_hmax(vd a) { return a; }
static inline double vd_hsum(vd a) { return a; }
static inline vd vd_exp(vd x) { return x < VD_EXP_LO ? 0.0 : exp(x); }
static inline vd vd_exp2(vd x) { return x < -1022.0 ? 0.0 : exp2(x); }
static inline void vf_transpose_block(const float *src, int64_t srs, float *dst, int64_t drs)
{
    for (int r = 0; r < VF_TB; r++)
        for (int i = 0; i < VF_TB; i++) dst[i * drs + r] = src[r * srs + i];
}
static inline void vd_transpose_block(const double *src, int64_t srs, double *dst, int64_t drs)
{
    for (int r = 0; r < VD_TB; r++)
        for (int i = 0; i < VD_TB; i++) dst[i * drs + r] = src[r * srs + i];
}
