/* flash16_softmax.h -- the 16-bit matrix path's softmax step over a key
 * block of S^T (masks, the lazily raised running max, the weights P^T with
 * the queued dot-product steps issued between them, the rescaling of O^T)
 * and writing out O / l; contract: kernels/flash16.h.  Over the 16-lane
 * vocabulary m16_* / m16f_* (simd/flash16_ops.h, simd/flash16_neon.h); included by
 * kernels_isa.c after flash16_steps.h where the mapping defines
 * FA_SIMD_BF16.  FL(name) -> flash16_<name>_<isa> (flash16_weights_amx, ...). */

#define MQ FA_FLASH16_MQ
#define HALF FA_FLASH16_HALF

/* Hide the scores of S^T rows r < n (keys k0 + r) that the causal mask, the
 * window or the key padding hides from query lanes q0 + 16h + lane. */
static void FL(mask)(const fa_flash16_rows *rows, int64_t k0, int64_t n, float *st)
{
    const m16_vf ninf = m16f_set1(-INFINITY);
    for (int64_t r = 0; r < n; r++) {
        const int64_t j = k0 + r;
        for (int h = 0; h < 2; h++) {
            float *s = st + r * MQ + HALF * h;
            if (rows->pad && rows->pad[j * rows->pad_cs]) { m16f_store(s, ninf); continue; }
            /* visible lanes: i + lo <= j <= i + hi, i = q0 + 16h + lane: in
             * lane units  j - hi - base <= lane <= j - lo - base */
            const int64_t base = rows->q0 + HALF * h;
            int64_t lmin = -1, lmax = HALF;
            if (rows->has_hi) lmin = j - rows->hi - base;
            if (rows->has_lo) lmax = j - rows->lo - base;
            if (lmin <= 0 && lmax >= HALF - 1) continue;
            lmin = lmin < -1 ? -1 : (lmin > HALF ? HALF : lmin);
            lmax = lmax < -1 ? -1 : (lmax > HALF ? HALF : lmax);
            m16f_store(s, m16_keep_lanes(m16f_load(s), lmin, lmax));
        }
    }
}

/* The running maximum of the online softmax, lazily: the weights of a block
 * are 2^(c s - m) with m the maximum used so far, which is raised only when
 * some lane's block maximum exceeds it by more than FA_FLASH16_LAZY (then m
 * = max(m, block max) in every lane, l is scaled by alpha = 2^(m_old -
 * m_new), and 1 is returned so that the caller scales O^T); otherwise the
 * weights stay below 2^FA_FLASH16_LAZY and 0 is returned.  out = O / l and
 * lse use the same m, so the result is the softmax's whichever m was used;
 * most blocks after the first few skip the pass over O^T. */
static int FL(newmax)(const float *st, int64_t n, float c, float *m, float *l, float *alpha)
{
    const m16_vf vc = m16f_set1(c), ninf = m16f_set1(-INFINITY);
    m16_vf mb[2];
    unsigned up = 0;
    for (int h = 0; h < 2; h++) {
        const float *s = st + HALF * h;
        m16_vf mx0 = ninf, mx1 = ninf;
        int64_t r = 0;
        for (; r + 2 <= n; r += 2) { /* NaN: ignored */
            mx0 = m16f_max_acc(mx0, m16f_load(s + r * MQ));
            mx1 = m16f_max_acc(mx1, m16f_load(s + (r + 1) * MQ));
        }
        if (r < n) mx0 = m16f_max_acc(mx0, m16f_load(s + r * MQ));
        mb[h] = m16f_mul(m16f_max(mx0, mx1), vc);
        up |= m16_above(mb[h], m16f_add(m16f_load(m + HALF * h), m16f_set1(FA_FLASH16_LAZY)));
    }
    if (!up) return 0;
    for (int h = 0; h < 2; h++) {
        const m16_vf mold = m16f_load(m + HALF * h);
        const m16_vf mnew = m16f_max(mb[h], mold);
        const m16_vf al = m16_alpha(mold, mnew); /* 1 where nothing is visible yet */
        m16f_store(l + HALF * h, m16f_mul(m16f_load(l + HALF * h), al));
        m16f_store(m + HALF * h, mnew);
        m16f_store(alpha + HALF * h, al);
    }
    return 1;
}

