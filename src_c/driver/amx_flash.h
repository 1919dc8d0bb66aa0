/* amx_flash.h -- the bfloat16 flash attention driver of the tiers with
 * bfloat16 dot products (amx: TDPBF16PS on tiles; avx512_bf16: VDPBF16PS on
 * zmm registers), over the vocabulary of simd/bf16_tiles.h; on amx it runs
 * float16 too where the CPU has AMX-FP16 (TDPFP16PS; ctx.f16: the same
 * steps, float16 conversions and NaN/Inf bits).  Included by
 * kernels/kernels_isa.c when the mapping defines FA_SIMD_BF16; defines
 *   fa_bf16_flash_<isa>  (fa_bf16_flash_amx, fa_bf16_flash_avx512_bf16):
 * see kernels.h for the contract (what it takes; FA_BF16_DECLINED otherwise).
 *
 * The transposed formulation (keys on tile rows, queries on lanes), so that
 * the online softmax needs no horizontal reduction:
 *   S^T (keys x queries) = K . Q^T   A = K rows as stored (bfloat16 pairs
 *                                    along E), B = Q^T in pair layout
 *                                    (packed once per query block);
 *   softmax over keys                a vertical max / exp2 / sum per lane
 *                                    (AVX-512, float32; fa_bf_exp2 below);
 *   O^T (Ev x queries) += V^T . P^T  A = V^T (packed once per call),
 *                                    B = P^T rounded to bfloat16, key pairs
 *                                    interleaved per lane while converting.
 * Blocks (each named once here, sized by the tiles and the L1):
 *   FA_BF_MQ  query rows per work item = two 16-lane tile columns: Q.K^T
 *             uses 4 C tiles (2 key tiles x 2 query halves) + 2 A + 2 B,
 *             all 8 tile registers (avx512_bf16: two zmm per row of C);
 *   FA_BF_KB  keys per block: two S^T blocks (KB x 32 float32, 8 KiB each:
 *             the one the softmax reads, the one Q.K^T writes), two P^T
 *             blocks (4 KiB each: the one written, the one P.V reads) and
 *             O^T (Ev x 32 float32, 8 KiB at Ev = 64) stay in the 48 KiB L1
 *             with the Q^T tiles (4 KiB at E = 64) and the streamed K and
 *             V^T tiles.  64 measured ~7% faster than 128 (56 KiB of
 *             buffers, more than the L1); 32 as fast at E = 64 but ~10%
 *             slower at E = 128 (O^T loaded and stored per 32 keys).
 * Phase 1 (parallel over the batch): K copied to zero-padded rows of
 * round_up(E, 32) (S rounded up to 32 rows), V transposed to V^T
 * (round_up(Ev, 16) x round_up(S, 32)); a NaN or Inf of V is packed as 0
 * (a hidden key's must not reach the output, and 0 x NaN is NaN in P.V)
 * and its key noted; the rows that see such a key get those columns
 * patched to IEEE's sum (FA_BF(nonfinite)).
 * Phase 2 (parallel over batch x query blocks; an item's result does not
 * depend on the thread, so results are bitwise the same for any thread
 * count): per key block j, masks (causal, window, key padding) on S^T, the
 * running max (lazily raised: FA_BF(newmax)), the weights P^T -- and,
 * issued a few at a time between the weights' vector instructions, the tile
 * steps of Q.K^T of block j+1 and of P.V of block j-1 (FA_BF(tiles)), so that
 * the tile unit and the vector units work at once (on avx512_bf16 both are
 * vector instructions: the order lets them overlap in the out-of-order
 * core); then out = O / l. */
#include "driver/window.h"
#include "runtime/alloc.h"
#include "runtime/parallel.h"

#define FA_BF_MQ 32
#define FA_BF_KB 64
#define FA_BF_LAZY 8.0f /* log2 units: the weights stay below 2^8 (newmax) */
#define FA_BF_MAX_E 256 /* E and Ev up to this (the Q^T and O^T blocks) */

/* 2^x for the softmax weights that P.V rounds to bfloat16 (relative error
 * 2^-9): n = round(x), 2^(x - n) by a degree-3 polynomial with constant
 * term 1 (relative error 1.02e-4 < 2^-13 on [-1/2, 1/2]: the minimax of the
 * relative error, fitted like vmath.h's), scaled by 2^n with VSCALEFPS;
 * below 2^-125 the result is exactly 0 (so exp2(-inf) = 0; VCVTNE2PS2BF16
 * flushes float32 subnormals to 0 anyway).  Four operations fewer per vector
 * than vf_exp2 of vmath_tmpl.h, whose degree 5 (9e-8) the bfloat16 rounding
 * of P does not need. */
#define FA_BF_EXP2_NORMAL (-125.0f) /* from here on 2^x is a float32 normal */
#define FA_BF_EXP2_P0 1.0f /* exactly 1: equal scores give equal weights of exactly 1 */
#define FA_BF_EXP2_P1 0x1.62f5fcp-1f
#define FA_BF_EXP2_P2 0x1.f00c50p-3f
#define FA_BF_EXP2_P3 0x1.c2a20ap-5f
static inline __m512 fa_bf_exp2(__m512 x)
{
    /* a result below the float32 normals would cost a microcode assist in
     * VSCALEFPS (tens of cycles per vector: every hidden score is one);
     * those lanes are zeroed instead.  NaN is kept (unordered: true).  Their
     * n is 0, so r = x there: -inf gives +-inf through the polynomial, never
     * inf - inf (no NaN from a hidden score). */
    const __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(FA_BF_EXP2_NORMAL), _CMP_NLT_UQ);
    const __m512 n = _mm512_maskz_roundscale_ps(big, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(FA_BF_EXP2_P3), r, _mm512_set1_ps(FA_BF_EXP2_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_BF_EXP2_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_BF_EXP2_P0));
    return _mm512_maskz_scalef_ps(big, p, n);
}

#define FA_BF_FN FA_PASTE(fa_bf16_flash_, FA_ISA_NAME) /* fa_bf16_flash_amx, ..._avx512_bf16 */
#define FA_BF(name) FA_CAT(FA_PASTE(fa_bf_, name), FA_ISA_NAME) /* fa_bf_item_amx, ... */

