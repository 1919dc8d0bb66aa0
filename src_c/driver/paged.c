/* paged.c -- attention over paged KV caches (fa_attention_paged): keys and
 * values live in pools of fixed-size blocks, each sequence reaching its
 * positions through a row of a block table.  The driver of paged_tmpl.h,
 * once per element type; here the checks of the arguments (every block id
 * the call will read is inside the pool, before anything is written). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/flash16.h"
#include "driver/mask_summary.h"
#include "driver/offsets.h"
#include "driver/scratch.h"
#include "driver/window.h"
#include "fastattn.h"
#include "kernels/blocking.h"
#include "kernels/decode_q8.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

/* A prefill chunk streams this many of its query heads over each key
 * block at once (one packing of the block for all of them): with the
 * chunk's FA_PAGED_CHUNK_TILES tiles each, FA_MAX_CHUNK_MC tiles of rows,
 * the forward's bound of a thread's packed Q and O to the L2. */
#define FA_PAGED_CHUNK_HEADS (FA_MAX_CHUNK_MC / FA_PAGED_CHUNK_TILES)

/* A core multiplies and adds about this many floats in the time it reads
 * one byte from memory (the FMA units against the memory read rate of
 * one core, roughly): the exchange rate of fa_paged_cost. */
#define FA_PAGED_FLOPS_PER_BYTE 16

/* Work items are (entry, kv head): an entry is sequence b's query rows
 * [r0, r1) (its own indices) against its keys [k0, k1), key split s of its
 * ns; cost orders the items, longest first. */
typedef struct fa_paged_entry {
    int64_t b, r0, r1, k0, k1, s, ns, cost;
    int flash16; /* a prefill chunk on the 16-bit matrix driver (fa_paged_flash16_bytes) */
} fa_paged_entry;

static inline int64_t fa_paged_max(int64_t x, int64_t y) { return x > y ? x : y; }

static int64_t fa_paged_nq(const fa_paged_args *a, int64_t b)
{
    return a->cu_q[b + 1] - a->cu_q[b];
}

/* The keys [*lo, *hi) that some query row of [r0, r1) of sequence b sees
 * by causality and the window (query i at position n - nq + i). */
static void fa_paged_keys(const fa_paged_args *a, int64_t b, int64_t r0, int64_t r1,
                          int64_t *lo, int64_t *hi)
{
    const int64_t n = a->seq_lens[b], p0 = n - fa_paged_nq(a, b) + r0, p1 = p0 + (r1 - r0) - 1;
    const int64_t right = a->causal && a->win_right > 0 ? 0 : a->win_right;
    *lo = a->win_left >= p0 ? 0 : p0 - a->win_left;
    *hi = right >= n - p1 ? n : p1 + right + 1;
}

/* The cost of an item of rows [r0, r1) of sequence b against its keys
 * [k0, k1), to order the items longest first: its flops (each query head
 * of the group times the query-key pairs its rows see, 2 (E + Ev) each)
 * plus its bytes (the K and V rows, read once for the group) counted as
 * FA_PAGED_FLOPS_PER_BYTE flops each, so that a prefill chunk (compute)
 * and a decoding step (memory) compare by time. */
static int64_t fa_paged_cost(const fa_paged_args *a, int64_t b, int64_t r0, int64_t r1,
                             int64_t k0, int64_t k1)
{
    int64_t pairs = 0, lo, hi;
    for (int64_t r = r0; r < r1; r++) {
        fa_paged_keys(a, b, r, r + 1, &lo, &hi);
        lo = fa_paged_max(lo, k0), hi = fa_min64(hi, k1);
        pairs += hi > lo ? hi - lo : 0;
    }
    const int64_t flops = pairs * (a->Hq / a->Hkv) * 2 * (a->E + a->Ev);
    const int64_t bytes = (k1 - k0) * (a->E + a->Ev) * fa_storage_bytes(a->kv_storage);
    return flops + FA_PAGED_FLOPS_PER_BYTE * bytes;
}

