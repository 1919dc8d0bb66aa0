/* paged_tmpl.h -- the paged driver, written once over the element type:
 * included twice by paged.c with FA_SFX (f32, f64) defined.  Each work item
 * (an entry of paged.c: a sequence's query rows and key range, and one kv
 * head) either streams a decoding step's group of query heads over the keys
 * and values where they lie in the pages (the direct kernels over each key
 * block's row pointers), or, a prefill chunk, streams the group's query
 * heads together over each key block, packed once for them all from its
 * page or a copy (the forward's tiles, causal bands and score options), or
 * copies the keys from their blocks once into its thread's scratch and runs
 * the forward's streaming loop (stream_tmpl.h) for the group's query heads
 * over the copy; a split key range leaves partials that the forward's
 * merge (merge_tmpl.h) combines in split order, after a barrier in the same
 * parallel region (one fork and join per call).  Names: FN(paged) ->
 * paged_f32, paged_f64; likewise fa_pplan, pplan_make, pplan_alloc,
 * pplan_free, pplan_q8, pplan_gather_at, pplan_v_bytes, pstream, pstream_pages,
 * fa_pchunk, pchunk_pack_q, pchunk_start, pchunk_rows, pchunk_block, pchunk,
 * pplan_f16_at, pflash16, prun_item, pmerge_item, and those of the forward's
 * parts included below. */
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
    int64_t f16_bytes;          /* the 16-bit matrix driver's scratch (pflash16), after them */
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
    const int64_t G = a->Hq / a->Hkv, chunk_heads = fa_min64(G, FA_PAGED_CHUNK_HEADS);
    for (int64_t i = 0; i < pl->nent; i++) {
        const fa_paged_entry *e = pl->ent + i;
        const int prefill = fa_paged_nq(a, e->b) > FA_DIRECT_MAX_ROWS; /* pchunk's */
        const int64_t erows = fa_paged_grouped(a, e) ? G : e->r1 - e->r0;
#if !FA_IS_F64(FA_SFX)
        const int64_t f16 = fa_paged_flash16_bytes(a, e);
        pl->ent[i].flash16 = f16 > 0;
        pl->f16_bytes = fa_paged_max(pl->f16_bytes, f16);
        if (f16) pl->gather_keys = fa_paged_max(pl->gather_keys, e->k1 - e->k0);
#endif
        if (!pl->ent[i].flash16) /* pflash16 streams nothing: its scratch is f16_bytes */
            rows = fa_paged_max(rows, prefill ? chunk_heads * chunk : erows);
        pl->q8 |= FN(pplan_q8)(pl, e);
        if (!fa_paged_in_place(a, e) && !FN(pplan_q8)(pl, e)) /* the copy's rows */
            pl->gather_keys = fa_paged_max(pl->gather_keys, prefill ? FA_KC : e->k1 - e->k0);
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
    pl->kv_bytes = a->kv_storage == FA_INT8 ? 4 : fa_storage_bytes(a->kv_storage);
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

/* The gathered values' bytes, rounded up to a 64-byte multiple. */
static int64_t FN(pplan_v_bytes)(const FN(fa_pplan) *pl)
{
    return fa_round_up(pl->gather_keys * pl->a->Ev * pl->kv_bytes, 64);
}

/* The per-thread scratch, before any output is touched: FA_OK or FA_ENOMEM. */
static int FN(pplan_alloc)(FN(fa_pplan) *pl)
{
    const int64_t gather = pl->v_at + FN(pplan_v_bytes)(pl) +
                           (pl->f16_bytes ? pl->f16_bytes + 64 : 0) + 64;
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
    /* bfloat16 pools on the tier's dp16 kernels where it has them: P.V
     * always, Q.K^T for queries they take exactly (bfloat16, or float32
     * where dp16_f32q), unscaled, the scale applied to the scores; other
     * float32 queries keep their bits on the widening path */
    const int dpv = hx == 2 && K->pv_rows_dp16 && a->E % 32 == 0 && a->E <= FA_FLASH16_MAX_E &&
                    a->Ev % 32 == 0;
    const int dpq = dpv && (a->storage == FA_BFLOAT16 || K->dp16_f32q);
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

/* A prefill chunk's heads in one pass (see pchunk): per head, its
 * one-problem call, its streaming state and its part of the scratch. */
typedef struct FN(fa_pchunk) {
    fa_attention_args la[FA_PAGED_CHUNK_HEADS];
    FN(fa_stream) st[FA_PAGED_CHUNK_HEADS];
    FN(fa_scratch) sc[FA_PAGED_CHUNK_HEADS];
    fa_offsets off;
    int64_t nh;
} FN(fa_pchunk);

/* The queries of rows [r0, r1) of c's heads packed and scaled as
 * stream_start packs them, row by row across the heads: a row's heads are
 * adjacent in the query array, its rows Hq heads apart, so each step reads
 * one contiguous run; then each head's padding rows (to mr) zeroed. */
static void FN(pchunk_pack_q)(const FN(fa_pplan) *pl, int64_t r0, int64_t r1, FN(fa_pchunk) *c)
{
    const int64_t E = pl->a->E, mcp = c->st[0].mcp, n = r1 - r0;
    const int64_t last = (c->st[0].ntiles - 1) * mcp; /* the last tile's first row */
    const int64_t rpad = last + fa_round_up(n - last, pl->K->mr);
    const FA_T qscale = (FA_T)(pl->base2 ? pl->a->scale * FA_LOG2E : pl->a->scale);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c->nh; j++)
            FN(pack_q)(&c->la[j], 0, r0 + i, 1, 1, c->sc[j].qp + i * E, qscale);
    for (int64_t j = 0; j < c->nh; j++)
        memset(c->sc[j].qp + n * E, 0, (size_t)((rpad - n) * E) * sizeof(FA_T));
}

/* Query heads h0 .. h0 + nh of entry e (rows [e->r0, e->r1)) set up as
 * stream_rows does for each, over the key block staged at kst / vst: head
 * j's packed queries, output and row state at j chunk rows into the
 * scratch, whose packed K and V blocks and score tile they share. */
static void FN(pchunk_start)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t h0,
                             int64_t nh, const char *kst, const char *vst, FA_T *buf,
                             FN(fa_pchunk) *c)
{
    const fa_paged_args *a = pl->a;
    const int64_t mcp = fa_round_up(FA_MC, pl->K->mr), rows = FA_PAGED_CHUNK_TILES * mcp;
    memset(&c->off, 0, sizeof c->off);
    c->nh = nh;
    for (int64_t j = 0; j < nh; j++) {
        FN(fa_scratch) *sc = &c->sc[j];
        *sc = FN(scratch_carve)(buf, &pl->lay);
        sc->qp += j * rows * a->E, sc->o += j * rows * pl->ldv;
        sc->m += j * rows, sc->l += j * rows, sc->lv += j * rows * pl->K->vw;
        fa_paged_local(a, e->b, h0 + j, e->k0, kst, vst, &c->la[j]);
        /* more rows than FA_DIRECT_MAX_ROWS: the packed (not direct) path */
        FN(fa_stream) st = {.a = &c->la[j], .K = pl->K, .off = &c->off,
                            .lim = fa_limits_of(&c->la[j]), .sc = sc, .r0 = e->r0, .r1 = e->r1,
                            .ldv = pl->ldv, .mcp = mcp, .ntiles = fa_div_up(e->r1 - e->r0, mcp),
                            .base2 = pl->base2};
        c->st[j] = st;
        for (int64_t i = 0; i < e->r1 - e->r0; i++) sc->m[i] = (FA_T)-INFINITY;
        memset(sc->lv, 0, (size_t)((e->r1 - e->r0) * pl->K->vw) * sizeof(FA_T));
        memset(sc->o, 0, (size_t)((e->r1 - e->r0) * pl->ldv) * sizeof(FA_T));
    }
    FN(pchunk_pack_q)(pl, e->r0, e->r1, c);
}