typedef struct FA_BF(ctx) {
    const fa_attention_args *a;
    fa_limits lim;
    int64_t nb, nqb, Sp, Ep, Evp;  /* batch items, query blocks, padded sizes */
    int64_t vts;                   /* V^T row stride: Sp + 32 (no 4 KiB aliasing of rows) */
    uint16_t *kp, *vt;             /* packed K (nb x Sp x Ep), V^T (nb x Evp x Sp) */
    char *scratch;                 /* per thread */
    size_t scratch_bytes;
    float c;                       /* scale * log2(e) */
    int64_t *nnf;                  /* per batch item: 1 if its V has a NaN or Inf */
    uint8_t *nfk;                  /* nfk[b * S + j]: key j's V row has one */
    int f16;                       /* 1: float16 (amx: TDPFP16PS), 0: bfloat16 */
} FA_BF(ctx);

/* The bits of the 16-bit type: exponent, mantissa, a quiet NaN */
typedef struct fa_bf_bits { uint16_t exp, mant, qnan; } fa_bf_bits;
static const fa_bf_bits fa_bf_bits_of[2] = {{0x7f80, 0x7f, 0x7fc0}, {0x7c00, 0x3ff, 0x7e00}};

/* 32 halves of the call's type from 2 x 16 float32 (lo's first), nearest even */
static inline __m512i fa_bf_cvt2(int f16, __m512 hi, __m512 lo)
{
#if defined(FA_AMX_FP16)
    if (f16) return fa_cvt2f16(hi, lo);
#else
    (void)f16;
#endif
    return fa_cvt2bf16(hi, lo);
}

/* a tile dot product on the call's type (tile numbers literal) */
#if defined(FA_AMX_FP16)
#define FA_BF_DP(w, c, a, b)                                                                   \
    do {                                                                                       \
        if ((w)->f16) FT_DP_F16((w)->tf, c, a, b); else FT_DP((w)->tf, c, a, b);              \
    } while (0)
#else
#define FA_BF_DP(w, c, a, b) FT_DP((w)->tf, c, a, b)
#endif

/* 16 x 16 dwords transposed in registers (unpack 32, 64 bits, then the
 * 128-bit lanes): row j of the result is column j of the input. */
static inline void fa_bf_tr16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    __m512i u[16]; /* u[4g + c]: lane l holds column 4l + c of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        const __m512i b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i d = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i e = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(a, d, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(a, d, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(b, e, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(b, e, 0xDD);
    }
}

/* 16 bfloat16 of a row (n <= 16 of them, contiguous; zeros beyond) as the
 * low halves (hi 0) or high halves (hi 1) of 16 dwords */
#if defined(FA_AVX512_SIMDE) /* SIMDe lacks these two; plain C then */
static inline __m512i fa_bf_widen(const uint16_t *p, int64_t n, int hi)
{
    uint32_t w[16] = {0};
    for (int64_t e = 0; e < n && e < 16; e++) w[e] = (uint32_t)p[e] << (hi ? 16 : 0);
    return _mm512_loadu_si512((const void *)w);
}
#else
static inline __m512i fa_bf_widen(const uint16_t *p, int64_t n, int hi)
{
    const __mmask32 m = n >= 16 ? 0xffffu : (((__mmask32)1 << n) - 1);
    const __m512i w = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, p)));
    return hi ? _mm512_slli_epi32(w, 16) : w;
}
#endif

/* element offsets of batch item b (q, k, v, out, pad, lse) */
static void FA_BF(offsets)(const fa_attention_args *a, int64_t b, int64_t o[6])
{
    const fa_operand *ops[6] = {&a->q, &a->k, &a->v, &a->out, &a->pad, &a->lse};
    for (int t = 0; t < 6; t++) o[t] = 0;
    for (int d = a->nbatch_dims - 1; d >= 0; d--) {
        const int64_t n = a->batch_shape[d], i = b % n;
        b /= n;
        for (int t = 0; t < 6; t++)
            if (ops[t]->data) o[t] += i * ops[t]->bstride[d];
    }
}

/* phase 1, item b: pack K (rows zero-padded to Ep) and V^T of batch item b;
 * note a non-finite value of V (NaN or Inf; exponent bits all ones).  q
 * and k need no check: a NaN or +inf score makes its row NaN as in the
 * reference, a -inf one is hidden, and hidden scores are replaced by -inf. */
