/* fastattn.h -- the C API that fastattn/_core.pyx calls.  Plain C99: no
 * Python headers.  Every size, stride and index is 64-bit; strides are in
 * elements and may be zero (broadcast) or negative.  Every entry point
 * returns a status code and, on failure, writes nothing to its outputs. */
#ifndef FASTATTN_H
#define FASTATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FA_OK = 0, FA_ENOMEM = 1, FA_EINVAL = 2 };
/* Element types.  FA_FLOAT16 (IEEE binary16) and FA_BFLOAT16 (the upper half
 * of a float32) are storage types only: the arithmetic is float32. */
enum { FA_FLOAT32 = 0, FA_FLOAT64 = 1, FA_FLOAT16 = 2, FA_BFLOAT16 = 3 };
/* FA_ISA_GENERIC = 0, FA_ISA_AVX2, FA_ISA_AVX512, ..., FA_ISA_COUNT: one per
 * line of runtime/isa_list.h, in its order (lowest path first). */
#define FA_ISA(name, NAME, arch, required) FA_ISA_##NAME,
enum {
#include "runtime/isa_list.h"
    FA_ISA_COUNT
};
#undef FA_ISA
#define FA_MAX_BATCH_DIMS 32
/* A window side that bounds nothing (fa_attention_args.win_left/right). */
#define FA_UNBOUNDED INT64_MAX

/* One operand: base pointer, strides of the broadcast batch dimensions, and
 * the strides of its last two dimensions (rows, columns). */
typedef struct fa_operand {
    const void *data;
    int64_t bstride[FA_MAX_BATCH_DIMS];
    int64_t rs, cs;
} fa_operand;

/* out[b, i, :] = sum_j softmax_j(scale q[b,i,:].k[b,j,:] + mask) v[b, j, :]
 *   q (batch..., L, E), k (batch..., S, E), v (batch..., S, Ev),
 *   out (batch..., L, Ev); weights NULL or contiguous (batch..., L, S). */
typedef struct fa_attention_args {
    int dtype;                 /* FA_FLOAT32 / FA_FLOAT64: the arithmetic type (and that
                                  of lse) */
    int storage;               /* the element type of q, k, v, out and add_mask: dtype,
                                  or (dtype FA_FLOAT32 only) FA_FLOAT16 / FA_BFLOAT16,
                                  read in float32 and the output rounded once to
                                  nearest even; weights then have this type too */
    int kv_storage;            /* the element type of k and v: storage, or FA_FLOAT16 /
                                  FA_BFLOAT16 with storage FA_FLOAT32 (float32 queries
                                  against 16-bit keys and values, e.g. a KV cache) */
    int nbatch_dims;           /* <= FA_MAX_BATCH_DIMS */
    int64_t batch_shape[FA_MAX_BATCH_DIMS];
    int64_t L, S, E, Ev;
    fa_operand q, k, v, out;
    double scale;
    /* Query i sits at key position p(i) = i + causal_offset (for the causal
     * mask and the window alike: 0, or S - L for lower-right alignment). */
    int causal;                /* key j hidden from query i iff j > p(i) */
    int64_t causal_offset;
    /* The sliding window: key j hidden from query i iff j < p(i) - win_left
     * or j > p(i) + win_right; each >= 0, FA_UNBOUNDED for no bound. */
    int64_t win_left, win_right;
    fa_operand bool_mask;      /* uint8, 1 = may attend; data NULL if none */
    fa_operand add_mask;       /* storage type, added to the scaled score; NULL if none */
    fa_operand pad;            /* uint8 (batch..., 1, S), 1 = padding; NULL if none */
    void *weights;             /* NULL: streaming path, no L x S buffer at all; else
                                  of the storage type */
    int num_threads;           /* <= 0: the OpenMP default */
    /* Score options (fastattn.reference's semantics).  The logit of query i
     * and key j, after the scale: s = softcap tanh(s / softcap) if softcap
     * > 0; then s -= slope |i + causal_offset - j| with slope the alibi
     * operand at the batch index; then the masks. */
    double softcap;            /* <= 0: none */
    fa_operand alibi;          /* float64 (batch..., 1, 1): slopes; data NULL if none */
    fa_operand sinks;          /* float64 (batch..., 1, 1): a logit joining every row's
                                  softmax denominator, no value (not +inf or NaN);
                                  data NULL if none */
    fa_operand lse;            /* dtype (batch..., L, 1), written: each row's natural-log
                                  log-sum-exp of its visible logits (the sink's exp
                                  included), -inf for a row with none; NULL if none */
} fa_attention_args;