/* The K and V rows of the chunk's keys [p, p + nk) for kv head g as the
 * packing reads them (from key 0 of src): in their page when one holds them
 * all (not int8, whose levels the copy dequantises), else copied from their
 * pages to the staging rows kst / vst. */
static void FN(pchunk_rows)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t g,
                            int64_t p, int64_t nk, char *kst, char *vst, fa_attention_args *src)
{
    const fa_paged_args *a = pl->a;
    const int64_t bs = a->block_size;
    if (a->kv_storage == FA_INT8 || p / bs != (p + nk - 1) / bs) {
        fa_paged_gather(a, e->b, g, p, p + nk, kst, vst);
        return; /* src: the staging rows already */
    }
    const int64_t blk = a->block_table[e->b * a->max_blocks + p / bs], off = p % bs;
    const int64_t sz = fa_storage_bytes(a->kv_storage);
    src->k.data = (const char *)a->k + (blk * a->k_bs + off * a->k_ps + g * a->k_hs) * sz;
    src->v.data = (const char *)a->v + (blk * a->v_bs + off * a->v_ps + g * a->v_hs) * sz;
    src->k.rs = a->k_ps, src->k.cs = a->k_cs, src->v.rs = a->v_ps, src->v.cs = a->v_cs;
}

/* The key block [kb, kb + nk) of the chunk's local keys (from e->k0) for
 * every head of c: skipped if no tile sees it (the limits are the same for
 * every head), else its K and V rows packed once (pchunk_rows) and every
 * head's tiles streamed over it. */