static void FA_BF(pack)(void *vctx, int64_t b, int tid)
{
    FA_BF(ctx) *x = (FA_BF(ctx) *)vctx;
    const fa_attention_args *a = x->a;
    const int64_t S = a->S, E = a->E, Ev = a->Ev, Ep = x->Ep, Sp = x->Sp;
    (void)tid;
    int64_t o[6];
    FA_BF(offsets)(a, b, o);
    const uint16_t *k = (const uint16_t *)a->k.data + o[1];
    const uint16_t *v = (const uint16_t *)a->v.data + o[2];
    uint16_t *kp = x->kp + b * Sp * Ep, *vt = x->vt + b * x->Evp * x->vts;
    for (int64_t j = 0; j < S; j++) {
        uint16_t *d = kp + j * Ep;
        const uint16_t *r = k + j * a->k.rs;
        if (a->k.cs == 1)
            memcpy(d, r, (size_t)E * 2);
        else
            for (int64_t e = 0; e < E; e++) d[e] = r[e * a->k.cs];
        memset(d + E, 0, (size_t)(Ep - E) * 2);
    }
    memset(kp + S * Ep, 0, (size_t)((Sp - S) * Ep) * 2);
    /* V^T in blocks of 32 keys x 16 columns: key pairs interleaved into
     * dwords (rows 2k, 2k+1), then transposed: row e of V^T, 32 keys */
    unsigned nonfinite = 0;
    for (int64_t j0 = 0; j0 < Sp; j0 += 32) {
        const int64_t nj = S - j0 < 32 ? S - j0 : 32;
        for (int64_t e0 = 0; e0 < Ev; e0 += 16) {
            const int64_t ne = Ev - e0 < 16 ? Ev - e0 : 16;
            __m512i r[16];
            for (int64_t kq = 0; kq < 16; kq++) {
                const int64_t j = j0 + 2 * kq;
                __m512i w[2];
                for (int u = 0; u < 2; u++) {
                    if (j + u >= j0 + nj) { w[u] = _mm512_setzero_si512(); continue; }
                    const uint16_t *row = v + (j + u) * a->v.rs + e0 * a->v.cs;
                    if (a->v.cs == 1) {
                        w[u] = fa_bf_widen(row, ne, u);
                    } else {
                        uint16_t tmp[16] = {0};
                        for (int64_t e = 0; e < ne; e++) tmp[e] = row[e * a->v.cs];
                        w[u] = fa_bf_widen(tmp, 16, u);
                    }
                }
                r[kq] = _mm512_or_si512(w[0], w[1]);
                /* exponent bits all ones in a half: NaN or Inf, packed as 0
                 * (a hidden key's must not reach the output: 0 x NaN is
                 * NaN in P.V); a visible one is put back by FA_BF(nonfinite) */
                const uint32_t eb = fa_bf_bits_of[x->f16].exp;
                const __m512i elo = _mm512_set1_epi32((int)eb), ehi = _mm512_set1_epi32((int)(eb << 16));
                const __mmask16 blo = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r[kq], elo), elo);
                const __mmask16 bhi = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r[kq], ehi), ehi);
                if (blo | bhi) {
                    r[kq] = _mm512_mask_and_epi32(r[kq], blo, r[kq], _mm512_set1_epi32((int)0xffff0000u));
                    r[kq] = _mm512_mask_and_epi32(r[kq], bhi, r[kq], _mm512_set1_epi32(0xffff));
                    if (blo) x->nfk[b * S + j] = 1;
                    if (bhi) x->nfk[b * S + j + 1] = 1;
                    nonfinite = 1;
                }
            }
            fa_bf_tr16(r);
            for (int64_t e = 0; e < ne; e++) _mm512_storeu_si512((void *)(vt + (e0 + e) * x->vts + j0), r[e]);
        }
    }
    for (int64_t e = Ev; e < x->Evp; e++) memset(vt + e * x->vts, 0, (size_t)Sp * 2);
    x->nnf[b] = (int64_t)nonfinite;
}

/* Q^T of rows q0 .. q0+nq-1 as B tiles: tile (kk, h) = 16 rows (pairs of
 * E columns 32kk + 2r, +1) x 16 queries (16h + n), zero beyond L and E:
 * the rows' dwords transposed 16 x 16 */
static void FA_BF(pack_qt)(const fa_attention_args *a, const uint16_t *q, int64_t q0,
                            int64_t nq, int64_t nd, uint16_t *qt)
{
    for (int64_t kk = 0; kk < nd; kk++)
        for (int h = 0; h < 2; h++) {
            __m512i r[16];
            const int64_t ne = a->E - 32 * kk < 32 ? a->E - 32 * kk : 32;
            for (int n = 0; n < 16; n++) {
                const int64_t i = 16 * h + n;
                if (i >= nq) { r[n] = _mm512_setzero_si512(); continue; }
                const uint16_t *row = q + (q0 + i) * a->q.rs + 32 * kk * a->q.cs;
                uint16_t tmp[32] = {0};
                if (a->q.cs == 1 && ne == 32) {
                    r[n] = _mm512_loadu_si512((const void *)row);
                    continue;
                }
                for (int64_t e = 0; e < ne; e++) tmp[e] = row[e * a->q.cs];
                r[n] = _mm512_loadu_si512((const void *)tmp);
            }
            fa_bf_tr16(r);
            for (int rr = 0; rr < 16; rr++)
                _mm512_storeu_si512((void *)(qt + (kk * 2 + h) * 512 + rr * 32), r[rr]);
        }
}

/* The tile work of a key block as a queue of steps, each four dot products
 * (64 cycles of the tile unit) with their loads, so that the softmax loop can
 * issue them a few at a time between its vector instructions (FA_BF(step)):
 * the tile unit then works while the vector units compute the weights.
 *   Q.K^T steps first (the next block's softmax waits on their S^T), then
 *   P.V steps: O^T (Evp x 32 float32) += V^T . P^T of the previous
 *     block; per pair of Ev tiles, C tiles 0-3 (2 Ev tiles x 2 query halves)
 *     loaded from O^T at the first chunk of 32 keys, stored after the last;
 *     A (V^T) 4-5, B (P^T) 6-7;
 *   Q.K^T steps: S^T (row = key, 32 floats) of the next block, per pair
 *     of 16-key tiles C tiles 0-3 (2 key tiles x 2 query halves), A (K) 4-5,
 *     B (Q^T) 6-7, one step per 32 columns of E (nd of them).
 * Each C tile accumulates its products in the same order as one dot product
 * loop would: the queue changes when, never what, is computed. */
typedef struct FA_BF(tiles) {
    fa_tilefile *tf;
    const uint16_t *kp, *qt;       /* Q.K^T: K rows of the block, Q^T tiles */
    int64_t Ep, nd, nt16;          /* row stride, E / 32, 16-key tiles */
    float *st;                     /* its S^T */
    const uint16_t *vt;            /* P.V: V^T at the block's first key */
    const uint32_t *pt;            /* its P^T */
    int64_t vts, Evp, nc32;        /* V^T row stride, Ev tiles x 16, 32-key chunks */
    float *ot;
    int64_t npv, nqk, ip, iq;      /* steps of each, the next ones */
    int f16;                       /* the ctx's */
} FA_BF(tiles);

