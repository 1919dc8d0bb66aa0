/* blocking.h -- every block size of fastattn, with the cache level it targets.
 *
 * Names follow BLIS: MR x NR is the register tile of a micro-kernel (defined
 * per ISA in its mapping header simd/simd_<isa>.h, because it depends on the
 * vector width and register count); MC and KC are the cache blocks of the
 * drivers (here, shared by all ISAs so that every path walks the keys in the
 * same order).
 *
 *   FA_MC  query rows per score tile, rounded up by the drivers to a
 *          multiple of the ISA's MR (66 rows for AVX2's MR = 6).  The score
 *          tile is MC x FA_KC elements (33 KiB in float32): about the L1
 *          (32 KiB here) while it is produced, exponentiated and consumed by
 *          P.V, and surely in L2 (512 KiB).
 *   FA_KC  keys per key block.  The packed K block (FA_KC x E) and V block
 *          (FA_KC x Ev) are 32-64 KiB each for E = 64-128 in float32:
 *          L2-resident, reused by every query row of a work chunk before the
 *          next block; one NR-wide V panel (8 KiB) stays in L1 during P.V.
 *          Must be a multiple of every ISA's NR (16, 32 for float; 8, 16
 *          for double).
 *   FA_MAX_CHUNK_MC  at most this many score tiles (query rows / FA_MC) share
 *          one packed K/V block (packed once per chunk: 16 tiles = 1024
 *          rows halve the packing of 8 at L = 1024); bounds the per-thread Q
 *          and O scratch (FA_MAX_CHUNK_MC * FA_MC rows: 256-512 KiB each at
 *          E = 64-128 in float32) to the L2 (2 MiB per core here).
 *   FA_SPLIT_KC  keys per chunk when a decoding step (few query rows, many
 *          keys) splits the keys across threads.  Fixed by the problem, never
 *          by the thread count, so results are bitwise reproducible.
 */
#ifndef FASTATTN_BLOCKING_H
#define FASTATTN_BLOCKING_H

#define FA_MC 64
#define FA_KC 128
#define FA_MAX_CHUNK_MC 16
#define FA_SPLIT_KC 512
/* Split the keys only when there are fewer than this many (batch x query
 * tile) work items and more than two key chunks. */
#define FA_SPLIT_MAX_ITEMS 16
/* The paged driver (driver/paged.c): the decoding rows' keys are split
 * over about this many work items (never fewer keys than FA_SPLIT_KC each),
 * enough for any team to balance, counted from the shapes alone (never the
 * thread count: the splits fix the results' bits); a sequence with more
 * queries than FA_DIRECT_MAX_ROWS (a prefill chunk) is cut into chunks of
 * FA_PAGED_CHUNK_TILES score tiles, each with only the keys its rows see. */
#define FA_PAGED_ITEMS 256
#define FA_PAGED_CHUNK_TILES 4
/* Up to this many query rows (L), Q.K^T and P.V read K and V in place (dot
 * products, axpys) instead of packing them: decoding. */
#define FA_DIRECT_MAX_ROWS 8
/* The direct (decoding) kernels read each key and value row once, from
 * memory: they prefetch the row FA_DIRECT_PF_KEYS keys ahead (8 KiB at E =
 * 128 in float32: past the 4 KiB page where the hardware prefetchers stop),
 * and P.V holds FA_DIRECT_PV_VECS vectors of an output row in registers
 * over a key block (a float32 row of 128 on AVX-512; AVX2's 16 registers
 * keep them with the weight and a value vector). */
#define FA_DIRECT_PF_KEYS 16
/* Value rows that follow one another over at least this many bytes (a
 * paged cache's pages of 128 float32 keys of 128 elements) are read by the
 * AVX2 tier's Q.K^T rather than prefetched (kernels/decode_rows_tmpl.h). */
#define FA_DIRECT_TOUCH_RUN (64 * 1024)
#define FA_DIRECT_PV_VECS 8
/* Below this many multiply-adds a call runs on one thread. */
#define FA_PARALLEL_MIN_WORK 200000
/* Independent FMA chains of the peak probe (fa_fma_probe): enough to hide
 * the FMA latency on two pipes (4 cycles x 2 = 8 on Zen 3 and Skylake-X),
 * few enough to stay in the 16 vector registers of AVX2. */
#define FA_PROBE_CHAINS 12
/* The int8 KV cache's decode (kernels/decode_q8_tmpl.h): query rows sharing
 * one pass over a kv head's keys (a GQA group x the new tokens; one int8 key
 * converted once serves them all: FA_Q8_ROWS accumulators + the key vector
 * fit AVX2's 16 registers), and keys per block (the FA_Q8_ROWS x FA_Q8_KC
 * float scores, 4 KiB, and the block's int8 K and V, 16-32 KiB at E = 64-128,
 * stay in L1 between the scores, the softmax and P.V). */