int fa_attention(const fa_attention_args *args);

/* The backward pass of fa_attention: the gradients of q, k and v given the
 * gradient dout flowing into its output, recomputing the weights P from
 * the forward's lse (never an L x S buffer).  fwd describes the forward
 * call (q, k, v, the masks, the window, softcap, alibi and sinks; storage
 * == kv_storage; weights unused) and two of its results are read: fwd.out
 * (storage type) and fwd.lse (dtype, (batch..., L, 1)).  Per batch index b
 * of fwd.batch_shape, nothing summed over what the forward broadcast (the
 * caller does, in a fixed order) but for grouped query heads: where dk and
 * dv both have stride 0 along the last batch dimension, the (..., Hkv, g)
 * layout, each of their rows is summed over that dimension in order, from
 * float accumulators (one rounding, times scale once).  No other gradient
 * may have stride 0 along a batch dimension of length > 1 (FA_EINVAL).
 * With D_i = dout_i . out_i and g = glse:
 *   dq[b] = scale dS K,  dk[b] = scale dS^T Q,  dv[b] = P^T dout,
 *   dS = P o (dout V^T - D + g) (times 1 - tanh^2 through the soft cap),
 *   dsinks[b] = sum_i exp(t - lse_i) (g_i - D_i) over the rows with lse_i
 *   > -inf (t the sink),
 * P = exp(s - lse) at the visible positions and exactly 0 at the hidden ones
 * and on rows whose lse is -inf.  Bitwise the same for any thread count. */
typedef struct fa_backward_args {
    fa_attention_args fwd;
    fa_operand dout;           /* storage type, (batch..., L, Ev) */
    fa_operand glse;           /* dtype, (batch..., L, 1): the gradient into lse; NULL: 0 */
    fa_operand dq, dk, dv;     /* written: (batch..., L, E), (batch..., S, E),
                                  (batch..., S, Ev), of grad_storage: */
    int grad_storage;          /* fwd.dtype, or fwd.storage (16-bit) where
                                  fa_backward_rounds(fwd.storage): each gradient
                                  rounded once (nearest even) from its float32 sum */
    fa_operand dsinks;         /* float64 (batch..., 1, 1), written if fwd.sinks is given */
    fa_operand dmask;          /* dtype (batch..., L, S), NULL if not asked for: the
                                  gradient of the logits, dS before the soft cap's factor
                                  (that of fwd.add_mask per batch index), written at every
                                  position the pass computes; the others (hidden by the
                                  causal limit, the window or a key block of padding)
                                  are left as they were: the caller passes zeros.  No
                                  stride 0 along a batch dimension of length > 1 */
} fa_backward_args;
/* FA_OK, FA_ENOMEM, FA_EINVAL, or FA_ELSE: an lse of -inf on a row that
 * sees a key (checked before any output is written). */
enum { FA_ELSE = 3 };
int fa_attention_backward(const fa_backward_args *args);
/* 1 if fa_attention_backward takes grad_storage == fwd.storage for the
 * 16-bit storage (FA_FLOAT16, FA_BFLOAT16) on the ISA in use, else 0. */
int fa_backward_rounds(int storage);
/* y[i] = x[i] rounded to nearest even into storage (FA_FLOAT16 or
 * FA_BFLOAT16; overflow to +-inf, NaN stays NaN) for i < n, by the ISA in
 * use: the one rounding of a 16-bit gradient, after the broadcast sums. */
int fa_round_half(int storage, int64_t n, const float *x, uint16_t *y);

/* Packed sequences (flash-attn's varlen layout) in one call.  t describes
 * the packed arrays as one problem of L = cu_q[n] query rows and S =
 * cu_k[n] keys; sequence b < n is that problem restricted to the query rows
 * cu_q[b] .. cu_q[b+1] (of q, out, lse and, backward, dout, glse, dq) and the
 * keys cu_k[b] .. cu_k[b+1] (of k, v, dk, dv), with causal_offset S_b - L_b
 * where lower_right (else t's), and alibi, sinks, dsinks stepped by
 * alibi_ss, sinks_ss, dsinks_ss elements per sequence (0: shared).  No
 * bool_mask, add_mask, pad, weights or dmask.  Each sequence gives the bits the
 * call of its own problem would (the work is spread over sequences, and
 * each call's bits do not depend on its threads).  The forward runs every
 * sequence with a query row (no key: zero rows, lse -inf); the backward
 * skips a sequence with no query row or no key (its dq, dk, dv rows and
 * dsinks are left as they were: the caller passes zeros).  A backward's dk
 * and dv may be grouped (stride 0 along the last batch dimension) as
 * fa_attention_backward takes them. */