#if defined(FA_SIMD_AMX)
/* Q.K^T step j: tile pair j / nd, E columns 32 (j % nd) .. */
static inline void FA_BF(qk_step)(FA_BF(tiles) *w, int64_t j)
{
    fa_tilefile *tf = w->tf;
    (void)tf; /* (the AMX macros name tile registers, not tf) */
    const int64_t t = j / w->nd * 2, kk = j % w->nd, ks = w->Ep * 2;
    const int two = t + 1 < w->nt16;
    const uint16_t *k0 = w->kp + t * 16 * w->Ep;
    if (kk == 0) {
        FT_ZERO(tf, 0); FT_ZERO(tf, 1);
        if (two) { FT_ZERO(tf, 2); FT_ZERO(tf, 3); }
    }
    FT_LOAD(tf, 4, k0 + kk * 32, ks);
    FT_LOAD(tf, 6, w->qt + (kk * 2) * 512, 64);
    FT_LOAD(tf, 7, w->qt + (kk * 2 + 1) * 512, 64);
    FA_BF_DP(w, 0, 4, 6); FA_BF_DP(w, 1, 4, 7);
    if (two) {
        FT_LOAD(tf, 5, k0 + 16 * w->Ep + kk * 32, ks);
        FA_BF_DP(w, 2, 5, 6); FA_BF_DP(w, 3, 5, 7);
    }
    if (kk == w->nd - 1) {
        float *s0 = w->st + t * 16 * FA_BF_MQ, *s1 = s0 + 16 * FA_BF_MQ;
        FT_STORE(tf, 0, s0, FA_BF_MQ * 4); FT_STORE(tf, 1, s0 + 16, FA_BF_MQ * 4);
        if (two) { FT_STORE(tf, 2, s1, FA_BF_MQ * 4); FT_STORE(tf, 3, s1 + 16, FA_BF_MQ * 4); }
    }
}

/* P.V step j: Ev tile pair j / nc32, keys 32 (j % nc32) .. */
static inline void FA_BF(pv_step)(FA_BF(tiles) *w, int64_t j)
{
    fa_tilefile *tf = w->tf;
    (void)tf;
    const int64_t et = j / w->nc32 * 2, c = j % w->nc32, vs = w->vts * 2, os = FA_BF_MQ * 4;
    const int two = et + 1 < w->Evp / 16;
    float *o0 = w->ot + et * 16 * FA_BF_MQ, *o1 = o0 + 16 * FA_BF_MQ;
    if (c == 0) {
        FT_LOAD(tf, 0, o0, os); FT_LOAD(tf, 1, o0 + 16, os);
        if (two) { FT_LOAD(tf, 2, o1, os); FT_LOAD(tf, 3, o1 + 16, os); }
    }
    FT_LOAD(tf, 4, w->vt + et * 16 * w->vts + c * 32, vs);
    FT_LOAD(tf, 6, w->pt + c * 16 * 16, 64);
    FT_LOAD(tf, 7, w->pt + (FA_BF_KB / 2) * 16 + c * 16 * 16, 64);
    FA_BF_DP(w, 0, 4, 6); FA_BF_DP(w, 1, 4, 7);
    if (two) {
        FT_LOAD(tf, 5, w->vt + (et + 1) * 16 * w->vts + c * 32, vs);
        FA_BF_DP(w, 2, 5, 6); FA_BF_DP(w, 3, 5, 7);
    }
    if (c == w->nc32 - 1) {
        FT_STORE(tf, 0, o0, os); FT_STORE(tf, 1, o0 + 16, os);
        if (two) { FT_STORE(tf, 2, o1, os); FT_STORE(tf, 3, o1 + 16, os); }
    }
}

#define FA_BF_QK_STEPS(nt16, nd) (((nt16) + 1) / 2 * (nd)) /* per tile pair, per 32 E columns */
#define FA_BF_PV_STEPS(Evp, nc32) (((Evp) / 16 + 1) / 2 * (nc32)) /* per Ev tile pair, per 32 keys */
#else
/* avx512_bf16: the steps on registers, not on tiles in memory.  A step is
 * FA_BF_SG rows of C (keys of S^T, or Ev rows of O^T) x the 32 query lanes
 * (two zmm per row: 2 FA_BF_SG accumulators) summed over the whole reduction
 * (E, or the block's keys) in one pass, reading A and B where they lie (K
 * rows, Q^T, V^T, P^T): each A dword broadcast once for two VDPBF16PS, each
 * B row loaded once per FA_BF_SG rows, and C loaded and stored once per
 * step.  Every C element is one chain of VDPBF16PS, one per pair k with k in
 * order (from 0 for S^T, from O^T for P.V): the plain dot-product loop's
 * result, whatever the blocking (and bitwise that of the 16 x 16 software
 * tiles this replaced). */
#define FA_BF_SG 8 /* 16 accumulators + 2 B rows + a broadcast: 19 of the 32 zmm
                      * (a divisor of 16; 4 measured 22% slower on Zen 5) */
#define FA_BF_QK_STEPS(nt16, nd) ((nt16) * (16 / FA_BF_SG)) /* per FA_BF_SG keys (all of E) */
#define FA_BF_PV_STEPS(Evp, nc32) ((Evp) / FA_BF_SG) /* per FA_BF_SG Ev rows (all keys) */
/* the pair at p (two halves) as a dword, by memcpy: p points into uint16_t
 * rows, which C99's aliasing rules do not let us read as uint32_t (one
 * broadcast load all the same) */
static inline __m512i fa_bf_bcast_pair(const uint16_t *p)
{
    uint32_t d;
    memcpy(&d, p, 4);
    return _mm512_set1_epi32((int)d);
}
/* C rows i < FA_BF_SG (acc[i][0..1]) += sum over pairs k < np of A[i][k] B[k]:
 * A's row i at pair k is A + i * astr + 2k (uint16_t), B's two halves of pair
 * row k at B0, B1 (expressions of k) */
#define FA_BF_ACC_LOOP(np, A, astr, B0, B1)                                                    \
    for (int64_t k = 0; k < (np); k++) {                                                       \
        const __m512i b0 = _mm512_loadu_si512((const void *)(B0)),                             \
                      b1 = _mm512_loadu_si512((const void *)(B1));                             \
        for (int i = 0; i < FA_BF_SG; i++) {                                                   \
            const __m512i ai = fa_bf_bcast_pair((A) + i * (astr) + 2 * k);                     \
            acc[i][0] = fa_dpbf16(acc[i][0], ai, b0);                                          \
            acc[i][1] = fa_dpbf16(acc[i][1], ai, b1);                                          \
        }                                                                                      \
    }