/* The keys of one split of the decoding rows: the decoding rows' visible
 * keys over FA_PAGED_ITEMS items, at least FA_SPLIT_KC, whole key blocks. */
static int64_t fa_paged_split_kc(const fa_paged_args *a)
{
    int64_t total = 0, lo, hi;
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t nq = fa_paged_nq(a, b);
        if (nq < 1 || nq > FA_DIRECT_MAX_ROWS) continue;
        fa_paged_keys(a, b, 0, nq, &lo, &hi);
        total += hi - lo;
    }
    int64_t kc = fa_div_up(total * a->Hkv, FA_PAGED_ITEMS);
    return fa_round_up(kc < FA_SPLIT_KC ? FA_SPLIT_KC : kc, FA_KC);
}

/* The entries of the call (written to ent unless NULL; nsplit[b] too);
 * returns their number.  Decoding rows (at most FA_DIRECT_MAX_ROWS) are one
 * chunk whose keys are split when longer than two splits; more rows are
 * chunks of chunk_rows with their keys whole. */
static int64_t fa_paged_entries(const fa_paged_args *a, int64_t chunk_rows, int64_t split_kc,
                                fa_paged_entry *ent, int64_t *nsplit)
{
    int64_t n = 0, lo, hi;
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t nq = fa_paged_nq(a, b), step = nq <= FA_DIRECT_MAX_ROWS ? nq : chunk_rows;
        int64_t ns = 1;
        if (nq >= 1 && nq <= FA_DIRECT_MAX_ROWS) {
            fa_paged_keys(a, b, 0, nq, &lo, &hi);
            if (hi - lo > 2 * split_kc) ns = fa_div_up(hi - lo, split_kc);
        }
        if (nsplit) nsplit[b] = ns;
        for (int64_t r0 = 0; r0 < nq; r0 += step) {
            const int64_t r1 = fa_min64(r0 + step, nq);
            fa_paged_keys(a, b, r0, r1, &lo, &hi);
            if (hi < lo) hi = lo;
            for (int64_t s = 0; s < ns; s++, n++) {
                if (!ent) continue;
                fa_paged_entry *e = ent + n;
                e->b = b, e->r0 = r0, e->r1 = r1, e->s = s, e->ns = ns, e->flash16 = 0;
                e->k0 = ns == 1 ? lo : lo + s * split_kc;
                e->k1 = ns == 1 ? hi : fa_min64(e->k0 + split_kc, hi);
                e->cost = fa_paged_cost(a, b, r0, r1, e->k0, e->k1);
            }
        }
    }
    return n;
}

/* Longest first; ties in a fixed order (the order never changes a result,
 * only the balance). */
static int fa_paged_entry_cmp(const void *x, const void *y)
{
    const fa_paged_entry *p = (const fa_paged_entry *)x, *q = (const fa_paged_entry *)y;
    if (p->cost != q->cost) return p->cost > q->cost ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    if (p->r0 != q->r0) return p->r0 < q->r0 ? -1 : 1;
    return p->s < q->s ? -1 : (p->s > q->s);
}


/* n rows of ncols elements of size sz, from the block pool at src (row r
 * at element offset base + r ps, columns cs apart) to dst (contiguous);
 * int8 levels (scale given: float32 per row at scale + r ss) dequantised
 * into float32. */
static void fa_paged_copy(const char *src, int64_t sz, int64_t base, int64_t ps, int64_t cs,
                          int64_t n, int64_t ncols, const float *scale, int64_t ss, char *dst)
{
    for (int64_t r = 0; r < n; r++) {
        const int64_t o = base + r * ps;
        if (scale) {
            const int8_t *lv = (const int8_t *)src + o;
            const float f = scale[r * ss];
            float *d = (float *)dst + r * ncols;
            for (int64_t c = 0; c < ncols; c++) d[c] = f * (float)lv[c * cs];
        } else if (cs == 1) {
            memcpy(dst + r * ncols * sz, src + o * sz, (size_t)(ncols * sz));
        } else {
            for (int64_t c = 0; c < ncols; c++)
                memcpy(dst + (r * ncols + c) * sz, src + (o + c * cs) * sz, (size_t)sz);
        }
    }
}

