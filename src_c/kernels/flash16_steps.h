/* flash16_steps.h -- the 16-bit matrix path's dot-product steps (contract:
 * kernels/flash16.h), over simd/bf16_tiles.h: on amx (FA_SIMD_AMX) tile
 * steps, on avx512_bf16 register-blocked VDPBF16PS steps; the queue that
 * hands them to the softmax step.  Included by kernels_isa.c where the
 * mapping defines FA_SIMD_BF16; FL(name) -> flash16_<name>_<isa>
 * (flash16_qk_step_amx, flash16_drain_avx512_bf16, ...). */

#define MQ FA_FLASH16_MQ
#define HALF FA_FLASH16_HALF
#define TILE FA_FLASH16_TILE
#define EPAIR FA_FLASH16_EPAIR
#define PT_HALF (FL_KB / 2 * HALF) /* dwords of P^T per query half */

#if defined(FA_SIMD_AMX)
/* the call's type: TDPFP16PS for float16 where the build has it */
#if defined(FA_AMX_FP16)
#define FL_DP(w, tf, c, a, b)                                                                  \
    do {                                                                                       \
        if ((w)->f16) FT_DP_F16(tf, c, a, b); else FT_DP(tf, c, a, b);                        \
    } while (0)
#else
#define FL_DP(w, tf, c, a, b) FT_DP(tf, c, a, b)
#endif
/* Tile registers of both steps: C 0-3 (2 A tiles x 2 query halves), A 4-5,
 * B 6-7.  Q.K^T step j: key tile pair j / e_tiles, E pairs 16 (j % e_tiles)..,
 * each C tile summed from 0 over the E pairs in order. */
static inline void FL(qk_step)(fa_flash16_queue *w, int64_t j)
{
    fa_tilefile *tf = (fa_tilefile *)w->tf;
    (void)tf; /* (the AMX macros name tile registers, not tf) */
    const int64_t t = j / w->e_tiles * 2, kk = j % w->e_tiles, k_bytes = w->ep * 2;
    const int two = t + 1 < w->key_tiles;
    const uint16_t *k0 = w->kp + t * FT_ROWS * w->ep;
    if (kk == 0) {
        FT_ZERO(tf, 0); FT_ZERO(tf, 1);
        if (two) { FT_ZERO(tf, 2); FT_ZERO(tf, 3); }
    }
    FT_LOAD(tf, 4, k0 + kk * EPAIR, k_bytes);
    FT_LOAD(tf, 6, w->qt + (kk * 2) * TILE, FT_COLSB);
    FT_LOAD(tf, 7, w->qt + (kk * 2 + 1) * TILE, FT_COLSB);
    FL_DP(w, tf, 0, 4, 6); FL_DP(w, tf, 1, 4, 7);
    if (two) {
        FT_LOAD(tf, 5, k0 + FT_ROWS * w->ep + kk * EPAIR, k_bytes);
        FL_DP(w, tf, 2, 5, 6); FL_DP(w, tf, 3, 5, 7);
    }
    if (kk == w->e_tiles - 1) {
        float *s0 = w->st + t * FT_ROWS * MQ, *s1 = s0 + FT_ROWS * MQ;
        FT_STORE(tf, 0, s0, MQ * 4); FT_STORE(tf, 1, s0 + HALF, MQ * 4);
        if (two) { FT_STORE(tf, 2, s1, MQ * 4); FT_STORE(tf, 3, s1 + HALF, MQ * 4); }
    }
}

/* P.V step j: Ev tile pair j / key_chunks, keys 32 (j % key_chunks) ..; the C tiles
 * loaded from O^T at the first 32-key chunk, stored after the last */
