/* paged_tmpl.h -- the paged driver, written once over the element type:
 * included twice by paged.c with FA_SFX (f32, f64) defined.  Each work item
 * (an entry of paged.c: a sequence's query rows and key range, and one kv
 * head) either streams a decoding step's group of query heads over the keys
 * and values where they lie in the pages (the direct kernels over each key
 * block's row pointers), or copies them from their blocks once into its
 * thread's scratch and runs the forward's streaming loop (stream_tmpl.h:
 * packing, masks, score options, online softmax) for the group's query
 * heads over the copy; a split key range leaves partials that the forward's
 * merge (merge_tmpl.h) combines in split order, after a barrier in the same
 * parallel region (one fork and join per call).  Names: FN(paged) ->
 * paged_f32, paged_f64; likewise fa_pplan, pplan_make, pplan_alloc,
 * pplan_free, pplan_q8, pplan_gather_at, pstream, pstream_pages, prun_item,
 * pmerge_item, and those of the forward's parts included below. */
#define FN(name) FA_CAT(name, FA_SFX)
#define FA_T FA_TYPE(FA_SFX)                      /* float, double */
#define KT FA_CAT(fa_kernels, FA_SFX)             /* fa_kernels_f32, _f64 */
#define KCUR FA_CAT3(fa_kernels, FA_SFX, current) /* fa_kernels_f32_current */

#include "driver/storage_tmpl.h"
#include "driver/scratch_tmpl.h"
#include "driver/tiles_tmpl.h"
#include "driver/scoreopts_tmpl.h"
#include "driver/merge_tmpl.h"
#include "driver/band_tmpl.h"
#include "driver/stream_tmpl.h"

/* Everything a work item needs, shared read-only by the threads. */
typedef struct FN(fa_pplan) {
    const fa_paged_args *a;
    const KT *K;
    fa_paged_entry *ent;
    int64_t nent, nitems;
    int64_t *nsplit, *part_off; /* per sequence: key splits; its partials in part */
    FA_T *part, **bufs;         /* key-split partials; per-thread scratch */
    fa_scratch_layout lay;      /* the streaming part of each bufs[t] */
    int64_t gather_keys, ldv, kv_bytes, v_at; /* the gathered rows: keys, bytes each, V's offset */
    int nt, base2, q8;          /* q8: some entry runs on the int8 kernel */
} FN(fa_pplan);

/* Does entry e run on the int8 kernel (fa_paged_q8; float32 only)? */
static int FN(pplan_q8)(const FN(fa_pplan) *pl, const fa_paged_entry *e)
{
#if FA_IS_F64(FA_SFX)
    (void)pl, (void)e;
    return 0;
#else
    return pl->K->decode_q8 && fa_paged_q8(pl->a, e);
#endif
}

/* The entries, the key splits, the partials' places and the scratch sizes
 * of call a; 0 if there is nothing to compute or an array could not be
 * allocated (*status says which). */
