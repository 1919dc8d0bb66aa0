/* kernels_impl.h -- instantiates kernels_tmpl.h for float and double and
 * exports the two tables of one ISA.  Included by kernels_<isa>.c only. */
#include <string.h>

#include "blocking.h"
#include "kernels.h"
#include "simd.h"

#define FA_XCAT3_(a, b, c) a##_##b##_##c
#define FA_XCAT3(a, b, c) FA_XCAT3_(a, b, c)
#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)

#define FA_T float
#define FA_SFX f32
#define VT vf
#define VW VF_W
#define MR VF_MR
#define PV_MR VF_PV_MR
#define NRV VF_NRV
#define V_LOAD vf_load
#define V_STORE vf_store
#define V_SET1 vf_set1
#define V_ZERO vf_zero
#define V_FMA vf_fma
#define V_ADD vf_add
#define V_SUB vf_sub
#define V_MUL vf_mul
#define V_MAXACC vf_max_acc
#define V_NANACC vf_nan_acc
#define V_HMAX vf_hmax
#define V_HSUM vf_hsum
#define V_EXP vf_exp
#define V_EXP2 vf_exp2
#define V_TB VF_TB
#define V_TRANSPOSE vf_transpose_block
#include "kernels_tmpl.h"
#undef FA_T
#undef FA_SFX
#undef VT
#undef VW
#undef MR
#undef PV_MR
#undef NRV
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_ZERO
#undef V_FMA
#undef V_ADD
#undef V_SUB
#undef V_MUL
#undef V_MAXACC
#undef V_NANACC
#undef V_HMAX
#undef V_HSUM
#undef V_EXP
#undef V_EXP2
#undef V_TB
#undef V_TRANSPOSE

#define FA_T double
#define FA_SFX f64
#define VT vd
#define VW VD_W
#define MR VD_MR
#define PV_MR VD_PV_MR
#define NRV VD_NRV
#define V_LOAD vd_load
#define V_STORE vd_store
#define V_SET1 vd_set1
#define V_ZERO vd_zero
#define V_FMA vd_fma
#define V_ADD vd_add
#define V_SUB vd_sub
#define V_MUL vd_mul
#define V_MAXACC vd_max_acc
#define V_NANACC vd_nan_acc
#define V_HMAX vd_hmax
#define V_HSUM vd_hsum
#define V_EXP vd_exp
#define V_EXP2 vd_exp2
#define V_TB VD_TB
#define V_TRANSPOSE vd_transpose_block
#include "kernels_tmpl.h"

#define FA_TABLE(SFX, MRV, NRVV, VWV)                                                 \
    const fa_kernels_##SFX FA_XCAT3(fa_kernels, SFX, FA_ISA_NAME) = {                 \
        FA_STR(FA_ISA_NAME), MRV, (NRVV) * (VWV), VWV,                                \
        FA_XCAT3(qk, SFX, FA_ISA_NAME),     FA_XCAT3(pv, SFX, FA_ISA_NAME),           \
        FA_XCAT3(qk_direct, SFX, FA_ISA_NAME), FA_XCAT3(pv_direct, SFX, FA_ISA_NAME), \
        FA_XCAT3(rowmax, SFX, FA_ISA_NAME), FA_XCAT3(expsum, SFX, FA_ISA_NAME),       \
        FA_XCAT3(expsum2, SFX, FA_ISA_NAME),                                          \
        FA_XCAT3(scal, SFX, FA_ISA_NAME), FA_XCAT3(online_softmax, SFX, FA_ISA_NAME), \
        FA_XCAT3(pack_k, SFX, FA_ISA_NAME), FA_XCAT3(pack_v, SFX, FA_ISA_NAME),       \
        FA_XCAT3(fma_probe, SFX, FA_ISA_NAME)};

FA_TABLE(f32, VF_MR, VF_NRV, VF_W)
FA_TABLE(f64, VD_MR, VD_NRV, VD_W)
