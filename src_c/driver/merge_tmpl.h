/* merge_tmpl.h -- writing the output rows, and the key-split merge: when a
 * decoding step splits the keys into chunks (plan_tmpl.h), each chunk leaves
 * its rows' partial state {m, l, o[ldv]} in a buffer, and the rows are
 * merged in a fixed order (bitwise the same for any thread count).  Part of
 * attention_tmpl.h (FA_SFX; FA_T): FN(write_out) -> write_out_f32,
 * write_out_f64; likewise expb, store_partials, merge_row, merge_batch. */

/* e^x, or 2^x with base2 (scalar: the key-split merge factors). */
static FA_T FN(expb)(double x, int base2) { return (FA_T)(base2 ? exp2(x) : exp(x)); }

/* out[b, r0 .. r1, :] = o / l (0 for rows with no visible key); with a
 * sink or lse and m (the rows' maxima, base2: log2 units), the rows are
 * finalised by row_finish (m NULL: the weights path, already final). */
static void FN(write_out)(const fa_attention_args *a, const fa_offsets *off, int64_t r0,
                          int64_t r1, int64_t ldv, const FA_T *o, const FA_T *l, const FA_T *m,
                          int base2)
{
    const int half = FN(is_half)(a);
    const int finish = m && (a->sinks.data || a->lse.data);
    for (int64_t i = r0; i < r1; i++) {
        const FA_T li = l[i - r0];
        const FA_T inv = finish ? FN(row_finish)(a, off, i, m[i - r0], li, base2)
                                : li == 0 ? (FA_T)0 : (FA_T)1 / li;
        const FA_T *src = o + (i - r0) * ldv;
        const int64_t d0 = off->o + i * a->out.rs;
        if (half) { /* rounded once, here */
#if !FA_IS_F64(FA_SFX)
            if (a->out.cs == 1 || a->Ev <= 1) {
                KCUR()->narrow_h[a->storage - FA_FLOAT16](src, inv, (uint16_t *)a->out.data + d0, a->Ev);
                continue;
            }
#endif
            for (int64_t c = 0; c < a->Ev; c++)
                FN(st)((void *)a->out.data, d0 + c * a->out.cs, a->storage, src[c] * inv);
            continue;
        }
        FA_T *dst = (FA_T *)a->out.data + d0;
        for (int64_t c = 0; c < a->Ev; c++) dst[c * a->out.cs] = src[c] * inv;
    }
}

/* The partials of batch b, rows [r0, r1), key chunk s of nsplit, from the
 * state m, l, o (ldv) the streaming loop left: part[((b L + i) nsplit + s)
 * (ldv + 2)] = {m, l, o[0 .. ldv)}. */
static void FN(store_partials)(FA_T *part, int64_t L, int64_t nsplit, int64_t ldv, int64_t b,
                               int64_t s, int64_t r0, int64_t r1, const FA_T *m, const FA_T *l,
                               const FA_T *o)
{
    for (int64_t i = r0; i < r1; i++) {
        FA_T *p = part + ((b * L + i) * nsplit + s) * (ldv + 2);
        p[0] = m[i - r0];
        p[1] = l[i - r0];
        memcpy(p + 2, o + (i - r0) * ldv, (size_t)ldv * sizeof(FA_T));
    }
}

/* Merge the key-split partials of one row: part[s] = {m, l, o[ldv]}; the
 * merged o, l are relative to the maximum *m of the parts' m. */
static void FN(merge_row)(const FA_T *part, int64_t nsplit, int64_t ldv, int base2, FA_T *o,
                          FA_T *l, FA_T *m)
{
    const int64_t stride = ldv + 2;
    FA_T M = (FA_T)-INFINITY;
    for (int64_t s = 0; s < nsplit; s++)
        if (part[s * stride] > M) M = part[s * stride];
    FA_T lsum = 0;
    for (int64_t c = 0; c < ldv; c++) o[c] = 0;
    for (int64_t s = 0; s < nsplit; s++) {
        const FA_T *p = part + s * stride;
        FA_T ls = p[1];
        if (ls != ls) { lsum = (FA_T)NAN; continue; }
        if (p[0] == (FA_T)-INFINITY) continue; /* this chunk saw no visible key */
        FA_T f = FN(expb)((double)(p[0] - M), base2);
        lsum += ls * f;
        for (int64_t c = 0; c < ldv; c++) o[c] += p[2 + c] * f;
    }
    *l = lsum;
    *m = M;
}

/* Merge the partials of every row of batch b and write them out (the sink
 * and lse applied once, after the merge); o (ldv), l and m (1): scratch. */
static void FN(merge_batch)(const fa_attention_args *a, const FA_T *part, int64_t nsplit,
                            int64_t ldv, int base2, int64_t b, FA_T *o, FA_T *l, FA_T *m)
{
    const int64_t L = a->L;
    fa_offsets off;
    fa_batch_offsets(a, b, &off);
    for (int64_t i = 0; i < L; i++) {
        FN(merge_row)(part + (b * L + i) * nsplit * (ldv + 2), nsplit, ldv, base2, o, l, m);
        FN(write_out)(a, &off, i, i + 1, ldv, o, l, m, base2);
    }
}
