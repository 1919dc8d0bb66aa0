/* util.h -- preprocessor and integer helpers shared by every layer. */
#ifndef FASTATTN_UTIL_H
#define FASTATTN_UTIL_H

#include <stdint.h>

/* Token pasting and stringizing after macro expansion. */
#define FA_PASTE_(a, b) a##b
#define FA_PASTE(a, b) FA_PASTE_(a, b)
#define FA_CAT_(a, b) a##_##b
#define FA_CAT(a, b) FA_CAT_(a, b)                 /* FA_CAT(qk, f32) -> qk_f32 */
#define FA_CAT3_(a, b, c) a##_##b##_##c
#define FA_CAT3(a, b, c) FA_CAT3_(a, b, c)         /* -> qk_f32_avx2 */
#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)

/* log2(e) and ln(2), to the digits of a long double: the scores' log2
 * units and their way back (the log-sum-exp, vmath.h's exp2 coefficients). */
#define FA_LOG2E 1.44269504088896340735992468100189214
#define FA_LN2 0.693147180559945309417232121458176568

/* The element types.  A template (a *_tmpl.h file, included once per
 * element type: the one templating idiom of src_c/) is parametrised by
 * FA_SFX = f32 or f64 and derives the rest from it here, e.g. FA_TYPE(f32)
 * -> float, FA_VEC(f64) -> vd (the simd/ mapping's prefix); the 16-bit
 * storage kernels add FA_HSFX = f16 or bf16 one level in
 * (kernels_half_tmpl.h). */
#define FA_TYPE(sfx) FA_PASTE(FA_TYPE_, sfx)       /* float, double */
#define FA_TYPE_MAX(sfx) FA_PASTE(FA_TYPE_MAX_, sfx) /* FLT_MAX, DBL_MAX (<float.h>) */
#define FA_TYPE_MIN(sfx) FA_PASTE(FA_TYPE_MIN_, sfx) /* FLT_MIN, DBL_MIN: least normal */
#define FA_UINT(sfx) FA_PASTE(FA_UINT_, sfx)       /* unsigned of the same size */
#define FA_EXP_MASK(sfx) FA_PASTE(FA_EXP_MASK_, sfx) /* its exponent bits */
#define FA_VEC(sfx) FA_PASTE(FA_VEC_, sfx)         /* vf, vd: simd/ operations, types */
#define FA_VECU(sfx) FA_PASTE(FA_VECU_, sfx)       /* VF, VD: simd/ constants */
#define FA_IS_F64(sfx) FA_PASTE(FA_IS_F64_, sfx)   /* 0, 1: for #if */
#define FA_TYPE_f32 float
#define FA_TYPE_f64 double
#define FA_TYPE_MAX_f32 FLT_MAX
#define FA_TYPE_MAX_f64 DBL_MAX
#define FA_TYPE_MIN_f32 FLT_MIN
#define FA_TYPE_MIN_f64 DBL_MIN
#define FA_UINT_f32 uint32_t
#define FA_UINT_f64 uint64_t
#define FA_EXP_MASK_f32 0x7f800000u
#define FA_EXP_MASK_f64 0x7ff0000000000000ull
#define FA_VEC_f32 vf
#define FA_VEC_f64 vd
#define FA_VECU_f32 VF
#define FA_VECU_f64 VD
#define FA_IS_F64_f32 0
#define FA_IS_F64_f64 1

/* For a hot helper that is also in the kernel table (its address taken):
 * inlined where called directly all the same. */
#if defined(__GNUC__) || defined(__clang__)
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FA_ALWAYS_INLINE __forceinline
#else
#define FA_ALWAYS_INLINE inline
#endif

/* A hint to fetch the cache line at p for reading (no fault, no effect on
 * results): the decoding kernels, which stream K and V from memory once.
 * Into the L2 (PREFETCHT1), not the L1: on an Intel Xeon (AMX, 2026-12-05)
 * the decoding steps of bench --suite serving take 8-11% less time so, the
 * L1's few fill buffers no longer held by requests made a block ahead;
 * PREFETCHNTA halves the rate there. */
/* And one for a line about to be written, into the L1 (PREFETCHW where
 * the CPU has it): the accumulator rows of the next register tile of P.V,
 * which the current tile's hundreds of FMAs leave time to bring in. */
#if defined(__GNUC__) || defined(__clang__)
#define FA_PREFETCH(p) __builtin_prefetch((p), 0, 2)
#define FA_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#else
#define FA_PREFETCH(p) ((void)(p))
#define FA_PREFETCH_W(p) ((void)(p))
#endif

/* A read of the byte at p whose value is dropped (kept by the compiler):
 * a demand load where a prefetch hint does not bring the line in time (the
 * decoding kernels' value rows on AMD Zen 3: kernels/decode_rows_tmpl.h). */
#define FA_TOUCH(p) ((void)*(const volatile char *)(p))

/* n rounded up to a multiple of m (n >= 0, m > 0). */
static inline int64_t fa_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
/* ceil(n / m) (n >= 0, m > 0). */
static inline int64_t fa_div_up(int64_t n, int64_t m) { return (n + m - 1) / m; }
static inline int64_t fa_min64(int64_t a, int64_t b) { return a < b ? a : b; }

#endif
