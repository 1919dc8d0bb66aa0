/* arm_mca_loops.c -- the register-tile loops of one ISA's kernels, as
 * functions of their own, for bench/arm_mca.sh: it compiles this file with
 * -DFA_ISA_NAME=<name> and that ISA's flags (simd/<name>.flags), finds the
 * inner (k) loop of each function in the assembly and hands it to llvm-mca.
 * The loops are the kernels' own: kernels_isa.c is included whole, and each
 * function is its tile with the row count and `zero` the kernels pass
 * (qk: MR rows, from zero; pv: PV_MR rows, accumulating).  Not part of the
 * package. */
#include "kernels/kernels_isa.c"

#define TILE(sfx) FA_CAT3(tile, sfx, FA_ISA_NAME) /* tile_f32_neon, tile_f64_sve, ... */

void mca_qk_f32(int64_t K, const float *a, int64_t lda, const float *b, float *c, int64_t ldc)
{
    TILE(f32)(VF_MR, 1, K, a, lda, b, VF_NRV * VF_W, c, ldc, NULL);
}
void mca_pv_f32(int64_t K, const float *a, int64_t lda, const float *b, float *c, int64_t ldc)
{
    TILE(f32)(VF_PV_MR, 0, K, a, lda, b, VF_NRV * VF_W, c, ldc, NULL);
}
void mca_qk_f64(int64_t K, const double *a, int64_t lda, const double *b, double *c, int64_t ldc)
{
    TILE(f64)(VD_MR, 1, K, a, lda, b, VD_NRV * VD_W, c, ldc, NULL);
}
void mca_pv_f64(int64_t K, const double *a, int64_t lda, const double *b, double *c, int64_t ldc)
{
    TILE(f64)(VD_PV_MR, 0, K, a, lda, b, VD_NRV * VD_W, c, ldc, NULL);
}
/* the tile's shape: rows, vectors, lanes per vector */
const int mca_shape_f32[4] = {VF_MR, VF_PV_MR, VF_NRV, VF_W};
const int mca_shape_f64[4] = {VD_MR, VD_PV_MR, VD_NRV, VD_W};
