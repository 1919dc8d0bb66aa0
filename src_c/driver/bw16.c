/* bw16.c -- fa_backward16: the backward pass of bfloat16 storage (and
 * float16 where the amx tier has AMX-FP16) on the matrix instructions: the
 * five products of every (query block, key block) pair run on the ISA's
 * fa_bw16_kernels (kernels.h: TDPBF16PS / TDPFP16PS tiles on amx,
 * VDPBF16PS on avx512_bf16), the 16-bit inputs read as they are.  backward.c
 * calls it where the table has them, after its own checks.
 *
 * Everything else is the float32 backward's (backward_tmpl.h), in float32:
 * the same plan rules (the fused pass, one item per key head, or the two
 * passes, chosen by bw_scheme.h), the same checks before anything is
 * written, the same D_i - g_i and sink gradient, the scores rebuilt by the
 * forward's soft cap, ALiBi and mask code, P = exp(s - lse) and dS by the
 * same rule.  S and dP come from the exact 16-bit inputs, accumulated in
 * float32; P and dS are rounded to 16 bits (nearest even) only as the
 * operands of dV += P^T dO, dK += dS^T Q and dQ += dS K, whose accumulators
 * are float32 over all blocks, each gradient rounded once as it is stored
 * (grad_storage 16-bit) or stored in float32 for the caller to sum and
 * round.  Each accumulator element is summed in one fixed order (dQ over
 * the key blocks, dK and dV over the key head's batch indices and their
 * query blocks, in order), the same in both schemes and on any thread:
 * bitwise the same gradients for any thread count. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/bw16.h"
#include "driver/bw_scheme.h"
#include "driver/offsets.h"
#include "driver/window.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

#define FA_SFX f32
#define FN(name) FA_CAT(name, FA_SFX)
#define FA_T float
#define KT fa_kernels_f32
#define KCUR fa_kernels_f32_current
#include "driver/storage_tmpl.h"   /* ld_f32: one element of a 16-bit operand */
#include "driver/tiles_tmpl.h"     /* apply_masks_f32 */
#include "driver/scoreopts_tmpl.h" /* score_opts_f32 */

/* the forward's parts this pass does not call (static inline or not) */
static inline void bw16_unused(void)
{
    (void)row_finish_f32, (void)pack_q_f32, (void)pack_k_f32, (void)pack_v_f32;
    (void)pv_careful_f32;
}

/* Query rows per block (a multiple of 32): 256, four times the float32
 * backward's, since dV^T += dO^T P and dK^T += Q^T dS run over the block's
 * rows: each of their accumulator tiles is loaded and stored once per 128
 * query pairs.  On AMX a tile's round trip stalls the tile unit (no tile is
 * renamed: the store waits for the last product, the load for the store),
 * so the longer chain takes 10% off the backward at E = 128 and 5% at
 * E = 64 (against 128 rows, an Intel Xeon, 2026-12-05).  The pair's float32
 * tiles (s, dp, f: 128 KiB each) and an item's dK^T and dV^T (1 MiB at
 * E = 128, S = 1024) still share the 2 MiB L2.  Every gradient element is
 * still summed in the same order, so this size changes no bit. */
#define BW16_BQ 256
#define BW16_KB FA_KC    /* keys per block (a multiple of 32) */

/* One thread's scratch, byte offsets (each 64-byte aligned); the pieces
 * are described in bw16_pair.h; key blocks nkp at a stride of one block. */
typedef struct bw16_layout {
    int64_t kt, vt, kk, qr, dor, qt, dot, s, dp, f, pp, dsp, dsr, dq, dkt, dvt, tr, tile, total;
    int64_t kt_n, vt_n, kk_n; /* halves of one key block's piece */
} bw16_layout;

typedef struct bw16_plan {
    const fa_backward_args *b;
    const fa_kernels_f32 *K;
    const fa_bw16_kernels *M;
    const fa_flash16_kernels *T;
    fa_attention_args nocap;   /* fwd without its soft cap (ALiBi alone) */
    fa_limits lim;
    bw16_layout lay;
    int f16, fused, nt;
    int fold;                  /* the scale left to grad_pair (bw16_scores) */
    int g16;                   /* the gradients written rounded to 16 bits */
    uint16_t eb;               /* the type's exponent bits */
    int64_t nbatch, nqb, nkb, nkp;
    int64_t grp, nkh;          /* batch indices per key head, key heads (bw_scheme.h) */
    int64_t ep, evp, e16, ev16; /* E, Ev rounded up to 32 and to 16 */
    int64_t ldt;               /* row stride of dK^T, dV^T: nkp key blocks and a line */
    unsigned char **bufs;
    int *flags;                /* per check item: a -inf lse on a row that sees a key */
    int *kbad;                 /* fused: per thread and key block, bw16_keys' flag */
    float *delta;              /* [nbatch x L]: D_i - g_i */
} bw16_plan;

