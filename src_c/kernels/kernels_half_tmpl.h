/* kernels_half_tmpl.h -- the kernels that read 16-bit storage (float16,
 * bfloat16) and compute in float32: K and V packed into the float panels
 * of kernels.h (converted while packing: the panels are built anyway), and
 * the direct (decoding) dot products straight from the 16-bit keys and
 * values, widened in registers, so a decoding step reads half the bytes of
 * float32.  Included by kernels_tmpl.h in its float pass (FA_SFX f32: FA_T,
 * VT, V, VW, NR, NRV, VC as there), once per storage type FA_HSFX (f16,
 * bf16).  Every function is named HN(name) -> name_<FA_HSFX>_<FA_ISA_NAME>,
 * e.g. pack_k_f16_avx512, qk_direct_bf16_avx2, pv_direct_f16_generic. */
#define HN(name) FA_CAT3(name, FA_HSFX, FA_ISA_NAME)
#define HLOAD FA_CAT(vf_load, FA_HSFX)                  /* vf_load_f16, vf_load_bf16 */
#define HSTORE FA_CAT(vf_store, FA_HSFX)                /* vf_store_f16, vf_store_bf16 */
#define HTOF FA_CAT3(fa, FA_HSFX, to_f32)               /* fa_f16_to_f32 (runtime/half.h) */
#define FTOH FA_CAT(fa_f32_to, FA_HSFX)                 /* fa_f32_to_f16 */
#define FA_HCHUNK 64 /* dims of a key row widened at a time in pack_k */

/* dst[i] = src[i] widened, i < n */
static FA_ALWAYS_INLINE void HN(widen_in)(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V(store)(dst + i, HLOAD(src + i));
    for (; i < n; i++) dst[i] = HTOF(src[i]);
}

static void HN(widen)(const uint16_t *src, float *dst, int64_t n) { HN(widen_in)(src, dst, n); }

/* dst[i] = a * src[i] rounded to nearest even into 16 bits, i < n */
static void HN(narrow)(const float *src, float a, uint16_t *dst, int64_t n)
{
    const VT va = V(set1)(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) HSTORE(dst + i, V(mul)(V(load)(src + i), va));
    for (; i < n; i++) dst[i] = FTOH(src[i] * a);
}

/* kp panels [E x NR] (kernels.h) from 16-bit keys: TB keys at a time, their
 * rows widened FA_HCHUNK dims at a time into buf, then TB x TB transposes. */
static void HN(pack_k)(int64_t nk, int64_t ncols, int64_t E, const uint16_t *k, int64_t krs,
                       float *kp)
{
    float buf[VC(TB) * FA_HCHUNK];
    for (int64_t j0 = 0; j0 < ncols; j0 += NR) {
        float *pan = kp + (j0 / NR) * E * NR;
        int64_t jb = 0;
        for (; jb + VC(TB) <= NR && j0 + jb + VC(TB) <= nk; jb += VC(TB)) {
            const uint16_t *src = k + (j0 + jb) * krs;
            for (int64_t d0 = 0; d0 < E; d0 += FA_HCHUNK) {
                const int64_t w = E - d0 < FA_HCHUNK ? E - d0 : FA_HCHUNK, wb = w / VC(TB) * VC(TB);
                for (int64_t i = 0; i < VC(TB); i++) HN(widen_in)(src + i * krs + d0, buf + i * FA_HCHUNK, w);
                for (int64_t d = 0; d < wb; d += VC(TB))
                    V(transpose_block)(buf + d, FA_HCHUNK, pan + (d0 + d) * NR + jb, NR);
                for (int64_t d = wb; d < w; d++)
                    for (int64_t i = 0; i < VC(TB); i++) pan[(d0 + d) * NR + jb + i] = buf[i * FA_HCHUNK + d];
            }
        }
        for (; jb < NR; jb++) { /* the last keys one at a time, zeros past nk */
            float *dst = pan + jb;
            if (j0 + jb < nk) {
                const uint16_t *src = k + (j0 + jb) * krs;
                for (int64_t d = 0; d < E; d++) dst[d * NR] = HTOF(src[d]);
            } else {
                for (int64_t d = 0; d < E; d++) dst[d * NR] = 0;
            }
        }
    }
}

/* the direct P.V (v 16-bit, in place) and the vp panels (kernels.h) from
 * 16-bit values, widened while loading */
#define DV_NAME HN(pv_direct) /* pv_direct_f16_avx2, pv_direct_bf16_avx512, ... */
#define PV_NAME HN(pack_v)    /* pack_v_f16_avx2, pack_v_bf16_avx512, ... */
#define PV_SRC uint16_t
#define PV_LOAD HLOAD
#define PV_TO HTOF
#include "kernels/pv_direct_tmpl.h"
#include "kernels/pack_v_tmpl.h"

/* the direct decoding kernels over a block's row pointers, 16-bit rows
 * widened as they are loaded */
#define DR(name) HN(name) /* qk_tile_bf16_avx2, pv_tile_f16_avx512, ... */
#define DR_QK HN(qk_rows) /* qk_rows_f16_avx2, qk_rows_bf16_avx512, ... */
#define DR_QKD HN(qk_direct) /* qk_direct_bf16_avx2, ... */
#define DR_PV HN(pv_rows) /* pv_rows_f16_avx2, pv_rows_bf16_avx512, ... */
#define DR_SRC uint16_t
#define DR_LOAD HLOAD
#define DR_TO HTOF
#define DR_WIDEN 1
#include "kernels/decode_rows_tmpl.h"

#undef HN
#undef HLOAD
#undef HTOF
#undef HSTORE
#undef FTOH
#undef FA_HCHUNK
