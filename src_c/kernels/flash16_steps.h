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
#define PT_HALF (FA_FLASH16_KB / 2 * HALF) /* dwords of P^T per query half */

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
