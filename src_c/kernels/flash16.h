/* flash16.h -- the contract of the 16-bit matrix path's kernels: bfloat16
 * on the amx, avx512_bf16 and neon_bf16 tiers, float16 on amx where the CPU
 * has AMX-FP16.  driver/flash16.c runs the loops (work items, key panels, key
 * blocks); these kernels do the arithmetic, one set per ISA, an entry of
 * that ISA's f32 table (kernels.h): packing (kernels/flash16_pack.h), the
 * tile or VDPBF16PS steps (kernels/flash16_steps.h), the softmax step and
 * writing out (kernels/flash16_softmax.h), and the loop over a key panel's
 * blocks that runs them (kernels/flash16_blocks.h).
 *
 * The transposed formulation (keys on tile rows, queries on lanes), so that
 * the online softmax needs no horizontal reduction:
 *   S^T (keys x queries) = K . Q^T   A = K rows, pairs along E; B = Q^T in
 *                                    pair layout (packed once per block);
 *   softmax over keys                a vertical max / exp2 / sum per lane;
 *   O^T (Ev x queries) += V^T . P^T  A = V^T, B = P^T rounded to 16 bits,
 *                                    key pairs interleaved per lane.
 * Every C element is one chain of dot-product instructions over its pairs
 * in order (TDPBF16PS / TDPFP16PS on amx, VDPBF16PS on avx512_bf16, BFMMLA
 * on neon_bf16), from 0
 * for S^T and from O^T for P.V, however the work is blocked or queued.
 *
 * Layouts (sizes in halves unless said; all buffers 64-byte aligned):
 *   kp   K rows of a key panel, row r at kp + r*ep (ep = E rounded up to
 *        FA_FLASH16_EPAIR), zero past E and past the last key;
 *   vt   V^T of the panel: row e (< evp = Ev rounded up to FA_FLASH16_EROWS)
 *        at vt + e*vt_rs, key r at column r, zero past Ev and the last key; a
 *        NaN or Inf value packed as 0 (0 x NaN is NaN in P.V, and a hidden
 *        key's must not reach the output) and its key flagged;
 *   qt   Q^T of one query block: (ep / FA_FLASH16_EPAIR) x 2 tiles of
 *        FA_FLASH16_TILE halves, tile (kk, h) = 16 rows (E pairs 16kk + r)
 *        x 16 queries (16h + n), zero past E and past the block's rows;
 *   st   S^T of a key block: kb rows (keys; the table's) x FA_FLASH16_MQ
 *        float32 (query lanes);
 *   pt   P^T of a key block: two halves (queries 16h ..) of kb/2
 *        pair rows x 16 dwords (uint32_t);
 *   ot   O^T: evp rows x FA_FLASH16_MQ float32; m, l, alpha: FA_FLASH16_MQ
 *        float32 (running max in log2 units, sum, rescaling factor).
 * On neon_bf16 kp, vt, qt and pt, once written, are rearranged in place
 * into BFMMLA's operand layout (simd/flash16_neon.h: m16_dot_pairs,
 * m16_dot_rows), which keeps a row pair's columns in blocks of 8 at their
 * place: the driver's offsets (a key block's first key, a multiple of
 * FA_FLASH16_KGRID) point to the same data. */
#ifndef FASTATTN_FLASH16_H
#define FASTATTN_FLASH16_H

#include <stdint.h>

#include "kernels/blocking.h"

#define FA_FLASH16_EPAIR 32  /* E padded to the halves of one 64-byte tile row */
#define FA_FLASH16_EROWS 16  /* Ev padded to the rows of a tile (a C tile of P.V) */
#define FA_FLASH16_TILE 512  /* halves of a tile: 16 rows of 32 */
#define FA_FLASH16_HALF 16   /* query lanes of one vector (a half of MQ) */

/* The tile work of a key block, queued as steps that the softmax step
 * issues a few at a time between its vector instructions, so that the tile
 * unit (or, on avx512_bf16, the out-of-order core) works while the vector
 * units compute the weights.  queue_qk / queue_pv fill it; the driver sets
 * tf and f16 and zeroes the counts before a key block. */
typedef struct fa_flash16_queue {
    void *tf;                 /* the tile state (tile_bytes of scratch) */
    const uint16_t *kp, *qt;  /* Q.K^T: K rows of the block, Q^T */
    int64_t ep, e_tiles, key_tiles; /* K row stride, E / FA_FLASH16_EPAIR, 16-key tiles */
    float *st;                /* its S^T */
    const uint16_t *vt;       /* P.V: V^T at the block's first key */
    const uint32_t *pt;       /* its P^T */
    int64_t vt_rs, evp, key_chunks; /* V^T row stride, padded Ev, 32-key chunks */
    float *ot;
    int64_t npv, nqk, ip, iq; /* steps of each, the next ones */
    int f16;                  /* 1: float16 (TDPFP16PS), 0: bfloat16 */
} fa_flash16_queue;

/* One key panel to pack: keys j < nk (k, v: key 0's rows; element strides
 * rs, cs), npk (a multiple of FA_FLASH16_KGRID, >= nk) packed. */
