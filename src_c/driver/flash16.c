/* flash16.c -- the 16-bit matrix driver (contract: flash16.h): the plan,
 * the scratch layout and the loops; all arithmetic is in the ISA's 16-bit
 * matrix kernels (kernels/flash16.h: an entry of its f32 table).
 *
 * Work items are (chunk of query blocks of FA_FLASH16_MQ rows x group of
 * batch indices that read the same keys and values: the query heads of a
 * grouped-query head, else one), at most FA_FLASH16_MAX_CHUNK blocks in
 * all, dynamically scheduled, the causal longest first: an item's result
 * does not depend on the thread that runs it, nor on how the blocks are
 * grouped, so results are bitwise the same for any thread count.  An item
 * walks the keys its rows see in panels of FA_FLASH16_PANEL keys, packed
 * once into its thread's scratch (K rows, V^T) and shared by all its query
 * blocks; each block keeps its own state (Q^T,
 * O^T, m, l) across the panels and runs, by the ISA's key_blocks kernel
 * (kernels/flash16_blocks.h), over the key blocks of kb keys (the table's) of
 * a panel (on its own grid of FA_FLASH16_KGRID from its first key, so every
 * block meets the same key blocks in any chunk):
 *   per key block j: masks (causal, window, key padding) on S^T, the
 *   running max (raised lazily; then O^T, complete up to block j-1, is
 *   rescaled), the weights P^T -- and, issued a few at a time between the
 *   weights' vector instructions, the queued steps of Q.K^T of block j+1
 *   and P.V of block j-1, so that the tile unit and the vector units work
 *   at once; then out = O / l, the lse, and the columns that see a NaN or
 *   Inf value (packed as 0) put back to IEEE's sum. */
#include <math.h>
#include <string.h>

#include "driver/flash16.h"
#include "driver/offsets.h"
#include "driver/window.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

#define MQ FA_FLASH16_MQ
#define KGRID FA_FLASH16_KGRID
#define HALF FA_FLASH16_HALF
/* keys packed per panel: its own plus the last block's overhang (a block
 * starting in the panel on a grid offset by KGRID runs kb - KGRID past it) */
static int64_t fa_flash16_panel_keys(int64_t kb) { return FA_FLASH16_PANEL + kb - KGRID; }

/* One thread's scratch in bytes, every array 64-byte aligned (a tile row, a
 * cache line): sizes the allocation and carves it.  The chunk's query
 * block b has its state at block + b * block_bytes. */
typedef struct fa_flash16_layout {
    int64_t tf, kp, vt, st, pt, alpha, tmp, flags; /* shared by the chunk's blocks */
    int64_t ot, qt, m, l;                          /* within one block's state */
    int64_t block, block_bytes, total;
} fa_flash16_layout;

typedef struct fa_flash16_bufs {
    void *tf;
    uint16_t *kp, *vt, *tmp;
    float *st, *alpha;
    uint32_t *pt;
    uint8_t *flags; /* flags[j]: key j's value row has a NaN or Inf */
    char *blocks;
} fa_flash16_bufs;

typedef struct fa_flash16_state {
    float *ot, *m, *l;
    uint16_t *qt;
} fa_flash16_state;

typedef struct fa_flash16_plan {
    const fa_attention_args *a;
    const fa_flash16_kernels *K;
    fa_limits lim;
    float c;        /* scale * log2(e): the scores in log2 units */
    int f16;        /* 1: float16, 0: bfloat16 */
    int64_t nb, nqb, chunk, nchunks; /* batch items, query blocks, blocks per chunk */
    int64_t hg, ng;                  /* batch indices per item (fa_flash16_heads), items per chunk */
    int64_t ep, evp, npk, vt_rs;       /* padded E and Ev, keys packed per panel, V^T stride */
    fa_flash16_layout lay;
    char *scratch;
} fa_flash16_plan;

static int64_t lay_take(int64_t *at, int64_t bytes)
{
    const int64_t o = *at;
    *at += fa_round_up(bytes, 64);
    return o;
}