/* Keys [k0, k1) of kv head g of sequence b, gathered from their blocks
 * into kbuf (rows of E) and vbuf (rows of Ev): the layout the forward's
 * streaming loop reads; int8 dequantised to float32. */
static void fa_paged_gather(const fa_paged_args *a, int64_t b, int64_t g, int64_t k0, int64_t k1,
                            char *kbuf, char *vbuf)
{
    const int64_t bs = a->block_size, *row = a->block_table + b * a->max_blocks;
    const int q8 = a->kv_storage == FA_INT8;
    const int64_t sz = fa_storage_bytes(a->kv_storage), dsz = q8 ? 4 : sz;
    for (int64_t p = k0; p < k1;) {
        const int64_t blk = row[p / bs], off = p % bs, n = fa_min64(bs - off, k1 - p);
        const int64_t j = p - k0;
        fa_paged_copy((const char *)a->k, sz, blk * a->k_bs + off * a->k_ps + g * a->k_hs,
                      a->k_ps, a->k_cs, n, a->E,
                      q8 ? a->k_scale + blk * a->ks_bs + off * a->ks_ps + g * a->ks_hs : NULL,
                      a->ks_ps, kbuf + j * a->E * dsz);
        fa_paged_copy((const char *)a->v, sz, blk * a->v_bs + off * a->v_ps + g * a->v_hs,
                      a->v_ps, a->v_cs, n, a->Ev,
                      q8 ? a->v_scale + blk * a->vs_bs + off * a->vs_ps + g * a->vs_hs : NULL,
                      a->vs_ps, vbuf + j * a->Ev * dsz);
        p += n;
    }
}

/* The rows of keys [kb, kb + nk) (nk <= FA_KC) of kv head g of entry e's
 * sequence into t, page run by page run of its block table row, and the
 * FA_KC key rows after them up to the entry's last key, to be prefetched
 * (NULL past it). */
static void fa_paged_rows(const fa_paged_args *a, const fa_paged_entry *e, int64_t g, int64_t kb,
                          int64_t nk, fa_krows *t)
{
    const int64_t bs = a->block_size, *row = a->block_table + e->b * a->max_blocks;
    const int64_t sz = fa_storage_bytes(a->kv_storage), end = fa_min64(kb + nk + FA_KC, e->k1);
    const int64_t kps = a->k_ps * sz, vps = a->v_ps * sz;
    t->n = nk, t->kbytes = a->E * sz;
    t->vrun = a->v_ps == a->Ev ? bs * a->Ev * sz : a->Ev * sz;
    for (int64_t p = kb; p < end;) {
        const int64_t blk = row[p / bs], off = p % bs, n = fa_min64(bs - off, end - p);
        const char *k = (const char *)a->k + (blk * a->k_bs + off * a->k_ps + g * a->k_hs) * sz;
        const char *v = (const char *)a->v + (blk * a->v_bs + off * a->v_ps + g * a->v_hs) * sz;
        for (int64_t u = 0; u < n; u++, p++) {
            t->k[p - kb] = k + u * kps;
            if (p < kb + nk) t->v[p - kb] = v + u * vps;
        }
    }
    for (int64_t j = end - kb; j < nk + FA_KC; j++) t->k[j] = NULL;
}

/* The forward's one-problem call for query head h of sequence b over the
 * keys gathered from k0: L = its queries, keys k0 .. n counted from 0
 * (S = n - k0, so the causal offset n - nq - k0 keeps every position, and a
 * window side wider than L + S still bounds nothing). */