/* Q.K^T step j: S^T rows (keys) FA_BF_SG j .. of the block, from 0 */
static inline void FA_BF(qk_step)(FA_BF(tiles) *w, int64_t j)
{
    __m512 acc[FA_BF_SG][2];
    for (int i = 0; i < FA_BF_SG; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    /* A: K rows (E pairs); B: Q^T tile (k / 16, h), row k % 16 */
    const uint16_t *kr = w->kp + j * FA_BF_SG * w->Ep, *qt = w->qt;
    FA_BF_ACC_LOOP(w->nd * 16, kr, w->Ep, qt + (k / 16 * 2) * 512 + k % 16 * 32,
                   qt + (k / 16 * 2 + 1) * 512 + k % 16 * 32)
    float *s = w->st + j * FA_BF_SG * FA_BF_MQ;
    for (int i = 0; i < FA_BF_SG; i++) {
        _mm512_storeu_ps(s + i * FA_BF_MQ, acc[i][0]);
        _mm512_storeu_ps(s + i * FA_BF_MQ + 16, acc[i][1]);
    }
}

/* P.V step j: O^T rows (Ev) FA_BF_SG j .. += V^T . P^T over the block's keys */
static inline void FA_BF(pv_step)(FA_BF(tiles) *w, int64_t j)
{
    __m512 acc[FA_BF_SG][2];
    float *o = w->ot + j * FA_BF_SG * FA_BF_MQ;
    for (int i = 0; i < FA_BF_SG; i++) {
        acc[i][0] = _mm512_loadu_ps(o + i * FA_BF_MQ);
        acc[i][1] = _mm512_loadu_ps(o + i * FA_BF_MQ + 16);
    }
    /* A: V^T rows (key pairs); B: P^T pair rows of each half */
    const uint16_t *vr = w->vt + j * FA_BF_SG * w->vts;
    const uint32_t *pt = w->pt;
    FA_BF_ACC_LOOP(w->nc32 * 16, vr, w->vts, pt + k * 16, pt + (FA_BF_KB / 2) * 16 + k * 16)
    for (int i = 0; i < FA_BF_SG; i++) {
        _mm512_storeu_ps(o + i * FA_BF_MQ, acc[i][0]);
        _mm512_storeu_ps(o + i * FA_BF_MQ + 16, acc[i][1]);
    }
}
#undef FA_BF_ACC_LOOP
#endif

/* the next queued step, if any: Q.K^T's first, then P.V's */
static inline void FA_BF(step)(FA_BF(tiles) *w)
{
    if (w->iq < w->nqk) FA_BF(qk_step)(w, w->iq++);
    else if (w->ip < w->npv) FA_BF(pv_step)(w, w->ip++);
}

/* every queued step */
static void FA_BF(drain)(FA_BF(tiles) *w)
{
    while (w->iq < w->nqk || w->ip < w->npv) FA_BF(step)(w);
}

/* queue P.V of keys k0 .. k0+n-1 (P^T pt, scaled O^T in ot) */
static void FA_BF(queue_pv)(FA_BF(tiles) *w, const FA_BF(ctx) *x, const uint16_t *vt, int64_t k0,
                             int64_t n, const uint32_t *pt, float *ot)
{
    w->vt = vt + k0;
    w->vts = x->vts;
    w->Evp = x->Evp;
    w->pt = pt;
    w->nc32 = (n + 31) / 32;
    w->ot = ot;
    w->npv = FA_BF_PV_STEPS(x->Evp, w->nc32);
}

/* queue Q.K^T of keys k0 .. k0+n-1 into st */
static void FA_BF(queue_qk)(FA_BF(tiles) *w, const FA_BF(ctx) *x, const uint16_t *kp, int64_t k0,
                             int64_t n, const uint16_t *qt, float *st)
{
    w->kp = kp + k0 * x->Ep;
    w->Ep = x->Ep;
    w->nd = x->Ep / 32;
    w->nt16 = (n + 15) / 16;
    w->qt = qt;
    w->st = st;
    w->nqk = FA_BF_QK_STEPS(w->nt16, w->nd);
}

/* Hide the scores of S^T rows 0..n-1 (keys k0 + r) that the causal mask, the
 * window or the key padding hides from query lanes q0 + 16h + lane. */
static void FA_BF(mask)(const FA_BF(ctx) *x, const uint8_t *pad, int64_t k0, int64_t n,
                         int64_t q0, float *st)
{
    const fa_attention_args *a = x->a;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t r = 0; r < n; r++) {
        const int64_t j = k0 + r;
        for (int h = 0; h < 2; h++) {
            float *s = st + r * FA_BF_MQ + 16 * h;
            if (pad && pad[j * a->pad.cs]) { _mm512_storeu_ps(s, ninf); continue; }
            /* visible lanes: i + lo <= j <= i + hi, i = q0 + 16h + lane: in
             * lane units  j - hi - base <= lane <= j - lo - base */
            const int64_t base = q0 + 16 * h;
            int64_t lmin = -1, lmax = 16;
            if (x->lim.has_hi) lmin = j - x->lim.hi - base;
            if (x->lim.has_lo) lmax = j - x->lim.lo - base;
            if (lmin <= 0 && lmax >= 15) continue;
            lmin = lmin < -1 ? -1 : (lmin > 16 ? 16 : lmin);
            lmax = lmax < -1 ? -1 : (lmax > 16 ? 16 : lmax);
            const __mmask16 vis =
                _mm512_cmpge_epi32_mask(iota, _mm512_set1_epi32((int)lmin)) &
                _mm512_cmple_epi32_mask(iota, _mm512_set1_epi32((int)lmax));
            _mm512_storeu_ps(s, _mm512_mask_mov_ps(ninf, vis, _mm512_loadu_ps(s)));
        }
    }
}

