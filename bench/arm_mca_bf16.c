/* arm_mca_bf16.c -- the neon_bf16 tier's two dot-product steps as functions
 * of their own, for bench/arm_mca_bf16.sh (llvm-mca of their inner loops):
 * kernels/kernels_isa.c compiled as the tier is (-DFA_ISA_NAME=neon_bf16),
 * its static steps called from here so that each loop is in one function. */
#include "kernels/kernels_isa.c"

void mca_qk_step(fa_flash16_queue *w, int64_t j);
void mca_pv_step(fa_flash16_queue *w, int64_t j);
void mca_qk_step(fa_flash16_queue *w, int64_t j) { FL(qk_step)(w, j); }
void mca_pv_step(fa_flash16_queue *w, int64_t j) { FL(pv_step)(w, j); }