static inline void FL(pv_step)(fa_flash16_queue *w, int64_t j)
{
    fa_tilefile *tf = (fa_tilefile *)w->tf;
    (void)tf;
    const int64_t et = j / w->key_chunks * 2, c = j % w->key_chunks;
    const int64_t vt_bytes = w->vt_rs * 2, o_bytes = MQ * 4;
    const int two = et + 1 < w->evp / FT_ROWS;
    float *o0 = w->ot + et * FT_ROWS * MQ, *o1 = o0 + FT_ROWS * MQ;
    if (c == 0) {
        FT_LOAD(tf, 0, o0, o_bytes); FT_LOAD(tf, 1, o0 + HALF, o_bytes);
        if (two) { FT_LOAD(tf, 2, o1, o_bytes); FT_LOAD(tf, 3, o1 + HALF, o_bytes); }
    }
    FT_LOAD(tf, 4, w->vt + et * FT_ROWS * w->vt_rs + c * FA_FLASH16_KGRID, vt_bytes);
    FT_LOAD(tf, 6, w->pt + c * FT_ROWS * HALF, FT_COLSB);
    FT_LOAD(tf, 7, w->pt + PT_HALF + c * FT_ROWS * HALF, FT_COLSB);
    FL_DP(w, tf, 0, 4, 6); FL_DP(w, tf, 1, 4, 7);
    if (two) {
        FT_LOAD(tf, 5, w->vt + (et + 1) * FT_ROWS * w->vt_rs + c * FA_FLASH16_KGRID, vt_bytes);
        FL_DP(w, tf, 2, 5, 6); FL_DP(w, tf, 3, 5, 7);
    }
    if (c == w->key_chunks - 1) {
        FT_STORE(tf, 0, o0, o_bytes); FT_STORE(tf, 1, o0 + HALF, o_bytes);
        if (two) { FT_STORE(tf, 2, o1, o_bytes); FT_STORE(tf, 3, o1 + HALF, o_bytes); }
    }
}

/* steps: one per key tile pair and E tile; one per Ev tile pair and 32 keys */
#define FL_QK_STEPS(key_tiles, e_tiles) (((key_tiles) + 1) / 2 * (e_tiles))
#define FL_PV_STEPS(evp, key_chunks) (((evp) / FT_ROWS + 1) / 2 * (key_chunks))
#elif defined(FA_SIMD_NEON_BF16)
/* neon_bf16: a step is 8 rows of C (keys of S^T, or Ev rows of O^T) x 8
 * query lanes, 4 x 4 BFMMLA accumulators of 2 x 2 (C rows 2p, 2p+1 x
 * queries 2c, 2c+1), summed over the whole reduction (E, or the block's
 * keys) in groups of 4 in order: per group 4 A and 4 B registers loaded for
 * 16 BFMMLA.  A and B in BFMMLA's layout (simd/flash16_neon.h): A, rows
 * r, r+1 of K or V^T at group g, row r + (g & 1), column 8 (g >> 1); B, of
 * Q^T or P^T (rows of M16_W dwords: tile or half h = the 16 queries of the
 * step), the step's query pair c at row 2g + (c & 1), quad c / 2 from the
 * step's first. */
#define FL_MM_ROWS 8
#define FL_MM_COLS 8
#define FL_MM_NQ (FA_FLASH16_MQ / FL_MM_COLS) /* steps across the 32 query lanes */
#define FL_QK_STEPS(key_tiles, e_tiles) ((key_tiles) * (FT_ROWS / FL_MM_ROWS) * FL_MM_NQ)
#define FL_PV_STEPS(evp, key_chunks) ((evp) / FL_MM_ROWS * FL_MM_NQ)
/* one group: acc[p][c] += A_p B_c, A_p at a + p as2 (the row pairs), B_c at
 * b + (c & 1) bs + 8 (c >> 1) (the query pairs) */
#define FL_MM_GROUP(a, as2, b, bs)                                                             \
    do {                                                                                       \
        m4_vi a_[4], b_[4];                                                                    \
        for (int p = 0; p < 4; p++) a_[p] = m4_load((a) + p * (as2));                          \
        for (int c = 0; c < 4; c++) b_[c] = m4_load((b) + (c & 1) * (bs) + (c >> 1) * 8);      \
        for (int p = 0; p < 4; p++)                                                            \
            for (int c = 0; c < 4; c++) acc[p][c] = fa_bfmmla(acc[p][c], a_[p], b_[c]);        \
    } while (0)
/* C rows 2p, 2p + 1 of c0 (row stride MQ) at the step's query lanes q0 ..
 * q0 + 7 into acc[p], or from it */
#define FL_MM_LOAD(c0, q0, p)                                                                  \
    for (int c = 0; c < 4; c++)                                                                \
        acc[p][c] = m4_load_c((c0) + (2 * (p)) * MQ + (q0) + 4 * (c >> 1),                     \
                              (c0) + (2 * (p) + 1) * MQ + (q0) + 4 * (c >> 1), c & 1)
#define FL_MM_STORE(c0, q0, p)                                                                 \
    for (int c = 0; c < 4; c += 2)                                                             \
        m4_store_c((c0) + (2 * (p)) * MQ + (q0) + 2 * c, (c0) + (2 * (p) + 1) * MQ + (q0) + 2 * c, \
                   acc[p][c], acc[p][c + 1])

/* Q.K^T step j: S^T rows (keys) 8 (j / FL_MM_NQ) .. x query lanes
 * 8 (j % FL_MM_NQ) .., from 0 over E */