static void FN(pchunk_block)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t g,
                             int64_t kb, int64_t nk, char *kst, char *vst, FN(fa_pchunk) *c)
{
    FN(fa_stream) *s0 = &c->st[0];
    int seen = 0;
    s0->kb = kb, s0->nk = nk, s0->pad_some = 0;
    for (int64_t t = 0; t < s0->ntiles; t++) {
        FN(tile_keys)(s0, t);
        seen |= s0->tk[t] > 0;
    }
    if (!seen) return;
    fa_attention_args src = c->la[0];
    FN(pchunk_rows)(pl, e, g, e->k0 + kb, nk, kst, vst, &src);
    const int64_t nr = pl->K->nr;
    FN(pack_k)(&src, pl->K, 0, 0, nk, fa_round_up(nk, nr), nr, s0->sc->kp);
    s0->v_bad = FN(pack_v)(&src, pl->K, 0, 0, nk, pl->ldv, nr, s0->sc->vp);
    for (int64_t j = 0; j < c->nh; j++) {
        FN(fa_stream) *st = &c->st[j];
        if (j) {
            st->kb = kb, st->nk = nk, st->pad_some = 0, st->v_bad = s0->v_bad;
            memcpy(st->tk, s0->tk, sizeof st->tk);
            memcpy(st->tmixed, s0->tmixed, sizeof st->tmixed);
        }
        for (int64_t t = 0; t < st->ntiles; t++) FN(stream_tile)(st, t);
    }
}

/* A prefill chunk (an entry of more than FA_DIRECT_MAX_ROWS queries, its
 * keys never split) for kv head g: the group's query heads, up to
 * FA_PAGED_CHUNK_HEADS at a time, streamed together over each key block,
 * which is copied from its pages and packed once for all of them (not once
 * per head).  Each head computes exactly what stream_rows computes for it:
 * the same key blocks, tiles, causal bands and sums in the same order. */
static void FN(pchunk)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t g, FA_T *buf)
{
    const fa_paged_args *a = pl->a;
    const int64_t G = a->Hq / a->Hkv, nkeys = e->k1 - e->k0;
    char *kst = FN(pplan_gather_at)(pl, buf), *vst = kst + pl->v_at;
    FN(fa_pchunk) c;
    for (int64_t h0 = g * G; h0 < (g + 1) * G; h0 += FA_PAGED_CHUNK_HEADS) {
        FN(pchunk_start)(pl, e, h0, fa_min64(FA_PAGED_CHUNK_HEADS, (g + 1) * G - h0), kst, vst,
                         buf, &c);
        const fa_limits *w = &c.st[0].lim;
        int64_t kbeg = 0, kend = nkeys; /* as stream_rows: on the block grid of key 0 */
        if (w->has_hi && e->r1 + w->hi < kend) kend = e->r1 + w->hi;
        if (w->has_lo && e->r0 + w->lo > 0) kbeg = (e->r0 + w->lo) / FA_KC * FA_KC;
        for (int64_t kb = kbeg; kb < kend; kb += FA_KC)
            FN(pchunk_block)(pl, e, g, kb, fa_min64(kend - kb, FA_KC), kst, vst, &c);
        for (int64_t j = 0; j < c.nh; j++)
            pl->K->lane_sums(e->r1 - e->r0, c.sc[j].lv, c.sc[j].l);
        for (int64_t i = 0; i < e->r1 - e->r0; i++) /* row by row across the heads, as packed */
            for (int64_t j = 0; j < c.nh; j++) {
                const FN(fa_scratch) *sc = &c.sc[j];
                FN(write_out)(&c.la[j], &c.off, e->r0 + i, e->r0 + i + 1, pl->ldv,
                              sc->o + i * pl->ldv, sc->l + i, sc->m + i, pl->base2);
            }
    }
}

#if !FA_IS_F64(FA_SFX)
/* The 16-bit matrix driver's scratch in thread scratch buf: after the
 * gathered values, 64-byte aligned. */
static void *FN(pplan_f16_at)(const FN(fa_pplan) *pl, FA_T *buf)
{
    const char *v = FN(pplan_gather_at)(pl, buf) + pl->v_at;
    const uintptr_t at = (uintptr_t)(v + FN(pplan_v_bytes)(pl));
    return (void *)(at + (64 - at % 64) % 64);
}

/* Prefill entry e of kv head g on the 16-bit matrix driver (e->flash16):
 * its keys gathered once as they are stored, then the group's query heads
 * as one problem on the calling thread. */
static void FN(pflash16)(const FN(fa_pplan) *pl, const fa_paged_entry *e, int64_t g, int tid)
{
    const fa_paged_args *a = pl->a;
    char *kbuf = FN(pplan_gather_at)(pl, pl->bufs[tid]), *vbuf = kbuf + pl->v_at;
    fa_attention_args la;
    fa_paged_gather(a, e->b, g, e->k0, e->k1, kbuf, vbuf);
    fa_paged_chunk_local(a, e, g, kbuf, vbuf, &la);
    (void)fa_flash16_one(&la, FN(pplan_f16_at)(pl, pl->bufs[tid])); /* taken: planned so */
}
#endif

/* Work item it on thread tid: entry it / Hkv, kv head it % Hkv; a prefill
 * chunk by pchunk, else its keys gathered once, then the group's query
 * heads streamed over them. */
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
#if !FA_IS_F64(FA_SFX)
    if (e->flash16) {
        FN(pflash16)(pl, e, g, tid);
        return;
    }
#endif
    if (nq > FA_DIRECT_MAX_ROWS) {
        FN(pchunk)(pl, e, g, pl->bufs[tid]);
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
