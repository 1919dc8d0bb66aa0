/* plan_tmpl.h -- one attention call: the plan (threads, query chunks, key
 * split, scratch), the allocation (all of it before any output is
 * touched), the work items on the threads, then the key-split merge.  Part
 * of attention_tmpl.h (FA_SFX; FA_T, KT, KCUR): FN(attention) ->
 * attention_f32, attention_f64; likewise fa_plan, plan_make, plan_alloc,
 * plan_free, run_item, merge_item. */

/* Everything a work item needs, shared read-only by the threads. */
typedef struct FN(fa_plan) {
    const fa_attention_args *a;
    const KT *K;
    FA_T **bufs, *part;      /* per-thread scratch; the key-split partials */
    fa_scratch_layout lay;   /* of each bufs[t] */
    fa_mask_summary ms;      /* the boolean mask's block states */
    int64_t ms_bytes;
    int64_t nbatch, ldv, mcp, ntiles, chunk_tiles, nchunks, nsplit, split_kc, nitems;
    int nt;                  /* threads */
    int base2;               /* streaming scores in log2 units (see stream_rows) */
} FN(fa_plan);

/* The work split: query chunks of chunk_tiles tiles sharing one packed K/V
 * block, and (decoding) the keys split in nsplit chunks of split_kc. */
static void FN(plan_split)(FN(fa_plan) *pl)
{
    const fa_attention_args *a = pl->a;
    const int64_t S = a->S, nt = pl->nt;
    pl->chunk_tiles = 1;
    pl->nsplit = 1;
    pl->split_kc = S;
    if (a->weights == NULL) {
        /* Query chunks share one packed K/V block: as long as there are
         * enough chunks to keep the threads busy (chunking never changes
         * the result: every row is computed the same way in any chunk). */
        int64_t want = fa_div_up(pl->nbatch * pl->ntiles, 4 * nt);
        pl->chunk_tiles = want < 1 ? 1 : (want > FA_MAX_CHUNK_MC ? FA_MAX_CHUNK_MC : want);
        /* Decoding: few query tiles, many keys: split the keys, by the
         * problem's size alone. */
        if (pl->nbatch * pl->ntiles < FA_SPLIT_MAX_ITEMS && S > 2 * FA_SPLIT_KC) {
            int64_t split_kc = FA_SPLIT_KC;
            if (fa_div_up(S, split_kc) > 64) split_kc = fa_div_up(S, 64);
            pl->split_kc = fa_round_up(split_kc, FA_KC);
            pl->nsplit = fa_div_up(S, pl->split_kc);
        }
    }
    if (pl->nsplit > 1) pl->chunk_tiles = 1;
    pl->nchunks = fa_div_up(pl->ntiles, pl->chunk_tiles);
}

/* The plan of call a; returns 0 if there is nothing to compute. */
static int FN(plan_make)(FN(fa_plan) *pl, const fa_attention_args *a, const KT *K)
{
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    memset(pl, 0, sizeof *pl);
    pl->a = a;
    pl->K = K;
    pl->nbatch = 1;
    for (int d = 0; d < a->nbatch_dims; d++) pl->nbatch *= a->batch_shape[d];
    if (pl->nbatch == 0 || L == 0 || (Ev == 0 && !a->weights && !a->lse.data)) return 0;
    pl->ldv = fa_round_up(Ev, K->nr); /* V panels of nr columns */
    int nt = fa_resolve_threads(a->num_threads);
    double work = (double)pl->nbatch * (double)L * (double)S * (double)(E + Ev);
    if (work < FA_PARALLEL_MIN_WORK) nt = 1;
    pl->nt = nt;
    pl->mcp = fa_round_up(FA_MC, K->mr); /* tile rows: FA_MC padded to mr */
    pl->ntiles = fa_div_up(L, pl->mcp);
    FN(plan_split)(pl);
    pl->nitems = a->weights ? pl->nbatch * pl->ntiles : pl->nbatch * pl->nchunks * pl->nsplit;
    if ((int64_t)pl->nt > pl->nitems) pl->nt = (int)pl->nitems;
    if (pl->nt < 1) pl->nt = 1;
    pl->ms_bytes = fa_mask_summary_init(&pl->ms, a, pl->mcp);
    const int64_t rows = a->weights ? pl->mcp : pl->chunk_tiles * pl->mcp;
    /* 16-bit weights: each tile's computed in float here, then rounded */
    const int64_t wlen = a->weights && FN(is_half)(a) ? pl->mcp * S : 0;
    pl->lay = fa_scratch_layout_of(rows, pl->mcp, E > 0 ? E : 1, pl->ldv, K->vw, wlen);
    /* log2 units unless scale * log2(e) (or softcap * log2(e)) overflows, or
     * an additive mask is given: x * log2(e) would turn a mask of -FLT_MAX
     * (a row of them gives uniform weights) into -inf (a hidden row) */
    pl->base2 = a->add_mask.data == NULL && fabs(a->scale * FA_LOG2E) <= (double)FA_TYPE_MAX(FA_SFX) &&
                a->softcap * FA_LOG2E <= (double)FA_TYPE_MAX(FA_SFX);
    return 1;
}