typedef struct fa_varlen_args {
    fa_backward_args t;        /* t.fwd alone for fa_attention_varlen */
    int64_t n;
    const int64_t *cu_q, *cu_k; /* (n + 1,), non-decreasing from 0 */
    int lower_right;
    int64_t alibi_ss, sinks_ss, dsinks_ss;
} fa_varlen_args;
/* FA_OK, FA_ENOMEM, FA_EINVAL; the backward's FA_ELSE as
 * fa_attention_backward's for some sequence (other sequences may have been
 * written: the caller's outputs are its own fresh arrays). */
int fa_attention_varlen(const fa_varlen_args *args);
int fa_attention_backward_varlen(const fa_varlen_args *args);

/* Row softmax: y[r, :] = softmax(x[r, :]) over n columns, for nrows rows, as
 * scipy.special.softmax; keep (uint8, may be NULL) hides entries (0 weight,
 * an all-hidden row becomes 0).  y may alias x exactly (in place).  dtype:
 * the element type of x and y; FA_FLOAT16 / FA_BFLOAT16 are computed in
 * float32 and rounded once. */
int fa_softmax_rows(int dtype, int64_t nrows, int64_t n, const void *x, int64_t x_rs,
                    int64_t x_cs, void *y, int64_t y_rs, int64_t y_cs, const uint8_t *keep,
                    int64_t k_rs, int64_t k_cs, int num_threads);

/* y[i] = exp(x[i]) (base2: 2^x[i]) for i < n, by the vectorised exp of the
 * ISA in use, as the kernels evaluate it: accurate on x <= 0 (the softmax
 * domain; see simd/vmath.h).  For the accuracy tests.  y may equal x. */
int fa_exp(int dtype, int base2, int64_t n, const void *x, void *y);
/* y[i] = tanh(x[i]) for i < n, by the vectorised tanh of the ISA in use (the
 * softcap kernel with a cap of 1), for its accuracy tests; y may equal x. */
int fa_tanh(int dtype, int64_t n, const void *x, void *y);

/* Test hook (testing/bf16_hooks.c): one instruction of the bfloat16 tiers on
 * small arrays.  native 0: its plain-C emulation (simd/bf16_emulate.h,
 * simd/bf16_emulate_arm.h);
 * 1: the instruction itself, FA_EINVAL where the CPU, the OS or the build
 * lacks it.  Operands (row-major, 64-byte rows):
 *   TDPBF16PS / TDPFP16PS  c (16 x 16 float32) += a (16 x 32 halves) . b
 *                          (16 x 32 halves, pairs per column); native
 *                          TDPFP16PS needs AMX-FP16; TDPBF16PS_BYTES is
 *                          TDPBF16PS issued by its bytes, as simd/bf16_tiles.h
 *                          issues TDPFP16PS (the tests pin the encoding);
 *   VDPBF16PS              c (16 float32) += a . b (32 bfloat16 each);
 *   VCVTNE2PS2BF16         c (32 bfloat16) = b (16 float32), then a (16);
 *   VCVTNEPS2BF16          c (16 bfloat16) = a (16 float32); b unused;
 *   BFDOT                  c (4 float32) += a . b per lane (8 bfloat16 each:
 *                          Arm BFDOT Vd.4S, Vn.8H, Vm.8H);
 *   BFMMLA                 c (2 x 2 float32) += a (2 x 4) . b^T (2 x 4). */
enum { FA_BF16_OP_TDPBF16PS = 0, FA_BF16_OP_TDPFP16PS = 1, FA_BF16_OP_VDPBF16PS = 2,
       FA_BF16_OP_VCVTNE2PS2BF16 = 3, FA_BF16_OP_VCVTNEPS2BF16 = 4,
       FA_BF16_OP_TDPBF16PS_BYTES = 5, /* TDPBF16PS by the bytes the float16 tiles use */
       FA_BF16_OP_BFDOT = 6, FA_BF16_OP_BFMMLA = 7 /* Arm: one 128-bit register each */ };
int fa_bf16_op(int op, int native, const void *a, const void *b, void *c);
/* Attention of float32 queries over an int8 KV cache (fastattn/kvcache.py),
 * read in place: key j of kv head h in batch b is k_scale[b,h,j] *
 * k[b,h,j,:] (int8 levels, one float32 scale per row), value j likewise;
 * the levels are converted and scaled in registers, never dequantised to
 * memory.  Query head hq uses kv head hq / (Hq / Hkv).  All arithmetic is
 * float32; work is split over (batch, kv head) only, so the result is
 * bitwise the same for any thread count.  Strides in elements; every
 * row's columns are contiguous. */
