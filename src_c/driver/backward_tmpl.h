/* backward_tmpl.h -- the backward pass, written once over the element type:
 * included twice by backward.c with FA_SFX (f32, f64) defined.  Every
 * function is named FN(name) -> name_<FA_SFX>, e.g. FN(backward) ->
 * backward_f32, backward_f64; likewise bw_plan, bw_make, bw_alloc,
 * bw_free, bw_check_item, bw_dq_item, bw_dkv_item, bw_pass_item,
 * bw_fused_item.
 *
 * FlashAttention-2's order, with no atomics, in one of two schemes chosen
 * by the shape and the threads (bw_scheme.h).  A key head is the grp batch
 * indices that share its dK, dV (grouped query heads, bw_scheme.h's
 * fa_bw_group; grp = 1 without them).  Fused: a work item is one key head,
 * owning its dK, dV (float accumulators in its thread's scratch) and
 * looping over its batch indices in order, each over its query blocks in
 * order, each a float dQ tile summed over the key blocks in order; each
 * (query block, key block) pair computes S, dP, dQ, dV and dK once: five
 * products.  Two passes, where few key heads would leave threads idle: the
 * dK/dV items are (key head, key block), looping over its batch indices and
 * their query blocks in order; the dQ items are (batch index, query block),
 * looping over the key blocks in order, so S and dP are computed twice;
 * both passes' items share one parallel loop (bw_pass_item).  Either way
 * every gradient element is summed in one fixed order, the same in both
 * schemes and whichever thread runs it.  First the rows whose lse is -inf
 * are checked to see no key (FA_ELSE otherwise: nothing is written); then
 * per batch index, its rows' D_i - g_i (a scratch of L per batch index) and
 * its sink's gradient. */
#define FN(name) FA_CAT(name, FA_SFX)
#define FA_T FA_TYPE(FA_SFX)                      /* float, double */
#define KT FA_CAT(fa_kernels, FA_SFX)             /* fa_kernels_f32, _f64 */
#define KCUR FA_CAT3(fa_kernels, FA_SFX, current) /* fa_kernels_f32_current */

#include "driver/storage_tmpl.h"   /* one element of a 16-bit operand */
#include "driver/tiles_tmpl.h"     /* the forward's packing and masks */
#include "driver/scoreopts_tmpl.h" /* the forward's soft cap and ALiBi */

/* row_finish (scoreopts_tmpl.h) finalises a forward row: the backward reads
 * the forward's lse instead (a static inline function may go unused). */
static inline void FN(bw_no_row_finish)(void) { (void)FN(row_finish); }

/* One thread's scratch (element offsets into its buffer, each piece 64-byte
 * aligned): packed Q, dO (as rows and as values); K, V (as keys) and K as
 * values, one key block each, or in the fused pass every key block of the
 * item (nkp of them, at a stride of one block); the pair's tiles; a
 * transposed tile (P^T or dS^T, where the values hold NaN/Inf); dK or dQ,
 * dV (nkp key blocks; none where the fused pass sums in the output); the
 * fused pass's dQ of one query block. */
typedef struct FN(bw_layout) {
    int64_t qp, dop, qv, dov, kp, vkp, kv, s, dp, f, pt, acc1, acc2, dq, total;
} FN(bw_layout);