static void fa_paged_local(const fa_paged_args *a, int64_t b, int64_t h, int64_t k0,
                           const void *kbuf, const void *vbuf, fa_attention_args *la)
{
    const int64_t n = a->seq_lens[b], nq = fa_paged_nq(a, b), cu = a->cu_q[b];
    const int64_t qsz = fa_storage_bytes(a->storage), dsz = fa_storage_bytes(a->dtype);
    memset(la, 0, sizeof *la);
    la->dtype = a->dtype;
    la->storage = a->storage;
    la->kv_storage = a->kv_storage == FA_INT8 ? FA_FLOAT32 : a->kv_storage;
    la->L = nq, la->S = n - k0, la->E = a->E, la->Ev = a->Ev;
    la->q.data = (const char *)a->q + (cu * a->q_rs + h * a->q_hs) * qsz;
    la->q.rs = a->q_rs, la->q.cs = a->q_cs;
    la->k.data = kbuf, la->k.rs = a->E, la->k.cs = 1;
    la->v.data = vbuf, la->v.rs = a->Ev, la->v.cs = 1;
    la->out.data = (char *)a->out + (cu * a->o_rs + h * a->o_hs) * qsz;
    la->out.rs = a->o_rs, la->out.cs = a->o_cs;
    la->scale = a->scale, la->softcap = a->softcap;
    la->causal = a->causal, la->causal_offset = n - nq - k0;
    la->win_left = a->win_left, la->win_right = a->win_right;
    la->alibi.data = a->alibi ? a->alibi + h : NULL;
    la->sinks.data = a->sinks ? a->sinks + h : NULL;
    la->lse.data = a->lse ? (char *)a->lse + (h * a->total_q + cu) * dsz : NULL;
    la->lse.rs = 1;
    la->num_threads = 1;
}

/* fa_paged_local for the rows [e->r0, e->r1) of prefill entry e alone
 * against its keys [e->k0, e->k1), gathered at kbuf, vbuf, for the G query
 * heads of kv head g as a batch dimension (the keys and values shared: a
 * stride of 0): the problem the 16-bit matrix driver takes, its panels
 * packed once for the group. */
static void fa_paged_chunk_local(const fa_paged_args *a, const fa_paged_entry *e, int64_t g,
                                 const void *kbuf, const void *vbuf, fa_attention_args *la)
{
    const int64_t qsz = fa_storage_bytes(a->storage), dsz = fa_storage_bytes(a->dtype);
    const int64_t G = a->Hq / a->Hkv;
    fa_paged_local(a, e->b, g * G, e->k0, kbuf, vbuf, la);
    la->nbatch_dims = 1;
    la->batch_shape[0] = G;
    la->q.bstride[0] = a->q_hs;
    la->out.bstride[0] = a->o_hs;
    la->lse.bstride[0] = a->total_q;
    la->L = e->r1 - e->r0;
    la->S = e->k1 - e->k0; /* the keys past them are hidden from every row */
    la->q.data = (const char *)la->q.data + e->r0 * a->q_rs * qsz;
    la->out.data = (char *)la->out.data + e->r0 * a->o_rs * qsz;
    if (la->lse.data) la->lse.data = (char *)la->lse.data + e->r0 * dsz;
    la->causal_offset += e->r0;
}

/* Does prefill entry e run on the 16-bit matrix driver (driver/flash16.h:
 * AMX tiles or VDPBF16PS, P.V on 16-bit operands)?  Queries and caches of
 * one 16-bit type, a sequence with as many queries as the forward takes
 * there (so that every chunk of it, a short last one too, runs where
 * fastattn.attention runs its rows), and a problem that driver takes (no
 * soft cap, ALiBi or sinks: the same for every kv head): the scratch bytes
 * of one kv head's problem, else 0 (pchunk's float32 path). */
static int64_t fa_paged_flash16_bytes(const fa_paged_args *a, const fa_paged_entry *e)
{
    const int64_t nq = fa_paged_nq(a, e->b);
    if (a->dtype != FA_FLOAT32 || a->storage == FA_FLOAT32 || a->kv_storage != a->storage ||
        nq <= FA_DIRECT_MAX_ROWS || nq < FA_FLASH16_MIN_ROWS || e->ns != 1)
        return 0;
    fa_attention_args la;
    fa_paged_chunk_local(a, e, 0, NULL, NULL, &la);
    return fa_flash16_one_bytes(&la);
}

