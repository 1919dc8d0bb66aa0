/* flash16_pack.h -- the 16-bit matrix path's packing (layouts and
 * contract: kernels/flash16.h): a key panel's K rows and V^T, a query
 * block's Q^T, over simd/flash16_ops.h (flash16_neon.h), each then put in
 * the dot product's own layout (m16_dot_pairs, m16_dot_rows: in place; on
 * neon_bf16 BFMMLA's, elsewhere as packed).  Included by kernels_isa.c where
 * the mapping defines FA_SIMD_BF16; FL(name) -> flash16_<name>_<isa>
 * (flash16_pack_kv_amx, flash16_pack_qt_avx512_bf16, ...). */

/* K rows, zero-padded to ep halves, zero rows up to npk.  q and k need no
 * check for NaN or Inf: a NaN or +inf score makes its row NaN as in the
 * reference, a -inf one is hidden, and hidden scores are replaced by -inf. */
static void FL(pack_k)(const fa_flash16_pack *p)
{
    for (int64_t j = 0; j < p->nk; j++) {
        uint16_t *d = p->kp + j * p->ep;
        const uint16_t *r = p->k + j * p->krs;
        if (p->kcs == 1)
            memcpy(d, r, (size_t)p->E * 2);
        else
            for (int64_t e = 0; e < p->E; e++) d[e] = r[e * p->kcs];
        memset(d + p->E, 0, (size_t)(p->ep - p->E) * 2);
    }
    memset(p->kp + p->nk * p->ep, 0, (size_t)((p->npk - p->nk) * p->ep) * 2);
    m16_dot_pairs(p->kp, p->ep, p->npk, p->ep);
}

/* The pair row of keys j, j + 1 (< jend) and columns e0 .. e0+ne-1 as
 * dwords (key j in the low halves), NaN and Inf cleared and flagged. */
static m16_vi FL(pack_pair)(const fa_flash16_pack *p, int64_t j, int64_t jend, int64_t e0,
                            int64_t ne, unsigned *nonfinite)
{
    m16_vi w[2];
    for (int u = 0; u < 2; u++) {
        if (j + u >= jend) { w[u] = m16_zero(); continue; }
        const uint16_t *row = p->v + (j + u) * p->vrs + e0 * p->vcs;
        if (p->vcs == 1) {
            w[u] = m16_widen(row, ne, u);
        } else {
            uint16_t tmp[M16_W] = {0};
            for (int64_t e = 0; e < ne; e++) tmp[e] = row[e * p->vcs];
            w[u] = m16_widen(tmp, M16_W, u);
        }
    }
    m16_vi r = m16_or(w[0], w[1]);
    const unsigned bad = m16_clear_nonfinite(&r, p->exp_bits);
    if (bad) {
        if (bad & 1) p->flags[j] = 1;
        if (bad & 2) p->flags[j + 1] = 1;
        *nonfinite = 1;
    }
    return r;
}

/* Ask for the cache line at column e0 of the value rows of the block at j0
 * (< nk): the block reads FA_FLASH16_KGRID rows a line at a time across
 * the rows, a stride no hardware prefetcher follows far. */
static void FL(prefetch_rows)(const fa_flash16_pack *p, int64_t j0, int64_t e0)
{
    const int64_t jend = p->nk - j0 < FA_FLASH16_KGRID ? p->nk : j0 + FA_FLASH16_KGRID;
    for (int64_t j = j0; j < jend; j++) FA_PREFETCH(p->v + j * p->vrs + e0);
}

/* V^T in blocks of FA_FLASH16_KGRID keys x M16_W columns: key pairs
 * interleaved into dwords, then transposed: row e of V^T, the block's keys;
 * contiguous rows: the next block's rows asked for a line ahead of use */
static unsigned FL(pack_vt)(const fa_flash16_pack *p)
{
    unsigned nonfinite = 0;
    const int64_t line = 64 / 2; /* halves per cache line */
    for (int64_t j0 = 0; j0 < p->npk; j0 += FA_FLASH16_KGRID) {
        const int64_t jend = p->nk - j0 < FA_FLASH16_KGRID ? p->nk : j0 + FA_FLASH16_KGRID;
        for (int64_t e0 = 0; e0 < p->Ev; e0 += M16_W) {
            const int64_t ne = p->Ev - e0 < M16_W ? p->Ev - e0 : M16_W;
            if (p->vcs == 1 && e0 % line == 0 && j0 + FA_FLASH16_KGRID < p->nk)
                FL(prefetch_rows)(p, j0 + FA_FLASH16_KGRID, e0);
            m16_vi r[M16_W];
            for (int64_t kq = 0; kq < M16_W; kq++)
                r[kq] = FL(pack_pair)(p, j0 + 2 * kq, jend, e0, ne, &nonfinite);
            m16_transpose(r);
            for (int64_t e = 0; e < ne; e++) m16_store(p->vt + (e0 + e) * p->vt_rs + j0, r[e]);
        }
    }
    for (int64_t e = p->Ev; e < p->evp; e++) memset(p->vt + e * p->vt_rs, 0, (size_t)p->npk * 2);
    m16_dot_pairs(p->vt, p->vt_rs, p->evp, p->npk);
    return nonfinite;
}

static unsigned FL(pack_kv)(const fa_flash16_pack *p)
{
    FL(pack_k)(p);
    return FL(pack_vt)(p);
}

/* Q^T of rows 0 .. nq-1 as B tiles (kernels/flash16.h): the rows' dwords
 * transposed 16 x 16 */
static void FL(pack_qt)(const uint16_t *q, int64_t rs, int64_t cs, int64_t E, int64_t nq,
                        int64_t e_tiles, uint16_t *qt)
{
    for (int64_t kk = 0; kk < e_tiles; kk++)
        for (int h = 0; h < 2; h++) {
            m16_vi r[M16_W];
            const int64_t ne = E - FA_FLASH16_EPAIR * kk < FA_FLASH16_EPAIR
                                   ? E - FA_FLASH16_EPAIR * kk : FA_FLASH16_EPAIR;
            for (int n = 0; n < M16_W; n++) {
                const int64_t i = M16_W * h + n;
                if (i >= nq) { r[n] = m16_zero(); continue; }
                const uint16_t *row = q + i * rs + FA_FLASH16_EPAIR * kk * cs;
                uint16_t tmp[FA_FLASH16_EPAIR] = {0};
                if (cs == 1 && ne == FA_FLASH16_EPAIR) {
                    r[n] = m16_load(row);
                    continue;
                }
                for (int64_t e = 0; e < ne; e++) tmp[e] = row[e * cs];
                r[n] = m16_load(tmp);
            }
            m16_transpose(r);
            for (int rr = 0; rr < M16_W; rr++)
                m16_store(qt + (kk * 2 + h) * FA_FLASH16_TILE + rr * FA_FLASH16_EPAIR, r[rr]);
        }
    m16_dot_rows((uint32_t *)qt, e_tiles * 2 * M16_W);
}
