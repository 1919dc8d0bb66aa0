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

/* Test hook (driver/amx_hooks.c): one instruction of the bfloat16 tiers on
 * small arrays.  native 0: its plain-C emulation (simd/bf16_emulate.h);
 * 1: the instruction itself, FA_EINVAL where the CPU, the OS or the build
 * lacks it.  Operands (row-major, 64-byte rows):
 *   TDPBF16PS / TDPFP16PS  c (16 x 16 float32) += a (16 x 32 halves) . b
 *                          (16 x 32 halves, pairs per column);
 *   VDPBF16PS              c (16 float32) += a . b (32 bfloat16 each);
 *   VCVTNE2PS2BF16         c (32 bfloat16) = b (16 float32), then a (16);
 *   VCVTNEPS2BF16          c (16 bfloat16) = a (16 float32); b unused. */
enum { FA_BF16_OP_TDPBF16PS = 0, FA_BF16_OP_TDPFP16PS = 1, FA_BF16_OP_VDPBF16PS = 2,
       FA_BF16_OP_VCVTNE2PS2BF16 = 3, FA_BF16_OP_VCVTNEPS2BF16 = 4 };
int fa_bf16_op(int op, int native, const void *a, const void *b, void *c);

/* ISA selection (runtime/dispatch.c). */
int fa_cpu_supports(int isa);          /* 1 if this CPU and OS can run it */
int fa_get_isa(void);
int fa_set_isa(int isa);               /* FA_EINVAL if unsupported */
int fa_avx512_emulated(void);         /* 1 in a SIMDe test build (setup.py) */
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

#ifdef __cplusplus
}
#endif
#endif