/* Does the entry run the query heads of a kv head group as the rows of one
 * problem?  For a decoding step (one query, so causality hides nothing of
 * the gathered keys, which are exactly those its window shows) whose heads
 * differ by no per-head score option: each gathered key is then read once
 * for the whole group.  At most FA_MC heads: one score tile of rows. */
static int fa_paged_grouped(const fa_paged_args *a, const fa_paged_entry *e)
{
    return a->Hq > a->Hkv && a->Hq / a->Hkv <= FA_MC && e->r1 - e->r0 == 1 &&
           fa_paged_nq(a, e->b) == 1 && !a->alibi && !a->sinks;
}

/* Does a grouped entry read its keys and values in place, from the pages
 * (no copy)?  With the direct kernels (at most FA_DIRECT_MAX_ROWS heads, as
 * the forward's decoding path) on float or 16-bit pools of unit column
 * stride; int8 pools are dequantised by the copy. */
static int fa_paged_in_place(const fa_paged_args *a, const fa_paged_entry *e)
{
    return fa_paged_grouped(a, e) && a->Hq / a->Hkv <= FA_DIRECT_MAX_ROWS &&
           a->kv_storage != FA_INT8 && (a->k_cs == 1 || a->E == 1) && (a->v_cs == 1 || a->Ev == 1);
}

/* Does the entry run on the int8 kernel (decode_q8.h), its keys and values
 * read in place through the block table and dequantised in registers?  A
 * decoding entry (all its sequence's queries, at most FA_DIRECT_MAX_ROWS)
 * on an int8 pool, every row of unit column stride; the kernel takes the
 * query heads of the kv head group with all their score options. */
static int fa_paged_q8(const fa_paged_args *a, const fa_paged_entry *e)
{
    const int64_t nq = fa_paged_nq(a, e->b);
    return a->kv_storage == FA_INT8 && e->r0 == 0 && e->r1 == nq && nq <= FA_DIRECT_MAX_ROWS &&
           (a->k_cs == 1 || a->E == 1) && (a->v_cs == 1 || a->Ev == 1) &&
           (a->q_cs == 1 || a->E == 1) && (a->o_cs == 1 || a->Ev == 1);
}

/* The int8 kernel's item for kv head g of entry e (fa_paged_q8): the G
 * query heads of the group times the sequence's nq queries as rows, keys
 * [e->k0, e->k1) counted from the sequence's first; a split entry leaves
 * its partials at part (rows ns (ldv + 2) apart) for the merge. */
static void fa_paged_q8_item(const fa_paged_args *a, const fa_paged_entry *e, int64_t g,
                             float *part, int64_t ldv, float *scratch, fa_q8_item *it)
{
    const int64_t G = a->Hq / a->Hkv, h0 = g * G, nq = e->r1, cu = a->cu_q[e->b];
    memset(it, 0, sizeof *it);
    it->rows = G * nq, it->L = nq, it->S = e->k1, it->E = a->E, it->Ev = a->Ev;
    it->q = (const float *)a->q + cu * a->q_rs + h0 * a->q_hs;
    it->q_hs = a->q_hs, it->q_rs = a->q_rs;
    it->k = (const int8_t *)a->k + g * a->k_hs, it->k_rs = a->k_ps, it->k_bs = a->k_bs;
    it->v = (const int8_t *)a->v + g * a->v_hs, it->v_rs = a->v_ps, it->v_bs = a->v_bs;
    it->k_scale = a->k_scale + g * a->ks_hs, it->ks_rs = a->ks_ps, it->ks_bs = a->ks_bs;
    it->v_scale = a->v_scale + g * a->vs_hs, it->vs_rs = a->vs_ps, it->vs_bs = a->vs_bs;
    it->blocks = a->block_table + e->b * a->max_blocks, it->block_size = a->block_size;
    it->key_lo = e->k0;
    it->out = (float *)a->out + cu * a->o_rs + h0 * a->o_hs;
    it->o_hs = a->o_hs, it->o_rs = a->o_rs;
    it->lse = a->lse ? (float *)a->lse + h0 * a->total_q + cu : NULL, it->lse_hs = a->total_q;
    if (e->ns > 1) it->part = part, it->part_rs = e->ns * (ldv + 2), it->part_ld = ldv;
    it->scale = (float)a->scale, it->softcap = (float)a->softcap;
    it->alibi = a->alibi ? a->alibi + h0 : NULL;
    it->sinks = a->sinks ? a->sinks + h0 : NULL;
    it->causal = a->causal, it->causal_offset = a->seq_lens[e->b] - nq;
    it->win_left = a->win_left, it->win_right = a->win_right;
    it->scratch = scratch;
}