static int FN(pplan_make)(FN(fa_pplan) *pl, const fa_paged_args *a, const KT *K, int *status)
{
    memset(pl, 0, sizeof *pl);
    pl->a = a, pl->K = K;
    *status = FA_OK;
    if (a->B == 0 || a->total_q == 0) return 0;
    const int64_t mcp = fa_round_up(FA_MC, K->mr), chunk = FA_PAGED_CHUNK_TILES * mcp;
    const int64_t split_kc = fa_paged_split_kc(a);
    pl->nent = fa_paged_entries(a, chunk, split_kc, NULL, NULL);
    pl->ent = (fa_paged_entry *)fa_malloc((size_t)pl->nent * sizeof *pl->ent);
    pl->nsplit = (int64_t *)fa_malloc((size_t)(2 * a->B) * sizeof(int64_t));
    if (!pl->ent || !pl->nsplit) { *status = FA_ENOMEM; return 0; }
    pl->part_off = pl->nsplit + a->B;
    fa_paged_entries(a, chunk, split_kc, pl->ent, pl->nsplit);
    qsort(pl->ent, (size_t)pl->nent, sizeof *pl->ent, fa_paged_entry_cmp);
    pl->ldv = fa_round_up(a->Ev, K->nr);
    int64_t rows = 1, off = 0;
    double work = 0;
    for (int64_t i = 0; i < pl->nent; i++) {
        const fa_paged_entry *e = pl->ent + i;
        rows = fa_paged_max(rows, fa_paged_grouped(a, e) ? a->Hq / a->Hkv : e->r1 - e->r0);
        pl->q8 |= FN(pplan_q8)(pl, e);
        if (!fa_paged_in_place(a, e) && !FN(pplan_q8)(pl, e)) /* the copy's rows */
            pl->gather_keys = fa_paged_max(pl->gather_keys, e->k1 - e->k0);
        work += (double)(e->r1 - e->r0) * (double)(e->k1 - e->k0);
    }
    for (int64_t b = 0; b < a->B; b++) {
        pl->part_off[b] = off;
        if (pl->nsplit[b] > 1) off += a->Hq * fa_paged_nq(a, b) * pl->nsplit[b] * (pl->ldv + 2);
    }
    pl->part = off ? (FA_T *)fa_malloc((size_t)off * sizeof(FA_T)) : NULL;
    if (off && !pl->part) { *status = FA_ENOMEM; return 0; }
    pl->nitems = pl->nent * a->Hkv;
    int nt = fa_resolve_threads(a->num_threads);
    if (work * (double)a->Hq * (double)(a->E + a->Ev) < FA_PARALLEL_MIN_WORK) nt = 1;
    pl->nt = (int64_t)nt > pl->nitems ? (int)pl->nitems : nt;
    pl->lay = fa_scratch_layout_of(rows, mcp, a->E, pl->ldv, K->vw, 0);
    pl->kv_bytes = a->kv_storage == FA_INT8 ? 4 : fa_elem_size(a->kv_storage);
    pl->v_at = fa_round_up(pl->gather_keys * a->E * pl->kv_bytes, 64);
    /* int8: natural-log units throughout, the int8 kernel's partials' */
    pl->base2 = a->kv_storage != FA_INT8 && fabs(a->scale * FA_LOG2E) <= (double)FA_TYPE_MAX(FA_SFX) &&
                a->softcap * FA_LOG2E <= (double)FA_TYPE_MAX(FA_SFX);
    return 1;
}

static void FN(pplan_free)(FN(fa_pplan) *pl)
{
    if (pl->bufs)
        for (int t = 0; t < pl->nt; t++) fa_free(pl->bufs[t]);
    fa_free(pl->bufs);
    fa_free(pl->part);
    fa_free(pl->ent);
    fa_free(pl->nsplit);
    memset(pl, 0, sizeof *pl);
}

/* The gathered keys' place in thread scratch buf (after the streaming part,
 * 64-byte aligned); the values' at v_at bytes past it. */
static char *FN(pplan_gather_at)(const FN(fa_pplan) *pl, FA_T *buf)
{
    return (char *)(buf + fa_round_up(pl->lay.total, 64 / (int64_t)sizeof(FA_T)));
}

/* The per-thread scratch, before any output is touched: FA_OK or FA_ENOMEM. */
static int FN(pplan_alloc)(FN(fa_pplan) *pl)
{
    const int64_t gather = pl->v_at + pl->gather_keys * pl->a->Ev * pl->kv_bytes + 64;
    size_t bytes = (size_t)fa_round_up(pl->lay.total, 64) * sizeof(FA_T) + (size_t)gather;
    const size_t q8 = (size_t)fa_q8_scratch_floats(pl->a->Ev) * sizeof(float);
    if (pl->q8 && bytes < q8) bytes = q8;
    pl->bufs = (FA_T **)fa_calloc((size_t)pl->nt, sizeof(FA_T *));
    if (!pl->bufs) return FA_ENOMEM;
    for (int t = 0; t < pl->nt; t++) {
        pl->bufs[t] = (FA_T *)fa_malloc(bytes);
        if (!pl->bufs[t]) return FA_ENOMEM;
    }
    return FA_OK;
}

/* The forward's streaming loop over rows [r0, r1) of the one-problem call
 * la (keys: the entry's gathered range); the rows written, or, the keys
 * split, their partials stored at part + at (la's rows, the entry's split). */