typedef struct fa_decode_q8_args {
    int64_t B, Hq, Hkv, L, S, E, Ev;    /* Hq a multiple of Hkv; E, Ev >= 1 */
    const float *q;                     /* (B, Hq, L, E) */
    int64_t q_bs, q_hs, q_rs;
    const int8_t *k, *v;                /* (B, Hkv, S, E), (B, Hkv, S, Ev) */
    int64_t k_bs, k_hs, k_rs, v_bs, v_hs, v_rs;
    const float *k_scale, *v_scale;     /* (B, Hkv, S), unit stride along S */
    int64_t ks_bs, ks_hs, vs_bs, vs_hs;
    float *out;                         /* (B, Hq, L, Ev), written */
    int64_t o_bs, o_hs, o_rs;
    double scale;
    /* fa_attention_args' meaning: causal, causal_offset, win_left/right */
    int causal;
    int64_t causal_offset, win_left, win_right;
    const uint8_t *pad;                 /* NULL or (B, S) contiguous, 1 = padding */
    double softcap;                     /* <= 0: none */
    const double *alibi, *sinks;        /* NULL or (B, Hq) contiguous */
    float *lse;                         /* NULL or (B, Hq, L) contiguous, written */
    int num_threads;                    /* <= 0: the OpenMP default */
} fa_decode_q8_args;
int fa_decode_q8(const fa_decode_q8_args *args);
/* Symmetric int8 rows: for each row r < rows of n floats at x + r*x_rs,
 * scale[r] = max|x| / 127 (float32; nudged up by ulps if the quotient's
 * rounding would put a level past 127), y[r*y_rs + c] = x / scale rounded to
 * nearest even; a row of zeros gives zeros and scale 0.  FA_EINVAL, nothing
 * written, if any x is NaN or +-inf. */
int fa_quantize_q8(int64_t rows, int64_t n, const float *x, int64_t x_rs, int8_t *y,
                   int64_t y_rs, float *scale);

/* Attention over paged KV caches (driver/paged.c).  The caches are pools
 * of num_blocks blocks of block_size positions; sequence b's key at
 * position p is in block block_table[b, p / block_size] at offset
 * p % block_size, kv head g, element c at k + blk k_bs + off k_ps + g k_hs
 * + c k_cs (any strides, so both the (blocks, positions, heads, E) and the
 * (blocks, heads, positions, E) layouts); values likewise.  Sequence b has
 * seq_lens[b] keys and the queries cu_q[b] .. cu_q[b+1] of q (total_q, Hq,
 * E), its last positions: query i of nq sits at position seq_lens[b] - nq
 * + i (the causal mask, the window and ALiBi as fa_attention_args' with
 * causal_offset = seq_lens[b] - nq).  Query head h reads kv head h / (Hq /
 * Hkv).  kv_storage FA_INT8: int8 levels, key = k_scale[blk, off, g] *
 * level (float32 scales, strides ks_bs, ks_ps, ks_hs), likewise values.
 * out (total_q, Hq, Ev) of the storage type; lse NULL or dtype (Hq,
 * total_q) C-ordered.  Work items are (sequence, kv head, query chunk, key
 * split), split by the shapes alone: bitwise the same for any thread
 * count.  FA_EINVAL, nothing written, on inconsistent shapes or a block id
 * outside the pool. */
