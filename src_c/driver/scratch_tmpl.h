/* scratch_tmpl.h -- one thread's scratch arrays, carved out of its buffer
 * by the layout of scratch.h.  Part of attention_tmpl.h (FA_SFX; FA_T):
 * FN(fa_scratch) -> fa_scratch_f32, fa_scratch_f64. */

typedef struct FN(fa_scratch) {
    FA_T *qp, *kp, *vp, *st, *o, *m, *l, *lv, *vmax, *w;
} FN(fa_scratch);

static FN(fa_scratch) FN(scratch_carve)(FA_T *base, const fa_scratch_layout *lay)
{
    FN(fa_scratch) sc;
    sc.qp = base + lay->qp;
    sc.kp = base + lay->kp;
    sc.vp = base + lay->vp;
    sc.st = base + lay->st;
    sc.o = base + lay->o;
    sc.m = base + lay->m;
    sc.l = base + lay->l;
    sc.lv = base + lay->lv;
    sc.vmax = base + lay->vmax;
    sc.w = base + lay->w;
    return sc;
}