/* The running maximum of the online softmax, lazily: the weights of a block
 * are 2^(c s - m) with m the maximum used so far, which is raised only when
 * some lane's block maximum exceeds it by more than FA_BF_LAZY (then m =
 * max(m, block max) in every lane, O^T and l are scaled by alpha = 2^(m_old -
 * m_new) and 1 is returned); otherwise the weights stay below 2^FA_BF_LAZY,
 * O^T and l are left alone and 0 is returned.  out = O / l and lse use the same
 * m, so the result is the softmax's whichever m was used; most blocks after
 * the first few skip the pass over O^T. */
static int FA_BF(newmax)(const float *st, int64_t n, float c, float *m, float *l, float *alpha)
{
    const __m512 vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY);
    __m512 mb[2];
    __mmask16 up = 0;
    for (int h = 0; h < 2; h++) {
        const float *s = st + 16 * h;
        __m512 mx0 = ninf, mx1 = ninf;
        int64_t r = 0;
        for (; r + 2 <= n; r += 2) {
            mx0 = _mm512_max_ps(_mm512_loadu_ps(s + r * FA_BF_MQ), mx0); /* NaN: ignored */
            mx1 = _mm512_max_ps(_mm512_loadu_ps(s + (r + 1) * FA_BF_MQ), mx1);
        }
        if (r < n) mx0 = _mm512_max_ps(_mm512_loadu_ps(s + r * FA_BF_MQ), mx0);
        mb[h] = _mm512_mul_ps(_mm512_max_ps(mx0, mx1), vc);
        const __m512 lim = _mm512_add_ps(_mm512_loadu_ps(m + 16 * h), _mm512_set1_ps(FA_BF_LAZY));
        up |= _mm512_cmp_ps_mask(mb[h], lim, _CMP_GT_OQ);
    }
    if (!up) return 0;
    for (int h = 0; h < 2; h++) {
        const __m512 mold = _mm512_loadu_ps(m + 16 * h);
        const __m512 mnew = _mm512_max_ps(mb[h], mold);
        /* -inf (nothing visible yet): alpha 1 (O and l are 0 there) */
        const __mmask16 live = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_UQ);
        const __m512 al = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), live,
                                             vf_exp2(_mm512_sub_ps(mold, _mm512_maskz_mov_ps(live, mnew))));
        _mm512_storeu_ps(l + 16 * h, _mm512_mul_ps(_mm512_loadu_ps(l + 16 * h), al));
        _mm512_storeu_ps(m + 16 * h, mnew);
        _mm512_storeu_ps(alpha + 16 * h, al);
    }
    return 1;
}

/* the weights of S^T rows 0..n-1: P = 2^(c s - m) (m -inf: relative to 0),
 * their float32 sums added to l, P^T (bfloat16, key pairs interleaved per
 * lane) written for rows up to round_up(n, 32), zero beyond n. */
static void FA_BF(weights)(const float *st, int64_t n, float c, const float *m, float *l,
                            uint32_t *pt, FA_BF(tiles) *w)
{
    /* the queued tile steps spread evenly over the 2 x npair iterations
     * (Bresenham: one each time acc passes the iteration count) */
    const int64_t nit = 2 * ((n + 31) / 32 * 16), nst = w->npv - w->ip + w->nqk - w->iq;
    int64_t acc = 0;
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                           1, 16, 0);
    const __m512 vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    const int64_t npair = (n + 31) / 32 * 16;
    const int f16 = w->f16;
    for (int h = 0; h < 2; h++) {
        const float *s = st + 16 * h;
        const __m512 mv = _mm512_loadu_ps(m + 16 * h);
        const __m512 msafe = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mv, ninf, _CMP_NEQ_UQ), mv);
        __m512 sum0 = zero, sum1 = zero;
        uint32_t *p = pt + h * (FA_BF_KB / 2) * 16;
        int64_t k = 0;
        for (; 2 * k + 1 < n; k++) {
            if ((acc += nst) >= nit) { acc -= nit; FA_BF(step)(w); }
            const __m512 p0 = fa_bf_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + 2 * k * FA_BF_MQ), vc, msafe));
            const __m512 p1 = fa_bf_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + (2 * k + 1) * FA_BF_MQ), vc, msafe));
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
            _mm512_storeu_si512((void *)(p + k * 16), _mm512_permutexvar_epi16(inter, fa_bf_cvt2(f16, p1, p0)));
        }
        for (; k < npair; k++) { /* the last odd row, then zeros up to 32 rows */
            if ((acc += nst) >= nit) { acc -= nit; FA_BF(step)(w); }
            __m512 p0 = zero;
            if (2 * k < n) p0 = fa_bf_exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + 2 * k * FA_BF_MQ), vc, msafe));
            sum0 = _mm512_add_ps(sum0, p0);
            _mm512_storeu_si512((void *)(p + k * 16), _mm512_permutexvar_epi16(inter, fa_bf_cvt2(f16, zero, p0)));
        }
        _mm512_storeu_ps(l + 16 * h, _mm512_add_ps(_mm512_loadu_ps(l + 16 * h), _mm512_add_ps(sum0, sum1)));
    }
    FA_BF(drain)(w);
}

/* O^T rows scaled by alpha (per query lane) */
static void FA_BF(rescale)(float *ot, int64_t Evp, const float *alpha)
{
    const __m512 a0 = _mm512_loadu_ps(alpha), a1 = _mm512_loadu_ps(alpha + 16);
    for (int64_t e = 0; e < Evp; e++) {
        float *o = ot + e * FA_BF_MQ;
        _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), a0));
        _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_loadu_ps(o + 16), a1));
    }
}

/* out rows q0 .. q0+nq-1 = O / l in bfloat16 (0 where l = 0: nothing
 * visible), lse = (m + log2 l) ln 2 (-inf there); bt: Evp x 32 bfloat16
 * scratch (for an output with column stride != 1) */