enum { FA_INT8 = 4 }; /* a paged cache's element type, beside FA_FLOAT32 .. */
typedef struct fa_paged_args {
    int dtype, storage, kv_storage;      /* as fa_attention_args'; kv_storage may be FA_INT8 */
    int64_t B, Hq, Hkv, E, Ev, total_q, num_blocks, block_size, max_blocks;
    const void *q;                       /* (total_q, Hq, E) */
    int64_t q_rs, q_hs, q_cs;
    const void *k, *v;
    int64_t k_bs, k_ps, k_hs, k_cs, v_bs, v_ps, v_hs, v_cs;
    const float *k_scale, *v_scale;      /* FA_INT8 only, else NULL */
    int64_t ks_bs, ks_ps, ks_hs, vs_bs, vs_ps, vs_hs;
    const int64_t *block_table;          /* (B, max_blocks) C-ordered */
    const int64_t *seq_lens, *cu_q;      /* (B), (B + 1) */
    void *out;                           /* (total_q, Hq, Ev), written */
    int64_t o_rs, o_hs, o_cs;
    void *lse;                           /* NULL or (Hq, total_q), written */
    double scale, softcap;               /* softcap <= 0: none */
    int causal;
    int64_t win_left, win_right;         /* >= 0, FA_UNBOUNDED for no bound */
    const double *alibi, *sinks;         /* NULL or (Hq) */
    int num_threads;                     /* <= 0: the OpenMP default */
} fa_paged_args;
int fa_attention_paged(const fa_paged_args *args);
/* Rows written into paged KV caches (driver/paged_append.c): token t's
 * key rows key + t key_ts + g key_hs (g < Hkv, E contiguous elements of
 * src_storage) go to slot s = slots[t] (skipped if negative): block s /
 * block_size, offset s % block_size, at k + blk k_bs + off k_ps + g k_hs
 * (the pools of fa_paged_args, unit column stride); values likewise.  The
 * rows are of the pools' own type (copied) or float32: rounded once to a
 * 16-bit pool's type (nearest even), or quantised for an int8 pool as
 * fa_quantize_q8 does, its scale stored at k_scale + blk ks_bs + off ks_ps
 * + g ks_hs.  Slots are distinct (the caller checks).  FA_EINVAL, nothing
 * written, on a slot outside the pool, a type pair not listed, or (int8) a
 * NaN or +-inf in a row to be written. */
typedef struct fa_paged_append_args {
    int src_storage, kv_storage;
    int64_t T, Hkv, E, Ev, num_blocks, block_size;
    const void *key, *value;             /* (T, Hkv, E), (T, Hkv, Ev) */
    int64_t key_ts, key_hs, value_ts, value_hs;
    void *k, *v;
    int64_t k_bs, k_ps, k_hs, v_bs, v_ps, v_hs;
    float *k_scale, *v_scale;            /* FA_INT8 only, else NULL */
    int64_t ks_bs, ks_ps, ks_hs, vs_bs, vs_ps, vs_hs;
    const int64_t *slots;                /* (T) */
    int num_threads;                     /* <= 0: the OpenMP default */
} fa_paged_append_args;
int fa_paged_append(const fa_paged_append_args *args);
/* ISA selection (runtime/dispatch.c). */
int fa_isa_built(int isa);             /* 1 if built for this target (its arch) */
int fa_cpu_supports(int isa);          /* 1 if built, and this CPU and OS can run it */
int fa_get_isa(void);
int fa_set_isa(int isa);               /* FA_EINVAL if unsupported */
int fa_avx512_emulated(void);         /* 1 in a SIMDe test build (setup.py) */
int fa_neon_emulated(void);           /* 1: the neon path compiled for x86-64 by SIMDe (setup.py) */
int fa_amx_fp16(void);                /* 1: the amx tier runs float16 on tiles (AMX-FP16 or emulated) */
const char *fa_isa_name(int isa);
/* Applies FASTATTN_DISABLE_CPU_FEATURES and FASTATTN_ISA; on a bad value
 * returns FA_EINVAL with a message in msg. */
int fa_init_dispatch(char *msg, size_t msg_len);

/* Threads (runtime/parallel.c).  fa_init_threads() registers the fork handler. */
void fa_init_threads(void);
void fa_set_default_threads(int n); /* omp_set_num_threads, if OpenMP */
int fa_openmp_enabled(void);
int fa_max_threads(void);
const char *fa_openmp_runtime(void);

/* The machine's FMA peak, for the benchmark: n steps of the ISA's register-
 * only FMA probe on each thread of a team of num_threads (<= 0: the OpenMP
 * default); *flops = the floating point operations done by the team. */
int fa_fma_probe(int dtype, int64_t n, int num_threads, double *flops);
/* The machine's read bandwidth, for the benchmark: the nbytes at p (8-byte
 * aligned) read once, split among num_threads threads (<= 0: the OpenMP
 * default); *sink = a value that depends on every word read. */
int fa_read_probe(const void *p, int64_t nbytes, int num_threads, uint64_t *sink);

/* Test hook: make the next n_ok allocations succeed and the following fail;
 * -1 disables.  Used by the tests to prove allocation failures are handled. */
void fa_debug_fail_alloc_after(int64_t n_ok);
/* Freed scratch kept for later calls (runtime/alloc.c), for the tests: its
 * bytes now; every cached block given back to the system; every cached
 * block's bytes set to `byte` (stale values a call must never read). */
int64_t fa_cached_bytes(void);
void fa_release_cached(void);
void fa_debug_poison_cached(int byte);

#ifdef __cplusplus
}
#endif
#endif
