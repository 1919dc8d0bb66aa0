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

/* For a hot helper that is also in the kernel table (its address taken):
 * inlined where called directly all the same. */
#if defined(__GNUC__) || defined(__clang__)
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FA_ALWAYS_INLINE __forceinline
#else
#define FA_ALWAYS_INLINE inline
#endif

/* n rounded up to a multiple of m (n >= 0, m > 0). */
static inline int64_t fa_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
/* ceil(n / m) (n >= 0, m > 0). */
static inline int64_t fa_div_up(int64_t n, int64_t m) { return (n + m - 1) / m; }
static inline int64_t fa_min64(int64_t a, int64_t b) { return a < b ? a : b; }

#endif