/* query rows i0 .. i0 + nq padded to qpad, keys kb .. kb + nk to kpad (32) */
typedef struct bw16_pair {
    int64_t i0, nq, qpad, kb, nk, kpad;
} bw16_pair;

/* A pair's operands and tiles in a thread's scratch (bw16_pair.h). */
typedef struct bw16_ops {
    void *tf;
    uint16_t *kt, *vt, *kk;    /* the pair's key block */
    uint16_t *qr, *dor, *qt, *dot, *pp, *dsp, *dsr;
    float *s, *dp, *f, *dq, *dkt, *dvt;
    float *tr;                 /* KB rows of dK or dV back from dK^T, dV^T */
    int64_t ldt;
    int kbad, qbad, dobad;     /* K, Q, dO hold NaN/Inf: the careful products */
} bw16_ops;

#include "driver/bw16_pair.h"

static int64_t bw16_piece(int64_t *at, int64_t bytes)
{
    const int64_t here = *at;
    *at += fa_round_up(bytes > 0 ? bytes : 1, FA_ALIGN);
    return here;
}

static void bw16_layout_of(bw16_plan *pl)
{
    bw16_layout *y = &pl->lay;
    const int64_t nkp = pl->nkp, bq = BW16_BQ, kb = BW16_KB;
    int64_t at = 0;
    y->kt_n = pl->ep * kb;
    y->vt_n = pl->evp * kb;
    y->kk_n = kb * pl->e16;
    y->kt = bw16_piece(&at, nkp * y->kt_n * 2);
    y->vt = bw16_piece(&at, nkp * y->vt_n * 2);
    y->kk = bw16_piece(&at, nkp * y->kk_n * 2);
    y->qr = bw16_piece(&at, bq * pl->ep * 2);
    y->dor = bw16_piece(&at, bq * pl->evp * 2);
    y->qt = bw16_piece(&at, pl->e16 * bq * 2);
    y->dot = bw16_piece(&at, pl->ev16 * bq * 2);
    y->s = bw16_piece(&at, bq * kb * 4);
    y->dp = bw16_piece(&at, bq * kb * 4);
    y->f = bw16_piece(&at, bq * kb * 4);
    y->pp = bw16_piece(&at, bq * kb * 2);
    y->dsp = bw16_piece(&at, bq * kb * 2);
    y->dsr = bw16_piece(&at, bq * kb * 2);
    y->dq = bw16_piece(&at, bq * pl->e16 * 4);
    y->dkt = bw16_piece(&at, pl->e16 * pl->ldt * 4);
    y->dvt = bw16_piece(&at, pl->ev16 * pl->ldt * 4);
    y->tr = bw16_piece(&at, kb * (pl->e16 > pl->ev16 ? pl->e16 : pl->ev16) * 4);
    y->tile = bw16_piece(&at, pl->T->tile_bytes);
    y->total = at + FA_ALIGN; /* room to align the base */
}

