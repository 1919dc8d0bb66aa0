/* backward.c -- fa_attention_backward: the backward pass of fa_attention
 * (backward_tmpl.h, once per element type), its arguments checked here.
 * The arithmetic goes through the micro-kernel table of the ISA in use, and
 * the scores are rebuilt by the forward's own packing, soft cap, ALiBi and
 * mask code (tiles_tmpl.h, scoreopts_tmpl.h).  16-bit storage runs bw16.c's
 * pass on the matrix instructions where the table has its kernels
 * (bfloat16 on amx and avx512_bf16, float16 on amx with AMX-FP16); on the
 * other tiers, and for float16 without AMX-FP16, the float kernels run with
 * the 16-bit operands widened as they are packed. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/bw16.h"
#include "driver/bw_scheme.h"
#include "driver/offsets.h"
#include "driver/window.h"
#include "fastattn.h"
#include "kernels/blocking.h"
#include "kernels/kernels.h"
#include "runtime/alloc.h"
#include "runtime/half.h"
#include "runtime/parallel.h"
#include "runtime/util.h"

#if FA_BW_MQ > FA_KC
#error "FA_BW_MQ must not exceed FA_KC (a query block is packed as FA_KC-row value panels)"
#endif

#define FA_SFX f32
#include "driver/backward_tmpl.h" /* backward_f32 */
#undef FA_SFX
#define FA_SFX f64
#include "driver/backward_tmpl.h" /* backward_f64 */
#undef FA_SFX

int fa_attention_backward(const fa_backward_args *g)
{
    const fa_attention_args *a = &g->fwd;
    if (a->nbatch_dims < 0 || a->nbatch_dims > FA_MAX_BATCH_DIMS || a->L < 0 || a->S < 0 ||
        a->E < 0 || a->Ev < 0 || a->win_left < 0 || a->win_right < 0 ||
        !(a->softcap <= 0 || isfinite(a->softcap)) || !isfinite(a->scale))
        return FA_EINVAL;
    const int half = a->storage == FA_FLOAT16 || a->storage == FA_BFLOAT16;
    if ((a->storage != a->dtype && !(a->dtype == FA_FLOAT32 && half)) ||
        a->kv_storage != a->storage)
        return FA_EINVAL;
    if (!a->lse.data || !a->out.data || !g->dout.data || !g->dq.data || !g->dk.data ||
        !g->dv.data || (a->sinks.data && !g->dsinks.data))
        return FA_EINVAL;
    if (a->L > 0 && a->S > 0 && (fa_bw_group(g) < 1 || !fa_bw_dmask_ok(g)))
        return FA_EINVAL; /* empty: no strides */
    const int matrix16 = half && fa_backward16_runs(a);
    if (g->grad_storage != a->dtype && !(matrix16 && g->grad_storage == a->storage))
        return FA_EINVAL;
    if (a->dtype == FA_FLOAT32 && matrix16) return fa_backward16(g);
    if (a->dtype == FA_FLOAT32) return backward_f32(g);
    if (a->dtype == FA_FLOAT64) return backward_f64(g);
    return FA_EINVAL;
}

int fa_round_half(int storage, int64_t n, const float *x, uint16_t *y)
{
    if (n < 0 || (storage != FA_FLOAT16 && storage != FA_BFLOAT16)) return FA_EINVAL;
    if (n > 0) fa_kernels_f32_current()->narrow_h[storage - FA_FLOAT16](x, 1.0f, y, n);
    return FA_OK;
}
