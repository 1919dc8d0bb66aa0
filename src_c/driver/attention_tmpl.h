/* attention_tmpl.h -- the attention drivers, written once over the element
 * type: included twice by attention.c with FA_T (float/double), FA_SFX
 * (f32/f64), FA_T_MAX, FA_UINT and FA_EXP_MASK (the type's largest value,
 * same-size unsigned integer and exponent bits), KT (the kernel table type)
 * and KCUR() (the table in use) defined.  Every function is named
 * FN(name) -> name_<FA_SFX>, e.g. FN(stream_rows) -> stream_rows_f32,
 * stream_rows_f64 (the part files list theirs). */
#define FN(name) FA_CAT(name, FA_SFX)

#include "driver/scratch_tmpl.h" /* one thread's arrays, carved by scratch.h */
#include "driver/tiles_tmpl.h"   /* packing, masks, block skipping */
#include "driver/merge_tmpl.h"   /* writing out; the key-split merge */
#include "driver/band_tmpl.h"    /* one band x key block (and the direct path) */
#include "driver/stream_tmpl.h"  /* the streaming loop */
#include "driver/weights_tmpl.h" /* the weights path */
#include "driver/plan_tmpl.h"    /* the plan, the threads, the entry point */

#undef FN
