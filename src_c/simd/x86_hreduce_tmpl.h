/* x86_hreduce_tmpl.h -- a horizontal reduction of a 256-bit vector: the
 * 128-bit halves combined, then within 128 bits.  Included by x86.h with
 * FA_HOP (max or add: the intrinsics _mm_<op>_ps, ...) and FA_HNAME (hmax,
 * hsum) defined: FA_HNAME256(ps) -> fa_hmax256_ps, fa_hsum256_pd, ... */
#define FA_HNAME256(ps) FA_CAT(FA_PASTE(FA_PASTE(fa_, FA_HNAME), 256), ps)
#define HOP(ps) FA_CAT(FA_CAT(_mm, FA_HOP), ps) /* HOP(ps) -> _mm_max_ps */

static inline float FA_HNAME256(ps)(__m256 a)
{
    __m128 m = HOP(ps)(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = HOP(ps)(m, _mm_movehl_ps(m, m));
    m = HOP(ss)(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline double FA_HNAME256(pd)(__m256d a)
{
    __m128d m = HOP(pd)(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    m = HOP(sd)(m, _mm_unpackhi_pd(m, m));
    return _mm_cvtsd_f64(m);
}

#undef FA_HNAME256
#undef HOP
