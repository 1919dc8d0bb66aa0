/* flash16.h -- the 16-bit matrix driver (flash16.c): attention with q, k, v
 * and out in bfloat16 (storage FA_BFLOAT16, arithmetic float32; lse, if
 * any, float32) on the ISAs whose f32 table has the 16-bit matrix kernels
 * (kernels/flash16.h: amx, avx512_bf16, neon_bf16), and in float16 (FA_FLOAT16) on amx
 * where fa_amx_fp16() (the CPU has AMX-FP16, or the emulation build).
 *
 * It takes at least FA_FLASH16_MIN_ROWS query rows, no weights, no boolean
 * or additive mask, no softcap, ALiBi or sinks, 1 <= E, Ev <=
 * FA_FLASH16_MAX_E, S >= 1 and scale > 0; causal (any offset), window, key
 * padding and any batch strides (grouped-query views) it runs.  Anything
 * else returns FA_FLASH16_DECLINED having written nothing, and the caller
 * takes its float32-arithmetic path.  Semantics: Q.K^T from the 16-bit
 * inputs with float32 accumulation, the online softmax in float32, P
 * rounded to the 16-bit type for P.V with float32 accumulation, out = O / l
 * rounded to the 16-bit type (l: the float32 sum of the unrounded P); a NaN
 * or Inf value a row sees reaches its output as IEEE's sum would.  Bitwise
 * the same for any thread count; the extra memory is the threads' scratch,
 * bounded by the block sizes of blocking.h (never proportional to S x E). */
#ifndef FASTATTN_FLASH16_DRIVER_H
#define FASTATTN_FLASH16_DRIVER_H

#include "fastattn.h"

#define FA_FLASH16_DECLINED (-1)
int fa_flash16(const fa_attention_args *a);

/* The same on the calling thread (a->num_threads unused), in the caller's
 * scratch: fa_flash16_one_bytes(a) bytes at mem, 64-byte aligned, for a
 * driver that runs many such problems in its own parallel region and
 * allocates before it writes anything (driver/paged.c's prefill chunks).
 * Any number of rows (the caller keeps FA_FLASH16_MIN_ROWS for the problem
 * the rows belong to); otherwise the bytes are 0 where fa_flash16 would
 * decline a, and fa_flash16_one then returns FA_FLASH16_DECLINED having
 * written nothing, else FA_OK (it allocates nothing).  The same bits as
 * fa_flash16 on any thread count. */
int64_t fa_flash16_one_bytes(const fa_attention_args *a);
int fa_flash16_one(const fa_attention_args *a, void *mem);

#endif