typedef struct fa_flash16_pack {
    const uint16_t *k, *v;
    int64_t krs, kcs, vrs, vcs, E, Ev, ep, evp, nk, npk, vt_rs;
    uint16_t exp_bits;        /* the type's exponent field: NaN or Inf when all set */
    uint16_t *kp, *vt;
    uint8_t *flags;           /* flags[j] = 1: value row j has a NaN or Inf */
} fa_flash16_pack;

/* The rows of a query block: query lane i (< FA_FLASH16_MQ) is row q0 + i,
 * which sees keys q0 + i + lo <= j (has_lo), j <= q0 + i + hi (has_hi),
 * pad == NULL or pad[j*pad_cs] == 0. */
typedef struct fa_flash16_rows {
    int64_t q0, lo, hi, pad_cs;
    int has_lo, has_hi;
    const uint8_t *pad;
} fa_flash16_rows;

/* One query block's pass over the key blocks [k0, kend) of a packed panel
 * (kp, vt: the panel's first key p0 at row / column 0), keys visible up to
 * hi; the block's state qt, ot, m, l; st, pt: two S^T and two P^T blocks
 * (block j in one, j-1's and j+1's in the other); alpha: the rescaling
 * factors; c = scale log2(e). */
typedef struct fa_flash16_blocks {
    void *tf;
    int f16;
    const fa_flash16_rows *rows;
    const uint16_t *kp, *vt, *qt;
    int64_t p0, k0, kend, hi, ep, vt_rs, evp;
    float *ot, *m, *l, *st, *alpha;
    uint32_t *pt;
    float c;
} fa_flash16_blocks;

typedef struct fa_flash16_kernels {
    int64_t tile_bytes; /* the tile state's scratch */
    int64_t kb;         /* keys per key block (FA_FLASH16_KB_*: a multiple of KGRID) */
    int fp16;           /* 1: runs float16 too (where fa_amx_fp16()) */
    /* kp, vt (and flags) of a panel; returns 1 if a value is NaN or Inf */
    unsigned (*pack_kv)(const fa_flash16_pack *p);
    /* qt of rows 0 .. nq-1 at q (strides rs, cs), E columns */
    void (*pack_qt)(const uint16_t *q, int64_t rs, int64_t cs, int64_t E, int64_t nq,
                    int64_t e_tiles, uint16_t *qt);
    void (*tiles_on)(void *tf);
    void (*tiles_off)(void *tf);
    /* queue Q.K^T of n keys (K rows kp, stride ep) into st; P.V of n keys */
    /* (V^T at the block's first key) into ot; run every queued step */
    void (*queue_qk)(fa_flash16_queue *w, const uint16_t *kp, int64_t ep, int64_t n,
                     const uint16_t *qt, float *st);
    void (*queue_pv)(fa_flash16_queue *w, const uint16_t *vt, int64_t vt_rs, int64_t evp,
                     int64_t n, const uint32_t *pt, float *ot);
    void (*drain)(fa_flash16_queue *w);
    /* S^T rows r < n (keys k0 + r) set to -inf for the lanes that do not */
    /* see them */
    void (*mask)(const fa_flash16_rows *rows, int64_t k0, int64_t n, float *st);
    /* the lazily raised running max (FA_FLASH16_LAZY): returns 1 and sets */
    /* alpha, scaling l, when m is raised, else 0; c = scale log2(e) */
    int (*newmax)(const float *st, int64_t n, float c, float *m, float *l, float *alpha);
    /* ot rows scaled by alpha per lane */
    void (*rescale)(float *ot, int64_t evp, const float *alpha);
    /* P = 2^(c s - m) of S^T rows < n (m = -inf: relative to 0), summed */
    /* into l, written to pt (zero rows up to FA_FLASH16_KGRID), issuing */
    /* the queued steps of w between its own; every step done on return */
    void (*weights)(const float *st, int64_t n, float c, const float *m, float *l,
                    uint32_t *pt, fa_flash16_queue *w);
    /* out rows i < nq (strides rs, cs) = O / l rounded to 16 bits (0 where */
    /* l = 0); tmp: 32 halves of scratch */
    void (*finish)(const float *ot, const float *l, int64_t nq, int64_t Ev, int f16,
                   uint16_t *out, int64_t rs, int64_t cs, uint16_t *tmp);
    /* the loop over a panel's key blocks (kernels/flash16_blocks.h), the */
    /* steps above called directly: per key block, calls through the table */
    /* cost what the steps of a block at E = 64 are worth */
    void (*key_blocks)(const fa_flash16_blocks *b);
} fa_flash16_kernels;

/* The exponent field, the mantissa and a quiet NaN of the call's type. */
typedef struct fa_half_bits { uint16_t exp, mant, qnan; } fa_half_bits;
static inline fa_half_bits fa_half_bits_of(int f16)
{
    const fa_half_bits bf16 = {0x7f80, 0x7f, 0x7fc0}, f16b = {0x7c00, 0x3ff, 0x7e00};
    return f16 ? f16b : bf16;
}

#endif
