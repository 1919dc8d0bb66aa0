/* flash16_blocks.h -- the loop over one packed panel's key blocks for one
 * query block (contract: kernels/flash16.h, fa_flash16_blocks), compiled
 * per ISA with the steps it calls, so that they are direct calls (and
 * inlined) rather than calls through the table: at E = 64 a key block's
 * steps are ~1 us of work, and five calls through the table per block cost
 * a few percent of it.  Software-pipelined: block j's weights are computed
 * while the queued P.V of block j-1 and Q.K^T of block j+1 run.
 * FL(key_blocks) -> flash16_key_blocks_amx, flash16_key_blocks_avx512_bf16 */

/* Do the causal / window limits hide some lane of keys [k0, k0 + n)? */
static inline int FL(cut)(const fa_flash16_rows *r, int64_t k0, int64_t n)
{
    return (r->has_hi && k0 + n - 1 > r->q0 + r->hi) ||
           (r->has_lo && k0 < r->q0 + FA_FLASH16_MQ - 1 + r->lo);
}

static void FL(key_blocks)(const fa_flash16_blocks *b)
{
    const int64_t KB = FL_KB, ST_BLOCK = FL_KB * FA_FLASH16_MQ, PT_BLOCK = FL_KB * FA_FLASH16_HALF;
    const fa_flash16_rows *rows = b->rows;
    int64_t k0 = b->k0, kprev = 0, nprev = 0;
    fa_flash16_queue w;
    memset(&w, 0, sizeof w);
    w.tf = b->tf;
    w.f16 = b->f16;
    FL(queue_qk)(&w, b->kp + (k0 - b->p0) * b->ep, b->ep, fa_min64(b->hi - k0, KB), b->qt,
                 b->st);
    FL(drain)(&w);
    int cur = 0; /* the S^T and P^T buffers of block j; j-1's and j+1's: cur ^ 1 */
    for (; k0 < b->kend; kprev = k0, k0 += KB, cur ^= 1) {
        const int64_t n = fa_min64(b->hi - k0, KB), k1 = k0 + KB;
        float *st = b->st + cur * ST_BLOCK;
        w.ip = w.iq = w.npv = w.nqk = 0;
        if (nprev)
            FL(queue_pv)(&w, b->vt + (kprev - b->p0), b->vt_rs, b->evp, nprev,
                         b->pt + (cur ^ 1) * PT_BLOCK, b->ot);
        if (rows->pad || FL(cut)(rows, k0, n)) FL(mask)(rows, k0, n, st);
        if (FL(newmax)(st, n, b->c, b->m, b->l, b->alpha)) {
            FL(drain)(&w); /* O^T complete up to block j-1 before it is scaled */
            FL(rescale)(b->ot, b->evp, b->alpha);
        }
        if (k1 < b->kend)
            FL(queue_qk)(&w, b->kp + (k1 - b->p0) * b->ep, b->ep, fa_min64(b->hi - k1, KB),
                         b->qt, b->st + (cur ^ 1) * ST_BLOCK);
        FL(weights)(st, n, b->c, b->m, b->l, b->pt + cur * PT_BLOCK, &w);
        nprev = n;
    }
    w.ip = w.iq = w.npv = w.nqk = 0;
    FL(queue_pv)(&w, b->vt + (kprev - b->p0), b->vt_rs, b->evp, nprev,
                 b->pt + (cur ^ 1) * PT_BLOCK, b->ot);
    FL(drain)(&w);
}