/* the weights of S^T rows 0..n-1 (kernels/flash16.h) */
static void FL(weights)(const float *st, int64_t n, float c, const float *m, float *l,
                        uint32_t *pt, fa_flash16_queue *w)
{
    const int64_t npair = fa_div_up(n, FA_FLASH16_KGRID) * (FA_FLASH16_KGRID / 2);
    /* the queued steps spread evenly over the 2 x npair iterations
     * (Bresenham: one each time acc passes the iteration count) */
    const int64_t nit = 2 * npair, nst = w->npv - w->ip + w->nqk - w->iq;
    int64_t acc = 0;
    const m16_vf vc = m16f_set1(c), zero = m16f_zero();
    const int f16 = w->f16;
    for (int h = 0; h < 2; h++) {
        const float *s = st + HALF * h;
        const m16_vf msafe = m16_zero_ninf(m16f_load(m + HALF * h));
        m16_vf sum0 = zero, sum1 = zero;
        uint32_t *p = pt + h * (FL_KB / 2) * HALF;
        int64_t k = 0;
        for (; 2 * k + 1 < n; k++) {
            if ((acc += nst) >= nit) { acc -= nit; FL(step)(w); }
            const m16_vf p0 = m16_exp2w(m16_mulsub(m16f_load(s + 2 * k * MQ), vc, msafe));
            const m16_vf p1 = m16_exp2w(m16_mulsub(m16f_load(s + (2 * k + 1) * MQ), vc, msafe));
            sum0 = m16f_add(sum0, p0);
            sum1 = m16f_add(sum1, p1);
            m16_store(p + k * HALF, m16_pairs(f16, p1, p0));
        }
        for (; k < npair; k++) { /* the last odd row, then zeros up to the grid */
            if ((acc += nst) >= nit) { acc -= nit; FL(step)(w); }
            m16_vf p0 = zero;
            if (2 * k < n) p0 = m16_exp2w(m16_mulsub(m16f_load(s + 2 * k * MQ), vc, msafe));
            sum0 = m16f_add(sum0, p0);
            m16_store(p + k * HALF, m16_pairs(f16, zero, p0));
        }
        m16f_store(l + HALF * h, m16f_add(m16f_load(l + HALF * h), m16f_add(sum0, sum1)));
        m16_dot_rows(pt + h * (FL_KB / 2) * HALF, npair); /* the dot product's layout */
    }
    FL(drain)(w);
}

/* O^T rows scaled by alpha (per query lane) */
static void FL(rescale)(float *ot, int64_t evp, const float *alpha)
{
    const m16_vf a0 = m16f_load(alpha), a1 = m16f_load(alpha + HALF);
    for (int64_t e = 0; e < evp; e++) {
        float *o = ot + e * MQ;
        m16f_store(o, m16f_mul(m16f_load(o), a0));
        m16f_store(o + HALF, m16f_mul(m16f_load(o + HALF), a1));
    }
}

/* out rows = O / l (kernels/flash16.h): per 16 x 16 block, O^T rows (lanes
 * = queries) scaled, transposed to query rows, rounded to 16 bits */
static void FL(finish)(const float *ot, const float *l, int64_t nq, int64_t Ev, int f16,
                       uint16_t *out, int64_t rs, int64_t cs, uint16_t *tmp)
{
    const m16_vf inv[2] = {m16_recip_or_zero(m16f_load(l)), m16_recip_or_zero(m16f_load(l + HALF))};
    for (int h = 0; h < 2 && HALF * h < nq; h++)
        for (int64_t e0 = 0; e0 < Ev; e0 += HALF) {
            m16_vi r[HALF];
            for (int e = 0; e < HALF; e++)
                r[e] = m16_as_vi(m16f_mul(m16f_load(ot + (e0 + e) * MQ + HALF * h), inv[h]));
            m16_transpose(r);
            const int64_t ne = Ev - e0 < HALF ? Ev - e0 : HALF;
            for (int n = 0; n < HALF && HALF * h + n < nq; n++)
                m16_store_halves(out + (HALF * h + n) * rs + e0 * cs, cs, ne,
                                 m16_cvt2(f16, m16f_zero(), m16_as_vf(r[n])), tmp);
        }
}

#undef MQ
#undef HALF