static void FN(pstream)(const FN(fa_pplan) *pl, const fa_paged_entry *e,
                        const fa_attention_args *la, int64_t r0, int64_t r1, int64_t at,
                        FN(fa_scratch) *sc)
{
    fa_offsets off;
    fa_mask_summary ms;
    memset(&off, 0, sizeof off);
    memset(&ms, 0, sizeof ms);
    FN(stream_rows)(la, pl->K, &off, &ms, r0, r1, 0, e->k1 - e->k0, pl->ldv, pl->base2, sc);
    if (e->ns == 1)
        FN(write_out)(la, &off, r0, r1, pl->ldv, sc->o, sc->l, sc->m, pl->base2);
    else
        FN(store_partials)(pl->part + at, la->L, e->ns, pl->ldv, 0, e->s, r0, r1, sc->m, sc->l,
                           sc->o);
}

/* A grouped entry (fa_paged_in_place) streamed over its keys in the pages:
 * the forward's direct decoding path (per key block Q.K^T, the soft cap,
 * the online softmax step, P.V), each block's rows found through the block
 * table once (fa_paged_rows) and each product one kernel call over them,
 * whatever the page size.  Each score is its own dot product and P.V adds
 * the keys in order, so the bits depend on neither the page size nor the
 * blocks' places. */
static void FN(pstream_pages)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t g,
                              const fa_attention_args *la, int64_t at, FN(fa_scratch) *sc)
{
    const KT *K = pl->K;
    const fa_paged_args *a = pl->a;
    const int64_t G = la->L, ldv = pl->ldv;
    const int hx = a->kv_storage == FA_FLOAT16 ? 1 : a->kv_storage == FA_BFLOAT16 ? 2 : 0;
    /* bfloat16 pools on VDPBF16PS where the tier has it: P.V always, Q.K^T
     * for bfloat16 queries (exact in bfloat16 unscaled, the scale applied
     * to the scores; float32 queries keep their bits on the widening path) */
    const int dpv = hx == 2 && K->pv_rows_dp16 && a->E % 32 == 0 && a->E <= FA_FLASH16_MAX_E &&
                    a->Ev % 32 == 0;
    const int dpq = dpv && a->storage == FA_BFLOAT16;
    const FA_T c = (FA_T)(pl->base2 ? la->scale * FA_LOG2E : la->scale);
    fa_krows t;
    fa_offsets off;
    memset(&off, 0, sizeof off);
    FN(pack_q)(la, 0, 0, G, G, sc->qp, dpq ? (FA_T)1 : c);
    for (int64_t i = 0; i < G; i++) sc->m[i] = (FA_T)-INFINITY;
    memset(sc->lv, 0, (size_t)(G * K->vw) * sizeof(FA_T));
    memset(sc->o, 0, (size_t)(G * ldv) * sizeof(FA_T));
    for (int64_t kb = e->k0; kb < e->k1; kb += FA_KC) {
        const int64_t nk = fa_min64(FA_KC, e->k1 - kb);
        fa_paged_rows(a, e, g, kb, nk, &t);
        if (dpq)
            K->qk_rows_dp16(G, a->E, a->Ev, c, sc->qp, &t, sc->st, FA_KC);
        else
            K->qk_rows[hx](G, a->E, a->Ev, sc->qp, &t, sc->st, FA_KC);
        if (la->softcap > 0)
            FN(score_opts)(la, K, &off, sc->st, FA_KC, 0, G, kb - e->k0, nk, pl->base2, NULL);
        K->online_softmax(G, nk, sc->st, FA_KC, sc->m, sc->lv, sc->o, ldv, pl->base2, NULL);
        (dpv ? K->pv_rows_dp16 : K->pv_rows[hx])(G, a->Ev, sc->st, FA_KC, &t, sc->o, ldv);
    }
    K->lane_sums(G, sc->lv, sc->l);
    if (e->ns == 1)
        FN(write_out)(la, &off, 0, G, ldv, sc->o, sc->l, sc->m, pl->base2);
    else
        FN(store_partials)(pl->part + at, G, e->ns, ldv, 0, e->s, 0, G, sc->m, sc->l, sc->o);
}

