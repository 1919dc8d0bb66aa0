/* storage_tmpl.h -- one element of an operand of the storage type st
 * (fastattn.h: FA_FLOAT32, FA_FLOAT64, or float16 / bfloat16, read in
 * float32), read or written one at a time: the element-by-element paths
 * (strided operands, masks, the output rows).  Included by
 * attention_tmpl.h and softmax_tmpl.h (FA_SFX; FA_T, FN): FN(ld) -> ld_f32,
 * ld_f64; FN(st) -> st_f32, st_f64. */
/* Element i of an operand of the call's storage type st (fastattn.h):
 * FA_T, or (float only) float16 / bfloat16 widened; and element i written,
 * rounded once to nearest even. */
static FA_ALWAYS_INLINE FA_T FN(ld)(const void *base, int64_t i, int st)
{
    if (st == FA_FLOAT16) return (FA_T)fa_f16_to_f32(((const uint16_t *)base)[i]);
    if (st == FA_BFLOAT16) return (FA_T)fa_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const FA_T *)base)[i];
}

static FA_ALWAYS_INLINE void FN(st)(void *base, int64_t i, int st, FA_T x)
{
    if (st == FA_FLOAT16)
        ((uint16_t *)base)[i] = fa_f32_to_f16((float)x);
    else if (st == FA_BFLOAT16)
        ((uint16_t *)base)[i] = fa_f32_to_bf16((float)x);
    else
        ((FA_T *)base)[i] = x;
}