static inline void FL(qk_step)(fa_flash16_queue *w, int64_t j)
{
    const int64_t r0 = j / FL_MM_NQ * FL_MM_ROWS, q0 = j % FL_MM_NQ * FL_MM_COLS;
    const int64_t ep = w->ep, dq = 8 * (q0 % HALF / 4); /* halves to the step's first quad */
    const uint16_t *k = w->kp + r0 * ep, *qt = w->qt + q0 / HALF * TILE + dq;
    m4_vf acc[4][4];
    for (int p = 0; p < 4; p++)
        for (int c = 0; c < 4; c++) acc[p][c] = m4f_zero();
    /* group 8 kk + g: A quad 4 kk + g / 2 of row g % 2 of each pair; B in
     * tile (kk, h), rows 2g + (c & 1).  One group per iteration (unroll 1):
     * unrolled, gcc moves accumulators between registers, a MOV more on
     * each chain of BFMMLA (bench/README.md, "neon_bf16 by llvm-mca") */
    for (int64_t kk = 0; kk < w->e_tiles; kk++) {
        const uint16_t *a = k + 32 * kk, *b = qt + kk * 2 * TILE;
#pragma GCC unroll 1
        for (int g = 0; g < 8; g++)
            FL_MM_GROUP(a + (g & 1) * ep + 8 * (g >> 1), 2 * ep, b + 2 * g * EPAIR, EPAIR);
    }
    float *s = w->st + r0 * MQ;
    for (int p = 0; p < 4; p++) FL_MM_STORE(s, q0, p);
}

/* P.V step j: O^T rows (Ev) 8 (j / FL_MM_NQ) .. x query lanes 8 (j % FL_MM_NQ)
 * .. += V^T . P^T over the block's keys */
static inline void FL(pv_step)(fa_flash16_queue *w, int64_t j)
{
    const int64_t e0 = j / FL_MM_NQ * FL_MM_ROWS, q0 = j % FL_MM_NQ * FL_MM_COLS;
    const int64_t rs = w->vt_rs, dq = 4 * (q0 % HALF / 4); /* dwords to the step's first quad */
    const uint16_t *v = w->vt + e0 * rs;
    const uint32_t *pt = w->pt + q0 / HALF * PT_HALF + dq;
    m4_vf acc[4][4];
    float *o = w->ot + e0 * MQ;
    for (int p = 0; p < 4; p++) FL_MM_LOAD(o, q0, p);
    /* group g (keys 4g ..): A quad g / 2 of row g % 2 of each pair; B rows
     * 2g + (c & 1) of P^T; one group per iteration, as in qk_step */
    const uint16_t *b = (const uint16_t *)pt;
#pragma GCC unroll 1
    for (int64_t g = 0; g < w->key_chunks * (FA_FLASH16_KGRID / 4); g++)
        FL_MM_GROUP(v + (g & 1) * rs + 8 * (g >> 1), 2 * rs, b + 2 * g * 2 * HALF, 2 * HALF);
    for (int p = 0; p < 4; p++) FL_MM_STORE(o, q0, p);
}
#undef FL_MM_GROUP
#undef FL_MM_LOAD
#undef FL_MM_STORE
#else
/* avx512_bf16: a step is FA_DP16_ROWS rows of C (keys of S^T, or Ev rows of
 * O^T) x the 32 query lanes (two vectors per row) summed over the whole
 * reduction (E, or the block's keys) in one pass, reading A and B where
 * they lie (K rows, Q^T, V^T, P^T): each A dword broadcast once for two
 * VDPBF16PS, each B row loaded once per FA_DP16_ROWS rows, C loaded and
 * stored once per step. */
#define FL_QK_STEPS(key_tiles, e_tiles) ((key_tiles) * (FT_ROWS / FA_DP16_ROWS)) /* all of E each */
#define FL_PV_STEPS(evp, key_chunks) ((evp) / FA_DP16_ROWS) /* all the keys each */
/* C rows i < FA_DP16_ROWS (acc[i][0..1]) += sum over pairs k < np of
 * A[i][k] B[k]: A's row i at pair k is A + i * astr + 2k (uint16_t), B's two
 * halves of pair row k at B0, B1 (expressions of k) */