static void FA_BF(finish)(const fa_attention_args *a, int f16, const float *ot, const float *m,
                           const float *l, int64_t nq, uint16_t *out, float *lse, uint16_t *bt)
{
    __m512 inv[2];
    for (int h = 0; h < 2; h++) {
        const __m512 lv = _mm512_loadu_ps(l + 16 * h);
        const __mmask16 z = _mm512_cmp_ps_mask(lv, _mm512_setzero_ps(), _CMP_EQ_OQ);
        inv[h] = _mm512_maskz_div_ps((__mmask16)~z, _mm512_set1_ps(1.0f), lv); /* NaN stays */
    }
    /* per 16 x 16 block: O^T rows (lanes = queries) scaled, transposed to
     * query rows, rounded to bfloat16 */
    for (int h = 0; h < 2 && 16 * h < nq; h++)
        for (int64_t e0 = 0; e0 < a->Ev; e0 += 16) {
            __m512i r[16];
            for (int e = 0; e < 16; e++)
                r[e] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(ot + (e0 + e) * FA_BF_MQ + 16 * h), inv[h]));
            fa_bf_tr16(r);
            const int64_t ne = a->Ev - e0 < 16 ? a->Ev - e0 : 16;
            for (int n = 0; n < 16 && 16 * h + n < nq; n++) {
                uint16_t *o = out + (16 * h + n) * a->out.rs + e0 * a->out.cs;
                const __m512i b16 = fa_bf_cvt2(f16, _mm512_setzero_ps(), _mm512_castsi512_ps(r[n]));
#if !defined(FA_AVX512_SIMDE) /* (SIMDe lacks the masked 16-bit store) */
                if (a->out.cs == 1) {
                    _mm512_mask_storeu_epi16(o, (__mmask32)((1u << ne) - 1), b16);
                } else
#endif
                {
                    _mm512_storeu_si512((void *)bt, b16);
                    for (int64_t e = 0; e < ne; e++) o[e * a->out.cs] = bt[e];
                }
            }
        }
    for (int64_t i = 0; i < nq; i++)
        if (lse)
            lse[i * a->lse.rs] = l[i] > 0 ? (float)((m[i] + log2(l[i])) * 0.693147180559945309417)
                                          : (l[i] == 0 ? -INFINITY : l[i]);
}

/* The output columns of rows q0 .. q0+nq-1 that see a key with a NaN or Inf
 * value (packed as 0): IEEE's sum of w_j v_j over the visible keys there --
 * NaN for a NaN or for +Inf and -Inf together, else the infinity (weights
 * taken as > 0, as they are unless exp underflows). */
static void FA_BF(nonfinite)(const FA_BF(ctx) *x, int64_t b, const int64_t o[6], int64_t q0,
                              int64_t nq, const float *l, uint16_t *out)
{
    const fa_attention_args *a = x->a;
    const uint8_t *flag = x->nfk + b * a->S;
    const uint8_t *pad = a->pad.data ? (const uint8_t *)a->pad.data + o[4] : NULL;
    const uint16_t *v = (const uint16_t *)a->v.data + o[2];
    const fa_bf_bits bits = fa_bf_bits_of[x->f16];
    for (int64_t i = 0; i < nq; i++) {
        if (!(l[i] > 0)) continue; /* nothing visible, or already NaN */
        const int64_t qi = q0 + i;
        for (int64_t j = 0; j < a->S; j++) {
            if (!flag[j] || (pad && pad[j * a->pad.cs]) || (x->lim.has_hi && j > qi + x->lim.hi) ||
                (x->lim.has_lo && j < qi + x->lim.lo))
                continue;
            for (int64_t e = 0; e < a->Ev; e++) {
                const uint16_t h = v[j * a->v.rs + e * a->v.cs];
                if ((h & bits.exp) != bits.exp) continue;
                uint16_t *d = out + i * a->out.rs + e * a->out.cs;
                const int dnan = (*d & 0x7fff) > bits.exp, dinf = (*d & 0x7fff) == bits.exp;
                if ((h & bits.mant) || dnan || (dinf && *d != h))
                    *d = bits.qnan; /* NaN */
                else
                    *d = h; /* the infinity */
            }
        }
    }
}