/* Everything a work item reads, shared by the threads. */
typedef struct FN(bw_plan) {
    const fa_backward_args *b;
    const KT *K;
    fa_attention_args nocap;   /* fwd without its soft cap (ALiBi alone) */
    /* packing views (bw_views): dO, Q and K as the values; dO as the queries;
     * V as the keys */
    fa_attention_args as_dov, as_qv, as_kv, as_dok, as_vk;
    fa_limits lim;
    FN(bw_layout) lay;
    FA_T **bufs;
    int64_t nbatch, bqp, ldE, ldEv, nqb, nkb;
    int64_t grp, nkh;          /* batch indices per key head, key heads */
    int64_t nkp;               /* key blocks packed at once: nkb fused, else 1 */
    int nt, fused;             /* fused: one pass per key head (bwfused_tmpl.h) */
    int dk_out, dv_out;        /* fused: dK (dV) summed in the output itself, its rows
                                * contiguous and E (Ev) the accumulators' width, so the
                                * kernels write nothing outside it (no scratch) */
    int *flags;                /* per check item: a -inf lse on a row that sees a key */
    int *kbad;                 /* fused: per thread and key block, bw_keys' flag */
    FA_T *delta;               /* [nbatch x L]: D_i - g_i */
} FN(bw_plan);

static int64_t FN(bw_piece)(int64_t *at, int64_t n)
{
    const int64_t here = *at, unit = FA_ALIGN / (int64_t)sizeof(FA_T);
    *at += fa_round_up(n > 0 ? n : 1, unit);
    return here;
}

static void FN(bw_layout_of)(FN(bw_plan) *pl)
{
    const int64_t E = pl->b->fwd.E, Ev = pl->b->fwd.Ev, bq = pl->bqp, kc = FA_KC;
    const int64_t nkp = pl->nkp;
    FN(bw_layout) *y = &pl->lay;
    int64_t at = 0;
    y->qp = FN(bw_piece)(&at, bq * E);
    y->dop = FN(bw_piece)(&at, bq * Ev);
    y->qv = FN(bw_piece)(&at, pl->ldE * kc);
    y->dov = FN(bw_piece)(&at, pl->ldEv * kc);
    y->kp = FN(bw_piece)(&at, nkp * kc * E);
    y->vkp = FN(bw_piece)(&at, nkp * kc * Ev);
    y->kv = FN(bw_piece)(&at, nkp * pl->ldE * kc);
    y->s = FN(bw_piece)(&at, bq * kc);
    y->dp = FN(bw_piece)(&at, bq * kc);
    y->f = FN(bw_piece)(&at, bq * kc);
    y->pt = FN(bw_piece)(&at, kc * bq);
    y->acc1 = FN(bw_piece)(&at, pl->dk_out ? 0 : nkp * kc * pl->ldE); /* dK or dQ (bqp <= FA_KC) */
    y->acc2 = FN(bw_piece)(&at, pl->dv_out ? 0 : nkp * kc * pl->ldEv);
    y->dq = FN(bw_piece)(&at, pl->fused ? bq * pl->ldE : 0);
    y->total = at + FA_ALIGN / (int64_t)sizeof(FA_T); /* room to align the base */
}

/* The packing views: the forward's pack_q, pack_k and pack_v read the
 * operand and width they are pointed at. */
static void FN(bw_views)(FN(bw_plan) *pl)
{
    const fa_attention_args *a = &pl->b->fwd;
    pl->nocap = *a;
    pl->nocap.softcap = 0;
    pl->as_dov = *a;
    pl->as_dov.v = pl->b->dout;
    pl->as_qv = *a;
    pl->as_qv.v = a->q;
    pl->as_qv.Ev = a->E;
    pl->as_kv = *a;
    pl->as_kv.v = a->k;
    pl->as_kv.Ev = a->E;
    pl->as_dok = *a;
    pl->as_dok.q = pl->b->dout;
    pl->as_dok.E = a->Ev;
    pl->as_vk = *a;
    pl->as_vk.k = a->v;
    pl->as_vk.E = a->Ev;
}