/* The plan; 0 if there is nothing to compute. */
static int bw16_make(bw16_plan *pl, const fa_backward_args *g, int f16)
{
    const fa_attention_args *a = &g->fwd;
    memset(pl, 0, sizeof *pl);
    pl->b = g;
    pl->K = fa_kernels_f32_current();
    pl->M = &pl->K->bw16;
    pl->T = &pl->K->flash16;
    pl->f16 = f16;
    pl->g16 = g->grad_storage == a->storage;
    pl->eb = fa_half_bits_of(f16).exp;
    pl->nbatch = 1;
    for (int d = 0; d < a->nbatch_dims; d++) pl->nbatch *= a->batch_shape[d];
    if (pl->nbatch == 0 || a->L == 0 || a->S == 0) return 0;
    pl->ep = fa_round_up(a->E, 32);
    pl->evp = fa_round_up(a->Ev, 32);
    pl->e16 = fa_round_up(a->E, 16);
    pl->ev16 = fa_round_up(a->Ev, 16);
    pl->nqb = fa_div_up(a->L, BW16_BQ);
    pl->nkb = fa_div_up(a->S, BW16_KB);
    pl->lim = fa_limits_of(a);
    pl->grp = fa_bw_group(g); /* >= 1: fa_attention_backward checked it */
    pl->nkh = pl->nbatch / pl->grp;
    int nt = fa_resolve_threads(a->num_threads);
    const double work = (double)pl->nbatch * (double)a->L * (double)a->S * (double)(a->E + a->Ev);
    if (work < FA_PARALLEL_MIN_WORK) nt = 1;
    /* the float32 backward's rule and bound, so that both bound memory alike */
    pl->fused = fa_bw_fuses(pl->nkh, nt, a->S, a->E, a->Ev, 4);
    pl->nkp = pl->fused ? pl->nkb : 1;
    /* a line past the keys: rows 4 KiB apart would share one L1 set, and a
     * tile's 16 rows of dK^T evict each other (3% at E = 128, S = 1024) */
    pl->ldt = pl->nkp * BW16_KB + 16;
    const int64_t nq_items = pl->nbatch * pl->nqb, nkv_items = pl->nkh * pl->nkb;
    const int64_t most = pl->fused ? pl->nkh : nq_items > nkv_items ? nq_items : nkv_items;
    pl->nt = (int64_t)nt > most ? (int)most : (nt < 1 ? 1 : nt);
    pl->nocap = *a;
    pl->nocap.softcap = 0;
    pl->fold = a->scale > 0 && !(a->softcap > 0) && !a->alibi.data && !a->add_mask.data;
    bw16_layout_of(pl);
    return 1;
}

static void bw16_free(bw16_plan *pl)
{
    if (pl->bufs)
        for (int t = 0; t < pl->nt; t++) fa_free(pl->bufs[t]);
    fa_free(pl->bufs);
    fa_free(pl->flags);
    fa_free(pl->kbad);
    fa_free(pl->delta);
}

static int bw16_alloc(bw16_plan *pl)
{
    pl->bufs = (unsigned char **)fa_calloc((size_t)pl->nt, sizeof(unsigned char *));
    pl->flags = (int *)fa_calloc((size_t)(pl->nbatch * pl->nqb), sizeof(int));
    pl->kbad = (int *)fa_calloc((size_t)(pl->nt * pl->nkp), sizeof(int));
    pl->delta = (float *)fa_malloc((size_t)(pl->nbatch * pl->b->fwd.L) * sizeof(float));
    if (!pl->bufs || !pl->flags || !pl->kbad || !pl->delta) { bw16_free(pl); return FA_ENOMEM; }
    for (int t = 0; t < pl->nt; t++) {
        pl->bufs[t] = (unsigned char *)fa_malloc((size_t)pl->lay.total);
        if (!pl->bufs[t]) { bw16_free(pl); return FA_ENOMEM; }
    }
    return FA_OK;
}

/* Thread tid's operands: the pieces of its 64-byte aligned scratch (key
 * block slot 0; bw16_slot moves the key pointers). */
static bw16_ops bw16_ops_of(const bw16_plan *pl, int tid)
{
    uintptr_t p = (uintptr_t)pl->bufs[tid];
    unsigned char *x = (unsigned char *)((p + FA_ALIGN - 1) / FA_ALIGN * FA_ALIGN);
    const bw16_layout *y = &pl->lay;
    bw16_ops o;
    memset(&o, 0, sizeof o);
    o.tf = x + y->tile;
    o.kt = (uint16_t *)(x + y->kt);
    o.vt = (uint16_t *)(x + y->vt);
    o.kk = (uint16_t *)(x + y->kk);
    o.qr = (uint16_t *)(x + y->qr);
    o.dor = (uint16_t *)(x + y->dor);
    o.qt = (uint16_t *)(x + y->qt);
    o.dot = (uint16_t *)(x + y->dot);
    o.pp = (uint16_t *)(x + y->pp);
    o.dsp = (uint16_t *)(x + y->dsp);
    o.dsr = (uint16_t *)(x + y->dsr);
    o.s = (float *)(x + y->s);
    o.dp = (float *)(x + y->dp);
    o.f = (float *)(x + y->f);
    o.dq = (float *)(x + y->dq);
    o.dkt = (float *)(x + y->dkt);
    o.dvt = (float *)(x + y->dvt);
    o.tr = (float *)(x + y->tr);
    o.ldt = pl->ldt;
    return o;
}

#include "driver/bw16_items.h" /* the work items and fa_backward16 */