static fa_flash16_layout fa_flash16_layout_of(const fa_flash16_plan *pl)
{
    fa_flash16_layout y;
    int64_t at = 0, b = 0;
    y.tf = lay_take(&at, pl->K->tile_bytes);
    y.kp = lay_take(&at, pl->npk * pl->ep * 2);
    y.vt = lay_take(&at, pl->evp * pl->vt_rs * 2);
    y.st = lay_take(&at, 2 * pl->K->kb * MQ * 4);                /* two S^T blocks */
    y.pt = lay_take(&at, 2 * (pl->K->kb / 2) * 2 * HALF * 4);    /* two P^T blocks */
    y.alpha = lay_take(&at, MQ * 4);
    y.tmp = lay_take(&at, 2 * HALF * 2);
    y.flags = lay_take(&at, pl->a->S);
    y.ot = lay_take(&b, pl->evp * MQ * 4);
    y.qt = lay_take(&b, pl->ep / FA_FLASH16_EPAIR * 2 * FA_FLASH16_TILE * 2);
    y.m = lay_take(&b, MQ * 4);
    y.l = lay_take(&b, MQ * 4);
    y.block = at;
    y.block_bytes = b;
    y.total = at + pl->chunk * pl->hg * b;
    return y;
}

static fa_flash16_bufs fa_flash16_carve(char *base, const fa_flash16_layout *y)
{
    fa_flash16_bufs bf;
    bf.tf = base + y->tf;
    bf.kp = (uint16_t *)(base + y->kp);
    bf.vt = (uint16_t *)(base + y->vt);
    bf.st = (float *)(base + y->st);
    bf.pt = (uint32_t *)(base + y->pt);
    bf.alpha = (float *)(base + y->alpha);
    bf.tmp = (uint16_t *)(base + y->tmp);
    bf.flags = (uint8_t *)(base + y->flags);
    bf.blocks = base + y->block;
    return bf;
}

static fa_flash16_state fa_flash16_state_of(const fa_flash16_bufs *bf, const fa_flash16_layout *y,
                                            int64_t b)
{
    char *base = bf->blocks + b * y->block_bytes;
    fa_flash16_state s;
    s.ot = (float *)(base + y->ot);
    s.qt = (uint16_t *)(base + y->qt);
    s.m = (float *)(base + y->m);
    s.l = (float *)(base + y->l);
    return s;
}

/* Does the path take the call of at least min_rows rows (flash16.h)?
 * *f16: float16 on tiles. */
static int fa_flash16_takes(const fa_attention_args *a, const fa_flash16_kernels *K,
                            int64_t min_rows, int *f16)
{
    if (!K->pack_kv || a->dtype != FA_FLOAT32 || a->L < min_rows || a->weights ||
        a->bool_mask.data || a->add_mask.data || a->softcap > 0 || a->alibi.data ||
        a->sinks.data)
        return 0;
    if (a->E > FA_FLASH16_MAX_E || a->Ev > FA_FLASH16_MAX_E || a->S < 1 || a->E < 1 ||
        a->Ev < 1 || !(a->scale > 0))
        return 0;
    *f16 = a->storage == FA_FLOAT16 && K->fp16 && fa_amx_fp16();
    return a->storage == FA_BFLOAT16 || *f16;
}

/* The rows of the query block at q0 for the mask kernel. */
static fa_flash16_rows fa_flash16_rows_of(const fa_flash16_plan *pl, const fa_offsets *off,
                                          int64_t q0)
{
    const fa_attention_args *a = pl->a;
    fa_flash16_rows r;
    r.q0 = q0;
    r.lo = pl->lim.lo;
    r.hi = pl->lim.hi;
    r.has_lo = pl->lim.has_lo;
    r.has_hi = pl->lim.has_hi;
    r.pad = a->pad.data ? (const uint8_t *)a->pad.data + off->pad : NULL;
    r.pad_cs = a->pad.cs;
    return r;
}

/* Pack keys [p0, pe) of batch offsets off; returns 1 if a value is NaN or Inf. */
static unsigned fa_flash16_pack_panel(const fa_flash16_plan *pl, const fa_flash16_bufs *bf,
                                      const fa_offsets *off, int64_t p0, int64_t pe)
{
    const fa_attention_args *a = pl->a;
    fa_flash16_pack p;
    p.k = (const uint16_t *)a->k.data + off->k + p0 * a->k.rs;
    p.v = (const uint16_t *)a->v.data + off->v + p0 * a->v.rs;
    p.krs = a->k.rs;
    p.kcs = a->k.cs;
    p.vrs = a->v.rs;
    p.vcs = a->v.cs;
    p.E = a->E;
    p.Ev = a->Ev;
    p.ep = pl->ep;
    p.evp = pl->evp;
    p.nk = pe - p0;
    p.npk = fa_round_up(pe - p0, KGRID);
    p.vt_rs = pl->vt_rs;
    p.exp_bits = fa_half_bits_of(pl->f16).exp;
    p.kp = bf->kp;
    p.vt = bf->vt;
    p.flags = bf->flags + p0;
    return pl->K->pack_kv(&p);
}