/* Work item it on thread tid: entry it / Hkv, kv head it % Hkv; its keys
 * gathered once, then the group's query heads streamed over them. */
static void FN(prun_item)(void *ctx, int64_t it, int tid)
{
    const FN(fa_pplan) *pl = (const FN(fa_pplan) *)ctx;
    const fa_paged_args *a = pl->a;
    const fa_paged_entry *e = pl->ent + it / a->Hkv;
    const int64_t g = it % a->Hkv, G = a->Hq / a->Hkv, nq = fa_paged_nq(a, e->b);
    FN(fa_scratch) sc = FN(scratch_carve)(pl->bufs[tid], &pl->lay);
    char *kbuf = FN(pplan_gather_at)(pl, pl->bufs[tid]), *vbuf = kbuf + pl->v_at;
    fa_attention_args la;
    const int64_t at = pl->part_off[e->b] + g * G * e->ns * (pl->ldv + 2);
#if !FA_IS_F64(FA_SFX)
    if (FN(pplan_q8)(pl, e)) {
        fa_q8_item q8;
        float *part = e->ns == 1 ? NULL
                                 : pl->part + pl->part_off[e->b] +
                                       (g * G * nq * e->ns + e->s) * (pl->ldv + 2);
        fa_paged_q8_item(a, e, g, part, pl->ldv, pl->bufs[tid], &q8);
        pl->K->decode_q8(&q8);
        return;
    }
#endif
    if (fa_paged_in_place(a, e)) {
        fa_paged_group_local(a, e->b, g * G, G, e->k0, NULL, NULL, &la);
        FN(pstream_pages)(pl, e, g, &la, at, &sc);
        return;
    }
    fa_paged_gather(a, e->b, g, e->k0, e->k1, kbuf, vbuf);
    if (fa_paged_grouped(a, e)) {
        fa_paged_group_local(a, e->b, g * G, G, e->k0, kbuf, vbuf, &la);
        FN(pstream)(pl, e, &la, 0, G, at, &sc);
        return;
    }
    for (int64_t h = g * G; h < (g + 1) * G; h++) {
        fa_paged_local(a, e->b, h, e->k0, kbuf, vbuf, &la);
        FN(pstream)(pl, e, &la, e->r0, e->r1, pl->part_off[e->b] + h * nq * e->ns * (pl->ldv + 2),
                    &sc);
    }
}

/* Query head it % Hq of sequence it / Hq: its key splits merged in order
 * and written (nothing to do for a sequence not split). */
static void FN(pmerge_item)(void *ctx, int64_t it, int tid)
{
    const FN(fa_pplan) *pl = (const FN(fa_pplan) *)ctx;
    const fa_paged_args *a = pl->a;
    const int64_t b = it / a->Hq, h = it % a->Hq, ns = pl->nsplit[b];
    if (ns == 1) return;
    FN(fa_scratch) sc = FN(scratch_carve)(pl->bufs[tid], &pl->lay);
    fa_attention_args la;
    fa_paged_local(a, b, h, 0, NULL, NULL, &la);
    const FA_T *part = pl->part + pl->part_off[b] + h * fa_paged_nq(a, b) * ns * (pl->ldv + 2);
    FN(merge_batch)(&la, part, ns, pl->ldv, pl->base2, 0, sc.o, sc.l, sc.m);
}

static int FN(paged)(const fa_paged_args *a)
{
    FN(fa_pplan) pl;
    int status;
    if (!FN(pplan_make)(&pl, a, KCUR(), &status)) {
        FN(pplan_free)(&pl);
        return status;
    }
    status = FN(pplan_alloc)(&pl);
    if (status == FA_OK) { /* the items, then the split merge: one parallel region */
        const fa_phase ph[2] = {{FA_SCHED_DYNAMIC, pl.nitems, FN(prun_item), &pl},
                                {FA_SCHED_STATIC, a->B * a->Hq, FN(pmerge_item), &pl}};
        fa_parallel_phases(pl.nt, pl.part ? 2 : 1, ph);
    }
    FN(pplan_free)(&pl);
    return status;
}

#undef FN
#undef FA_T
#undef KT
#undef KCUR