/* The plan; 0 if there is nothing to compute. */
static int FN(bw_make)(FN(bw_plan) *pl, const fa_backward_args *g, const KT *K)
{
    const fa_attention_args *a = &g->fwd;
    memset(pl, 0, sizeof *pl);
    pl->b = g;
    pl->K = K;
    pl->nbatch = 1;
    for (int d = 0; d < a->nbatch_dims; d++) pl->nbatch *= a->batch_shape[d];
    if (pl->nbatch == 0 || a->L == 0 || a->S == 0) return 0;
    pl->bqp = a->E + a->Ev >= FA_BW_WIDE_E ? FA_KC / K->mr * K->mr
                                           : fa_round_up(FA_BW_MQ, K->mr);
    pl->ldE = fa_round_up(a->E, K->nr);
    pl->ldEv = fa_round_up(a->Ev, K->nr);
    pl->nqb = fa_div_up(a->L, pl->bqp);
    pl->nkb = fa_div_up(a->S, FA_KC);
    pl->lim = fa_limits_of(a);
    pl->grp = fa_bw_group(g); /* >= 1: fa_attention_backward checked it */
    pl->nkh = pl->nbatch / pl->grp;
    int nt = fa_resolve_threads(a->num_threads);
    const double work = (double)pl->nbatch * (double)a->L * (double)a->S * (double)(a->E + a->Ev);
    if (work < FA_PARALLEL_MIN_WORK) nt = 1;
    pl->fused = fa_bw_fuses(pl->nkh, nt, a->S, a->E, a->Ev, sizeof(FA_T));
    pl->nkp = pl->fused ? pl->nkb : 1;
    pl->dk_out = pl->fused && a->E == pl->ldE && g->dk.cs == 1 && g->dk.rs == a->E;
    pl->dv_out = pl->fused && a->Ev == pl->ldEv && g->dv.cs == 1 && g->dv.rs == a->Ev;
    const int64_t most = pl->fused ? pl->nkh : pl->nkh * pl->nkb + pl->nbatch * pl->nqb;
    pl->nt = (int64_t)nt > most ? (int)most : (nt < 1 ? 1 : nt);
    FN(bw_views)(pl);
    FN(bw_layout_of)(pl);
    return 1;
}

static void FN(bw_free)(FN(bw_plan) *pl)
{
    if (pl->bufs)
        for (int t = 0; t < pl->nt; t++) fa_free(pl->bufs[t]);
    fa_free(pl->bufs);
    fa_free(pl->flags);
    fa_free(pl->kbad);
    fa_free(pl->delta);
    pl->bufs = NULL;
    pl->flags = NULL;
    pl->kbad = NULL;
    pl->delta = NULL;
}

static int FN(bw_alloc)(FN(bw_plan) *pl)
{
    pl->bufs = (FA_T **)fa_calloc((size_t)pl->nt, sizeof(FA_T *));
    pl->flags = (int *)fa_calloc((size_t)(pl->nbatch * pl->nqb), sizeof(int));
    pl->kbad = (int *)fa_calloc((size_t)(pl->nt * pl->nkp), sizeof(int));
    pl->delta = (FA_T *)fa_malloc((size_t)(pl->nbatch * pl->b->fwd.L) * sizeof(FA_T));
    if (!pl->bufs || !pl->flags || !pl->kbad || !pl->delta) { FN(bw_free)(pl); return FA_ENOMEM; }
    for (int t = 0; t < pl->nt; t++) {
        pl->bufs[t] = (FA_T *)fa_malloc((size_t)pl->lay.total * sizeof(FA_T));
        if (!pl->bufs[t]) { FN(bw_free)(pl); return FA_ENOMEM; }
    }
    return FA_OK;
}

/* Thread tid's scratch base, 64-byte aligned. */
static FA_T *FN(bw_base)(const FN(bw_plan) *pl, int tid)
{
    uintptr_t p = (uintptr_t)pl->bufs[tid];
    p = (p + FA_ALIGN - 1) / FA_ALIGN * FA_ALIGN;
    return (FA_T *)p;
}

#include "driver/bwtile_tmpl.h" /* one (query block, key block) pair */
#include "driver/bwpass_tmpl.h" /* the work items of the passes, the entry point */

#undef FN
#undef FA_T
#undef KT
#undef KCUR