/* fa_paged_local for the G query heads from h0 of sequence b as rows (see
 * fa_paged_grouped): row i is head h0 + i, every gathered key visible. */
static void fa_paged_group_local(const fa_paged_args *a, int64_t b, int64_t h0, int64_t G,
                                 int64_t k0, const void *kbuf, const void *vbuf,
                                 fa_attention_args *la)
{
    fa_paged_local(a, b, h0, k0, kbuf, vbuf, la);
    la->L = G;
    la->q.rs = a->q_hs;
    la->out.rs = a->o_hs;
    la->lse.rs = a->total_q;
    la->causal = 0;
    la->causal_offset = 0;
    la->win_left = la->win_right = FA_UNBOUNDED;
}

#define FA_SFX f32
#include "driver/paged_tmpl.h" /* paged_f32 */
#undef FA_SFX
#define FA_SFX f64
#include "driver/paged_tmpl.h" /* paged_f64 */
#undef FA_SFX

/* The storage types a call may combine: float64 throughout; float32
 * queries over float32, 16-bit or int8 caches; 16-bit queries over caches
 * of their own type. */
static int fa_paged_types_ok(const fa_paged_args *a)
{
    const int kv = a->kv_storage;
    if (a->dtype == FA_FLOAT64) return a->storage == FA_FLOAT64 && kv == FA_FLOAT64;
    if (a->dtype != FA_FLOAT32) return 0;
    if (a->storage == FA_FLOAT32)
        return kv == FA_FLOAT32 || kv == FA_FLOAT16 || kv == FA_BFLOAT16 || kv == FA_INT8;
    return (a->storage == FA_FLOAT16 || a->storage == FA_BFLOAT16) && kv == a->storage;
}

/* Shapes, and every sequence: 0 <= queries <= keys, its keys within its
 * row of the block table, each block id it reads inside the pool. */
static int fa_paged_args_ok(const fa_paged_args *a)
{
    if (a->B < 0 || a->Hq < 1 || a->Hkv < 1 || a->Hq % a->Hkv != 0 || a->E < 1 || a->Ev < 1 ||
        a->block_size < 1 || a->num_blocks < 0 || a->max_blocks < 0 || a->total_q < 0 ||
        a->win_left < 0 || a->win_right < 0 || !(a->softcap <= 0 || isfinite(a->softcap)) ||
        !fa_paged_types_ok(a))
        return 0;
    if (a->kv_storage == FA_INT8 && (!a->k_scale || !a->v_scale)) return 0;
    if (a->cu_q[0] != 0 || a->cu_q[a->B] != a->total_q) return 0;
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t n = a->seq_lens[b], nq = a->cu_q[b + 1] - a->cu_q[b];
        if (n < 0 || nq < 0 || nq > n || n > a->max_blocks * a->block_size) return 0;
        const int64_t *row = a->block_table + b * a->max_blocks;
        for (int64_t p = 0; p < fa_div_up(n, a->block_size); p++)
            if (row[p] < 0 || row[p] >= a->num_blocks) return 0;
    }
    return 1;
}

int fa_attention_paged(const fa_paged_args *a)
{
    if (!a || !a->block_table || !a->seq_lens || !a->cu_q || !fa_paged_args_ok(a))
        return FA_EINVAL;
    if (a->dtype == FA_FLOAT64) return paged_f64(a);
    return paged_f32(a);
}