/* phase 2, item it = (batch item, query block) */
static void FA_BF(item)(void *vctx, int64_t it, int tid)
{
    FA_BF(ctx) *x = (FA_BF(ctx) *)vctx;
    const fa_attention_args *a = x->a;
    const int64_t b = it / x->nqb, q0 = (it % x->nqb) * FA_BF_MQ;
    const int64_t nq = a->L - q0 < FA_BF_MQ ? a->L - q0 : FA_BF_MQ;
    const int64_t nd = x->Ep / 32;
    int64_t o[6];
    FA_BF(offsets)(a, b, o);
    /* scratch: tile file, S^T, P^T, O^T, Q^T, m, l, alpha */
    char *sc = x->scratch + (size_t)tid * x->scratch_bytes;
    fa_tilefile *tf = (fa_tilefile *)sc;
    float *st = (float *)(sc + fa_round_up(sizeof(fa_tilefile), 64));
    uint32_t *pt = (uint32_t *)(st + 2 * FA_BF_KB * FA_BF_MQ);
    float *ot = (float *)(pt + 2 * FA_BF_KB * 16);
    uint16_t *qt = (uint16_t *)(ot + x->Evp * FA_BF_MQ);
    float *m = (float *)(qt + nd * 2 * 512), *l = m + FA_BF_MQ, *alpha = l + FA_BF_MQ;
    const uint8_t *pad = a->pad.data ? (const uint8_t *)a->pad.data + o[4] : NULL;
    for (int i = 0; i < FA_BF_MQ; i++) { m[i] = -INFINITY; l[i] = 0; }
    memset(ot, 0, (size_t)(x->Evp * FA_BF_MQ) * 4);
    FA_BF(pack_qt)(a, (const uint16_t *)a->q.data + o[0], q0, nq, nd, qt);
    /* the keys any row of the block sees: [lo, hi) */
    int64_t lo = 0, hi = a->S;
    if (x->lim.has_lo && q0 + x->lim.lo > lo) lo = q0 + x->lim.lo;
    if (x->lim.has_hi && q0 + nq - 1 + x->lim.hi + 1 < hi) hi = q0 + nq - 1 + x->lim.hi + 1;
    const uint16_t *kp = x->kp + b * x->Sp * x->Ep, *vt = x->vt + b * x->Evp * x->vts;
    FT_CONFIG(tf);
    /* software-pipelined over the key blocks j: block j's weights (vector
     * units) are computed while the tile unit runs the queued P.V of block
     * j-1 and Q.K^T of block j+1 (FA_BF(weights) issues their steps) */
    FA_BF(tiles) w;
    memset(&w, 0, sizeof w);
    w.tf = tf;
    w.f16 = x->f16;
    int64_t k0 = lo / 32 * 32, kprev = 0, nprev = 0;
    int cur = 0;
    if (k0 < hi) {
        FA_BF(queue_qk)(&w, x, kp, k0, hi - k0 < FA_BF_KB ? hi - k0 : FA_BF_KB, qt, st);
        FA_BF(drain)(&w);
    }
    for (; k0 < hi; kprev = k0, k0 += FA_BF_KB, cur ^= 1) {
        const int64_t n = hi - k0 < FA_BF_KB ? hi - k0 : FA_BF_KB, k1 = k0 + FA_BF_KB;
        float *s = st + cur * FA_BF_KB * FA_BF_MQ;
        uint32_t *p = pt + cur * FA_BF_KB * 16;
        w.ip = w.iq = w.npv = w.nqk = 0;
        if (nprev) FA_BF(queue_pv)(&w, x, vt, kprev, nprev, pt + (cur ^ 1) * FA_BF_KB * 16, ot);
        if (pad || fa_limits_cut(&x->lim, q0, FA_BF_MQ, k0, n)) FA_BF(mask)(x, pad, k0, n, q0, s);
        if (FA_BF(newmax)(s, n, x->c, m, l, alpha)) {
            FA_BF(drain)(&w); /* O^T complete up to block j-1 before it is scaled */
            FA_BF(rescale)(ot, x->Evp, alpha);
        }
        if (k1 < hi)
            FA_BF(queue_qk)(&w, x, kp, k1, hi - k1 < FA_BF_KB ? hi - k1 : FA_BF_KB, qt,
                            st + (cur ^ 1) * FA_BF_KB * FA_BF_MQ);
        FA_BF(weights)(s, n, x->c, m, l, p, &w);
        nprev = n;
    }
    w.ip = w.iq = w.npv = w.nqk = 0;
    if (nprev) {
        FA_BF(queue_pv)(&w, x, vt, kprev, nprev, pt + (cur ^ 1) * FA_BF_KB * 16, ot);
        FA_BF(drain)(&w);
    }
    FT_RELEASE(tf);
    FA_BF(finish)(a, x->f16, ot, m, l, nq, (uint16_t *)a->out.data + o[3] + q0 * a->out.rs,
                  a->lse.data ? (float *)a->lse.data + o[5] + q0 * a->lse.rs : NULL,
                  (uint16_t *)st);
    if (x->nnf[b])
        FA_BF(nonfinite)(x, b, o, q0, nq, l, (uint16_t *)a->out.data + o[3] + q0 * a->out.rs);
}

int FA_BF_FN(const fa_attention_args *a)
{
    if (a->E > FA_BF_MAX_E || a->Ev > FA_BF_MAX_E || a->L < 1 || a->S < 1 || a->E < 1 ||
        a->Ev < 1 || !(a->scale > 0))
        return FA_BF16_DECLINED;
#if defined(FA_AMX_FP16)
    const int f16 = a->storage == FA_FLOAT16 && fa_amx_fp16();
#else
    const int f16 = 0;
#endif
    if (a->storage != FA_BFLOAT16 && !f16) return FA_BF16_DECLINED;
    FA_BF(ctx) x;
    memset(&x, 0, sizeof x);
    x.a = a;
    x.f16 = f16;
    x.lim = fa_limits_of(a);
    x.nb = 1;
    for (int d = 0; d < a->nbatch_dims; d++) x.nb *= a->batch_shape[d];
    if (x.nb == 0) return FA_BF16_DECLINED;
    x.nqb = (a->L + FA_BF_MQ - 1) / FA_BF_MQ;
    x.Sp = fa_round_up(a->S, 32);
    x.Ep = fa_round_up(a->E, 32);
    x.Evp = fa_round_up(a->Ev, 16);
    x.vts = x.Sp + 32;
    x.c = (float)(a->scale * 1.44269504088896340736);
    const int nt = fa_resolve_threads(a->num_threads);
    x.scratch_bytes = fa_round_up(fa_round_up(sizeof(fa_tilefile), 64) +
                                  (size_t)2 * FA_BF_KB * FA_BF_MQ * 4 + (size_t)2 * FA_BF_KB * 16 * 4 +
                                  (size_t)x.Evp * FA_BF_MQ * 4 + (size_t)(x.Ep / 32) * 2 * 512 * 2 +
                                  3 * FA_BF_MQ * 4, 64);
    const size_t packed = (size_t)x.nb * ((size_t)x.Sp * (size_t)x.Ep + (size_t)x.vts * (size_t)x.Evp) * 2;
    /* both 64-byte aligned (a tile row, a cache line: unaligned rows would
     * straddle two lines on every tile load) */
    void *kmem = fa_malloc(packed + 64), *smem = fa_malloc(x.scratch_bytes * (size_t)nt + 64);
    x.nnf = (int64_t *)fa_calloc((size_t)x.nb, sizeof(int64_t) + (size_t)a->S);
    if (!kmem || !smem || !x.nnf) {
        fa_free(kmem); fa_free(smem); fa_free(x.nnf);
        return FA_ENOMEM;
    }
    x.nfk = (uint8_t *)(x.nnf + x.nb);
    x.kp = (uint16_t *)((char *)kmem + (64 - (uintptr_t)kmem % 64) % 64);
    x.scratch = (char *)smem + (64 - (uintptr_t)smem % 64) % 64;
    x.vt = x.kp + x.nb * x.Sp * x.Ep;
    fa_parallel_for(nt, FA_SCHED_STATIC, x.nb, FA_BF(pack), &x);
    /* dynamic: an item's result does not depend on the thread that runs it */
    fa_parallel_for(nt, FA_SCHED_DYNAMIC, x.nb * x.nqb, FA_BF(item), &x);
    fa_free(kmem); fa_free(smem); fa_free(x.nnf);
    return FA_OK;
}
