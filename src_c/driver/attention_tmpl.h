/* attention_tmpl.h -- the attention drivers, written once over the element
 * type: included twice by attention.c with FA_SFX (f32, f64) defined.  Every
 * function is named FN(name) -> name_<FA_SFX>, e.g. FN(stream_rows) ->
 * stream_rows_f32, stream_rows_f64 (the part files list theirs). */
#define FN(name) FA_CAT(name, FA_SFX)
#define FA_T FA_TYPE(FA_SFX)                      /* float, double */
#define KT FA_CAT(fa_kernels, FA_SFX)             /* fa_kernels_f32, _f64 */
#define KCUR FA_CAT3(fa_kernels, FA_SFX, current) /* fa_kernels_f32_current */

#include "driver/storage_tmpl.h" /* one element of a 16-bit operand */
#include "driver/scratch_tmpl.h" /* one thread's arrays, carved by scratch.h */
#include "driver/tiles_tmpl.h"   /* packing, masks, block skipping */
#include "driver/scoreopts_tmpl.h" /* softcap, ALiBi; the sink and lse of a row */
#include "driver/merge_tmpl.h"   /* writing out; the key-split merge */
#include "driver/band_tmpl.h"    /* one band x key block (and the direct path) */
#include "driver/stream_tmpl.h"  /* the streaming loop */
#include "driver/weights_tmpl.h" /* the weights path */
#include "driver/plan_tmpl.h"    /* the plan, the threads, the entry point */

#undef FN
#undef FA_T
#undef KT
#undef KCUR