/* The query block at q0 over the key blocks that start in the panel
 * [p0, p1) (packed from p0): the ISA's key_blocks over the range its rows
 * see. */
static void fa_flash16_panel(const fa_flash16_plan *pl, const fa_flash16_bufs *bf,
                             const fa_flash16_state *s, const fa_flash16_rows *rows, int64_t nq,
                             int64_t p0, int64_t p1)
{
    int64_t lo, hi;
    fa_limits_keys(&pl->lim, rows->q0, nq, pl->a->S, &lo, &hi);
    const int64_t g0 = lo / KGRID * KGRID, kend = hi < p1 ? hi : p1;
    const int64_t kb = pl->K->kb, k0 = g0 >= p0 ? g0 : g0 + fa_div_up(p0 - g0, kb) * kb;
    if (k0 >= kend) return;
    const fa_flash16_blocks blk = {
        bf->tf, pl->f16, rows, bf->kp, bf->vt, s->qt, p0, k0, kend, hi, pl->ep, pl->vt_rs,
        pl->evp, s->ot, s->m, s->l, bf->st, bf->alpha, bf->pt, pl->c};
    pl->K->key_blocks(&blk);
}

/* Is the weight of key j in row i of the query block at rows->q0 zero:
 * 2^(c q.k - m) below the least normal (a -inf score, or an exp that
 * underflows; the tile product reads subnormal weights as 0), with m the
 * row's final maximum?  The dot product is recomputed here in float32:
 * only for the rare keys whose value is NaN or Inf. */
static int fa_flash16_zero_weight(const fa_flash16_plan *pl, const fa_offsets *off,
                                  int64_t i, int64_t j, float m)
{
    const fa_attention_args *a = pl->a;
    const uint16_t *q = (const uint16_t *)a->q.data + off->q + i * a->q.rs;
    const uint16_t *k = (const uint16_t *)a->k.data + off->k + j * a->k.rs;
    float d = 0;
    for (int64_t e = 0; e < a->E; e++) {
        const uint16_t x = q[e * a->q.cs], y = k[e * a->k.cs];
        d += pl->f16 ? fa_f16_to_f32(x) * fa_f16_to_f32(y) : fa_bf16_to_f32(x) * fa_bf16_to_f32(y);
    }
    return !(pl->c * d - m >= -126.0f); /* NaN scores reach the row through the tiles */
}

/* The output columns of rows q0 .. q0+nq-1 that see a key of [klo, khi)
 * with a NaN or Inf value (packed as 0) at a weight above 0: IEEE's sum of
 * w_j v_j over those keys there -- NaN for a NaN or for +Inf and -Inf
 * together, else the infinity.  m, l: the rows' final maxima and sums. */