#define FA_Q8_ROWS 8
#define FA_Q8_KC 128
/* The 16-bit matrix path (driver/flash16.c, kernels/flash16.h):
 *   FA_FLASH16_MQ  query rows per block = two 16-lane tile columns: Q.K^T
 *          uses 4 C tiles (2 key tiles x 2 query halves) + 2 A + 2 B, all 8
 *          AMX tile registers (avx512_bf16: two zmm per row of C).
 *   FA_FLASH16_KB_TILES, FA_FLASH16_KB_VEC  keys per key block on the
 *          tile tiers (amx, neon_bf16) and on avx512_bf16 (the table's kb).
 *          Tiles: 64 keeps two S^T blocks (KB x 32 float32, 8 KiB each: the
 *          one the softmax reads, the one Q.K^T writes), two P^T blocks
 *          (4 KiB each) and O^T (Ev x 32 float32, 8 KiB at Ev = 64) in a
 *          48 KiB L1 with the Q^T tiles (4 KiB at E = 64) and the streamed
 *          K and V^T tiles; 128 would overflow it (56 KiB of buffers), 32
 *          loads and stores O^T twice as often.  VDPBF16PS: 128, half the
 *          per-block work (O^T loaded and stored by each P.V step, the
 *          running max, the queue) per key; the buffers then live in the
 *          L2, which the register-blocked steps' loads hide (Zen 5, 1
 *          thread, bfloat16 forward: 2.5-8% less time than 64 at E = 64
 *          and 128, causal, windowed and grouped alike; 32 15% more, 256
 *          within 2% of 128).
 *   FA_FLASH16_KGRID  key blocks start on multiples of this (a 32-key chunk
 *          of V^T and P^T: 16 key pairs, one tile's rows).
 *   FA_FLASH16_PANEL  keys packed at once per thread (K rows and V^T:
 *          256 KiB at E = Ev = 64, 1 MiB at 256): L2-resident while every
 *          query block of a chunk runs over them, and the call's extra
 *          memory bounded by the threads, not by S.
 *   FA_FLASH16_MAX_CHUNK  query blocks sharing one packed panel (1024 rows:
 *          a panel is packed once per 1024 query rows; their O^T, Q^T, m
 *          and l, 12 KiB per block at E = Ev = 64, stay in the L2).
 *   FA_FLASH16_MIN_ROWS  the fewest query rows the path takes: an AMX tile
 *          holds 16 rows, so below that most of each tile product is
 *          padding, and a decoding step (a few rows against a long cache) is
 *          bound by reading K and V, which the direct 16-bit path does once.
 *   FA_FLASH16_LAZY  the running max is raised only when a block's exceeds
 *          it by more than this (log2 units): weights stay below 2^8.
 *   FA_FLASH16_MAX_E  E and Ev up to this (the Q^T and O^T blocks). */
#define FA_FLASH16_MQ 32
#define FA_FLASH16_KB_TILES 64
#define FA_FLASH16_KB_VEC 128
#define FA_FLASH16_KGRID 32
#define FA_FLASH16_PANEL 1024
#define FA_FLASH16_MAX_CHUNK 32
#define FA_FLASH16_MIN_ROWS 16
#define FA_FLASH16_LAZY 8.0f
#define FA_FLASH16_MAX_E 256
/* The backward pass (driver/backward_tmpl.h): query rows per block, rounded
 * up to the ISA's MR.  A block's Q and dO rows are packed as the "values"
 * of dK += dS^T Q and dV += P^T dO, whose panels hold at most FA_KC rows,
 * so it must stay <= FA_KC; 64 rows keep the block's P, dP and dS tiles
 * (64 x FA_KC each, 32 KiB in float32) and the key block's dK/dV
 * accumulators (FA_KC x E, Ev) in the L2 while the query blocks stream by. */
#define FA_BW_MQ 64
/* Where E + Ev >= FA_BW_WIDE_E, the most rows up to FA_KC instead: a key
 * block's accumulators are then 128 KiB or more, the fused pass's (every key
 * block of a head) beyond half the L2 at S = 1024, and each query block
 * sweeps them once: twice the rows, half the sweeps (float32 E = 128, Intel
 * Xeon with AMX, 2026-12-05: the backward 4.7% faster; at E = 64 it gains
 * nothing, its accumulators staying in the L2). */
#define FA_BW_WIDE_E 256
/* The backward's fused pass (driver/bwfused_tmpl.h) is one work item per
 * batch index: it computes each (query block, key block) pair's products
 * once (FA_BW_FUSED_PRODUCTS, against the two passes' FA_BW_PASSES_PRODUCTS),
 * but an item holds every key block of its batch index, so its threads
 * share whole batch indices.  driver/bw_scheme.h weighs the two by their
 * busiest thread (few batch indices on many threads leave the fused pass's
 * threads idle) and runs the fused pass only where an item's keys, S x
 * (3E + 2Ev) elements (K and V packed as keys, K as values, dK and dV),
 * take at most FA_BW_FUSED_MAX_BYTES (16 MiB: S up to 13107 at E = Ev = 64
 * in float32, 6553 at 128), so the extra memory stays bounded by the
 * threads however long the keys.  Both schemes give bitwise the same
 * gradients. */
#define FA_BW_FUSED_PRODUCTS 5
#define FA_BW_PASSES_PRODUCTS 7
#define FA_BW_FUSED_MAX_BYTES (16.0 * 1024 * 1024)
/* Vector width every packed row is padded to (64 bytes: one AVX-512 line). */
#define FA_ALIGN 64

#endif