#define FL_ACC_LOOP(np, A, astr, B0, B1)                                                       \
    for (int64_t k = 0; k < (np); k++) {                                                       \
        const m16_vi b0 = m16_load(B0), b1 = m16_load(B1);                                     \
        for (int i = 0; i < FA_DP16_ROWS; i++) {                                               \
            const m16_vi ai = m16_bcast_pair((A) + i * (astr) + 2 * k);                        \
            acc[i][0] = fa_dpbf16(acc[i][0], ai, b0);                                          \
            acc[i][1] = fa_dpbf16(acc[i][1], ai, b1);                                          \
        }                                                                                      \
    }

/* Q.K^T step j: S^T rows (keys) FA_DP16_ROWS j .. of the block, from 0 */
static inline void FL(qk_step)(fa_flash16_queue *w, int64_t j)
{
    m16_vf acc[FA_DP16_ROWS][2];
    for (int i = 0; i < FA_DP16_ROWS; i++) acc[i][0] = acc[i][1] = m16f_zero();
    /* A: K rows (E pairs); B: Q^T tile (k / 16, h), row k % 16 */
    const uint16_t *kr = w->kp + j * FA_DP16_ROWS * w->ep, *qt = w->qt;
    FL_ACC_LOOP(w->e_tiles * FT_ROWS, kr, w->ep,
                qt + (k / FT_ROWS * 2) * TILE + k % FT_ROWS * EPAIR,
                qt + (k / FT_ROWS * 2 + 1) * TILE + k % FT_ROWS * EPAIR)
    float *s = w->st + j * FA_DP16_ROWS * MQ;
    for (int i = 0; i < FA_DP16_ROWS; i++) {
        m16f_store(s + i * MQ, acc[i][0]);
        m16f_store(s + i * MQ + HALF, acc[i][1]);
    }
}

/* P.V step j: O^T rows (Ev) FA_DP16_ROWS j .. += V^T . P^T over the block's keys */
static inline void FL(pv_step)(fa_flash16_queue *w, int64_t j)
{
    m16_vf acc[FA_DP16_ROWS][2];
    float *o = w->ot + j * FA_DP16_ROWS * MQ;
    for (int i = 0; i < FA_DP16_ROWS; i++) {
        acc[i][0] = m16f_load(o + i * MQ);
        acc[i][1] = m16f_load(o + i * MQ + HALF);
    }
    /* A: V^T rows (key pairs); B: P^T pair rows of each half */
    const uint16_t *vr = w->vt + j * FA_DP16_ROWS * w->vt_rs;
    const uint32_t *pt = w->pt;
    FL_ACC_LOOP(w->key_chunks * FT_ROWS, vr, w->vt_rs, pt + k * HALF, pt + PT_HALF + k * HALF)
    for (int i = 0; i < FA_DP16_ROWS; i++) {
        m16f_store(o + i * MQ, acc[i][0]);
        m16f_store(o + i * MQ + HALF, acc[i][1]);
    }
}
#undef FL_ACC_LOOP
#endif

/* the next queued step, if any: Q.K^T's first (the next block's softmax
 * waits on their S^T), then P.V's */
static inline void FL(step)(fa_flash16_queue *w)
{
    if (w->iq < w->nqk) FL(qk_step)(w, w->iq++);
    else if (w->ip < w->npv) FL(pv_step)(w, w->ip++);
}

static void FL(drain)(fa_flash16_queue *w)
{
    while (w->iq < w->nqk || w->ip < w->npv) FL(step)(w);
}

static void FL(queue_pv)(fa_flash16_queue *w, const uint16_t *vt, int64_t vt_rs, int64_t evp,
                         int64_t n, const uint32_t *pt, float *ot)
{
    w->vt = vt;
    w->vt_rs = vt_rs;
    w->evp = evp;
    w->pt = pt;
    w->key_chunks = fa_div_up(n, FA_FLASH16_KGRID);
    w->ot = ot;
    w->npv = FL_PV_STEPS(evp, w->key_chunks);
}

static void FL(queue_qk)(fa_flash16_queue *w, const uint16_t *kp, int64_t ep, int64_t n,
                         const uint16_t *qt, float *st)
{
    w->kp = kp;
    w->ep = ep;
    w->e_tiles = ep / EPAIR;
    w->key_tiles = fa_div_up(n, FT_ROWS);
    w->qt = qt;
    w->st = st;
    w->nqk = FL_QK_STEPS(w->key_tiles, w->e_tiles);
}

static void FL(tiles_on)(void *tf)
{
    (void)tf;
    FT_CONFIG((fa_tilefile *)tf);
}
static void FL(tiles_off)(void *tf)
{
    (void)tf;
    FT_RELEASE((fa_tilefile *)tf);
}

#undef MQ
#undef HALF
#undef TILE
#undef EPAIR