static void fa_flash16_nonfinite(const fa_flash16_plan *pl, const fa_flash16_bufs *bf,
                                 const fa_offsets *off, const fa_flash16_rows *rows, int64_t nq,
                                 const float *m, const float *l, int64_t klo, int64_t khi,
                                 uint16_t *out)
{
    const fa_attention_args *a = pl->a;
    const uint16_t *v = (const uint16_t *)a->v.data + off->v;
    const fa_half_bits bits = fa_half_bits_of(pl->f16);
    for (int64_t i = 0; i < nq; i++) {
        if (!(l[i] > 0)) continue; /* nothing visible, or already NaN */
        for (int64_t j = klo; j < khi; j++) {
            if (!bf->flags[j] || (rows->pad && rows->pad[j * rows->pad_cs]) ||
                fa_limits_none(&pl->lim, rows->q0 + i, 1, j, 1) ||
                fa_flash16_zero_weight(pl, off, rows->q0 + i, j, m[i]))
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

/* Query block b of a chunk at q0: its state started (m -inf, l 0, O^T 0,
 * Q^T packed) or, done = 1, written out. */
static void fa_flash16_block(const fa_flash16_plan *pl, const fa_flash16_bufs *bf,
                             const fa_offsets *off, int64_t b, int64_t q0, int done)
{
    const fa_attention_args *a = pl->a;
    const fa_flash16_state s = fa_flash16_state_of(bf, &pl->lay, b);
    const int64_t nq = fa_min64(a->L - q0, MQ);
    if (!done) {
        for (int i = 0; i < MQ; i++) { s.m[i] = -INFINITY; s.l[i] = 0; }
        memset(s.ot, 0, (size_t)(pl->evp * MQ) * 4);
        pl->K->pack_qt((const uint16_t *)a->q.data + off->q + q0 * a->q.rs, a->q.rs, a->q.cs,
                       a->E, nq, pl->ep / FA_FLASH16_EPAIR, s.qt);
        return;
    }
    uint16_t *out = (uint16_t *)a->out.data + off->o + q0 * a->out.rs;
    pl->K->finish(s.ot, s.l, nq, a->Ev, pl->f16, out, a->out.rs, a->out.cs, bf->tmp);
    if (a->lse.data) {
        float *lse = (float *)a->lse.data + off->lse + q0 * a->lse.rs;
        for (int64_t i = 0; i < nq; i++)
            lse[i * a->lse.rs] = s.l[i] > 0 ? (float)fa_lse_of(s.m[i], s.l[i], 1)
                                            : (s.l[i] == 0 ? -INFINITY : s.l[i]);
    }
}

/* The keys [*klo, *khi) that some row of the nblk query blocks (rows rows)
 * at r0 sees, from the first block's grid: the first block's lowest, the
 * last block's highest (both limits grow with the row). */
static void fa_flash16_chunk_keys(const fa_flash16_plan *pl, int64_t r0, int64_t nblk,
                                  int64_t rows, int64_t *klo, int64_t *khi)
{
    int64_t lo_last, hi_first;
    fa_limits_keys(&pl->lim, r0, fa_min64(rows, MQ), pl->a->S, klo, &hi_first);
    fa_limits_keys(&pl->lim, r0 + (nblk - 1) * MQ, rows - (nblk - 1) * MQ, pl->a->S, &lo_last, khi);
    *klo = *klo / KGRID * KGRID;
}

/* Work item it = (chunk of query blocks, group of pl->hg batch indices
 * that read the same keys and values): chunk-major, the causal longest
 * rows first, so that the dynamic schedule ends on short items (the float
 * driver's order).  The group's blocks (batch index s of the group, block
 * b: state s * nblk + b) run over each panel packed once for them all. */
static void fa_flash16_item(void *ctx, int64_t it, int tid)
{
    const fa_flash16_plan *pl = (const fa_flash16_plan *)ctx;
    const fa_attention_args *a = pl->a;
    const int64_t c = a->causal ? pl->nchunks - 1 - it / pl->ng : it / pl->ng;
    const int64_t r0 = c * pl->chunk * MQ, hg = pl->hg;
    const int64_t nblk = fa_min64(pl->chunk, pl->nqb - r0 / MQ);
    const int64_t rows = fa_min64(nblk * MQ, a->L - r0);
    fa_offsets off[FA_FLASH16_MAX_CHUNK];
    for (int64_t h = 0; h < hg; h++) fa_batch_offsets(a, it % pl->ng * hg + h, &off[h]);
    const fa_flash16_bufs bf = fa_flash16_carve(pl->scratch + (size_t)tid * (size_t)pl->lay.total,
                                                &pl->lay);
    for (int64_t h = 0; h < hg; h++)
        for (int64_t b = 0; b < nblk; b++)
            fa_flash16_block(pl, &bf, &off[h], h * nblk + b, r0 + b * MQ, 0);
    int64_t klo, khi;
    fa_flash16_chunk_keys(pl, r0, nblk, rows, &klo, &khi);
    unsigned nonfinite = 0;
    if (klo < khi) memset(bf.flags + klo, 0, (size_t)(khi - klo));
    pl->K->tiles_on(bf.tf);
    const int64_t panel_keys = fa_flash16_panel_keys(pl->K->kb);
    for (int64_t p0 = klo; p0 < khi; p0 += FA_FLASH16_PANEL) {
        nonfinite |= fa_flash16_pack_panel(pl, &bf, &off[0], p0, fa_min64(khi, p0 + panel_keys));
        for (int64_t h = 0; h < hg; h++)
            for (int64_t b = 0; b < nblk; b++) {
                const fa_flash16_rows rw = fa_flash16_rows_of(pl, &off[h], r0 + b * MQ);
                const fa_flash16_state st = fa_flash16_state_of(&bf, &pl->lay, h * nblk + b);
                fa_flash16_panel(pl, &bf, &st, &rw, fa_min64(a->L - rw.q0, MQ), p0,
                                 fa_min64(khi, p0 + FA_FLASH16_PANEL));
            }
    }
    pl->K->tiles_off(bf.tf);
    for (int64_t h = 0; h < hg; h++)
        for (int64_t b = 0; b < nblk; b++) {
            const int64_t q0 = r0 + b * MQ, nq = fa_min64(a->L - q0, MQ);
            fa_flash16_block(pl, &bf, &off[h], h * nblk + b, q0, 1);
            if (!nonfinite) continue;
            const fa_flash16_rows rw = fa_flash16_rows_of(pl, &off[h], q0);
            const fa_flash16_state st = fa_flash16_state_of(&bf, &pl->lay, h * nblk + b);
            fa_flash16_nonfinite(pl, &bf, &off[h], &rw, nq, st.m, st.l, klo, khi,
                                 (uint16_t *)a->out.data + off[h].o + q0 * a->out.rs);
        }
}

/* The batch indices an item takes together: the length of the last batch
 * dimension along which the keys, values and key padding do not move
 * (stride 0: grouped-query heads, whose panels are then packed once per
 * group, not per head), if its blocks fit FA_FLASH16_MAX_CHUNK; else 1.
 * Which blocks share an item changes no bit. */
static int64_t fa_flash16_heads(const fa_attention_args *a)
{
    const int d = a->nbatch_dims - 1;
    if (d < 0 || a->k.bstride[d] != 0 || a->v.bstride[d] != 0 ||
        (a->pad.data && a->pad.bstride[d] != 0))
        return 1;
    const int64_t g = a->batch_shape[d];
    return g >= 1 && g <= FA_FLASH16_MAX_CHUNK ? g : 1;
}

/* The plan of a on nt threads (its scratch not yet given); 0 where the
 * path declines a. */
static int fa_flash16_setup(fa_flash16_plan *pl, const fa_attention_args *a, int nt,
                            int64_t min_rows)
{
    memset(pl, 0, sizeof *pl);
    pl->a = a;
    pl->K = fa_flash16_current();
    if (!fa_flash16_takes(a, pl->K, min_rows, &pl->f16)) return 0;
    pl->nb = 1;
    for (int d = 0; d < a->nbatch_dims; d++) pl->nb *= a->batch_shape[d];
    if (pl->nb == 0) return 0;
    pl->lim = fa_limits_of(a);
    pl->c = (float)(a->scale * FA_LOG2E);
    pl->nqb = fa_div_up(a->L, MQ);
    pl->hg = fa_flash16_heads(a);
    pl->ng = pl->nb / pl->hg;
    /* chunks share a packed panel: as long as there are enough of them to
     * keep the threads busy (the float driver's rule), and at most
     * FA_FLASH16_MAX_CHUNK blocks with the group's */
    pl->chunk = fa_min64(fa_min64(fa_div_up(pl->ng * pl->nqb, 4 * (int64_t)nt),
                                  FA_FLASH16_MAX_CHUNK / pl->hg),
                         pl->nqb);
    pl->nchunks = fa_div_up(pl->nqb, pl->chunk);
    pl->ep = fa_round_up(a->E, FA_FLASH16_EPAIR);
    pl->evp = fa_round_up(a->Ev, FA_FLASH16_EROWS);
    pl->npk = fa_min64(fa_round_up(a->S, KGRID), fa_flash16_panel_keys(pl->K->kb));
    pl->vt_rs = pl->npk + KGRID; /* so that V^T rows are not 4 KiB apart (L1 set aliasing) */
    pl->lay = fa_flash16_layout_of(pl);
    return 1;
}

int fa_flash16(const fa_attention_args *a)
{
    fa_flash16_plan pl;
    const int nt = fa_resolve_threads(a->num_threads);
    if (!fa_flash16_setup(&pl, a, nt, FA_FLASH16_MIN_ROWS)) return FA_FLASH16_DECLINED;
    void *mem = fa_malloc((size_t)pl.lay.total * (size_t)nt + 64); /* before any output */
    if (!mem) return FA_ENOMEM;
    pl.scratch = (char *)mem + (64 - (uintptr_t)mem % 64) % 64;
    fa_parallel_for(nt, FA_SCHED_DYNAMIC, pl.ng * pl.nchunks, fa_flash16_item, &pl);
    fa_free(mem);
    return FA_OK;
}

int64_t fa_flash16_one_bytes(const fa_attention_args *a)
{
    fa_flash16_plan pl;
    return fa_flash16_setup(&pl, a, 1, 1) ? pl.lay.total : 0;
}

int fa_flash16_one(const fa_attention_args *a, void *mem)
{
    fa_flash16_plan pl;
    if (!fa_flash16_setup(&pl, a, 1, 1)) return FA_FLASH16_DECLINED;
    pl.scratch = (char *)mem;
    for (int64_t it = 0; it < pl.ng * pl.nchunks; it++) fa_flash16_item(&pl, it, 0);
    return FA_OK;
}