static void FN(plan_free)(FN(fa_plan) *pl)
{
    if (pl->bufs)
        for (int t = 0; t < pl->nt; t++) fa_free(pl->bufs[t]);
    fa_free(pl->bufs);
    fa_free(pl->part);
    fa_free(pl->ms.state);
    pl->bufs = NULL;
    pl->part = NULL;
    pl->ms.state = NULL;
}

/* All scratch, before any output is touched: FA_OK or FA_ENOMEM. */
static int FN(plan_alloc)(FN(fa_plan) *pl)
{
    pl->bufs = (FA_T **)fa_calloc((size_t)pl->nt, sizeof(FA_T *));
    if (!pl->bufs) return FA_ENOMEM;
    for (int t = 0; t < pl->nt; t++) {
        pl->bufs[t] = (FA_T *)fa_malloc((size_t)pl->lay.total * sizeof(FA_T));
        if (!pl->bufs[t]) { FN(plan_free)(pl); return FA_ENOMEM; }
    }
    if (pl->nsplit > 1) {
        const int64_t n = pl->nbatch * pl->a->L * pl->nsplit * (pl->ldv + 2);
        pl->part = (FA_T *)fa_malloc((size_t)n * sizeof(FA_T));
        if (!pl->part) { FN(plan_free)(pl); return FA_ENOMEM; }
    }
    if (pl->ms_bytes > 0) {
        pl->ms.state = (uint8_t *)fa_malloc((size_t)pl->ms_bytes);
        if (!pl->ms.state) { FN(plan_free)(pl); return FA_ENOMEM; }
    }
    return FA_OK;
}

/* Work item it on thread tid: (query chunk, batch, key split) or, with
 * weights, (batch, tile); the causal longest rows first. */
static void FN(run_item)(void *ctx, int64_t it, int tid)
{
    const FN(fa_plan) *pl = (const FN(fa_plan) *)ctx;
    const fa_attention_args *a = pl->a;
    const int64_t L = a->L, S = a->S, mcp = pl->mcp, nsplit = pl->nsplit;
    FN(fa_scratch) sc = FN(scratch_carve)(pl->bufs[tid], &pl->lay);
    fa_offsets off;
    if (a->weights) {
        int64_t b = it / pl->ntiles, t = it % pl->ntiles;
        if (a->causal) t = pl->ntiles - 1 - t;
        fa_batch_offsets(a, b, &off);
        FN(weights_rows)(a, pl->K, &off, &pl->ms, b, t, fa_min64(L - t * mcp, mcp), pl->ldv, &sc);
        return;
    }
    int64_t c = it / (pl->nbatch * nsplit), rest = it % (pl->nbatch * nsplit);
    if (a->causal) c = pl->nchunks - 1 - c;
    const int64_t b = rest / nsplit, s = rest % nsplit;
    fa_batch_offsets(a, b, &off);
    const int64_t r0 = c * pl->chunk_tiles * mcp, r1 = fa_min64(r0 + pl->chunk_tiles * mcp, L);
    const int64_t k0 = s * pl->split_kc, k1 = fa_min64(k0 + pl->split_kc, S);
    FN(stream_rows)(a, pl->K, &off, &pl->ms, r0, r1, k0, k1, pl->ldv, pl->base2, &sc);
    if (nsplit == 1)
        FN(write_out)(a, &off, r0, r1, pl->ldv, sc.o, sc.l, sc.m, pl->base2);
    else
        FN(store_partials)(pl->part, L, nsplit, pl->ldv, b, s, r0, r1, sc.m, sc.l, sc.o);
}

/* Batch b's key-split partials merged and written, on thread tid. */
static void FN(merge_item)(void *ctx, int64_t b, int tid)
{
    const FN(fa_plan) *pl = (const FN(fa_plan) *)ctx;
    FN(fa_scratch) sc = FN(scratch_carve)(pl->bufs[tid], &pl->lay);
    FN(merge_batch)(pl->a, pl->part, pl->nsplit, pl->ldv, pl->base2, b, sc.o, sc.l, sc.m);
}

static int FN(attention)(const fa_attention_args *a)
{
    FN(fa_plan) pl;
    if (!FN(plan_make)(&pl, a, KCUR())) return FA_OK;
    const int status = FN(plan_alloc)(&pl);
    if (status != FA_OK) return status;
    /* one parallel region: the mask summary (before the work items read
     * it), the work items, the key-split merge, barriers between */
    const fa_phase ph[3] = {
        {FA_SCHED_STATIC, pl.ms.state ? pl.ms.nslices * pl.ms.ntiles : 0, fa_mask_summary_fill,
         &pl.ms},
        {FA_SCHED_DYNAMIC, pl.nitems, FN(run_item), &pl},
        {FA_SCHED_STATIC, pl.nsplit > 1 ? pl.nbatch : 0, FN(merge_item), &pl}};
    fa_parallel_phases(pl.nt, pl.nsplit > 1 ? 3 : 2, ph);
    FN(plan_free)(&pl);
    return FA_OK;
}
