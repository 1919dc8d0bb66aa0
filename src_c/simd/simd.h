/* simd.h -- the thin vector layer the micro-kernels are written in.
 *
 * Included by kernels/kernels_isa.c only, which setup.py compiles once per
 * ISA of runtime/isa_list.h with -DFA_ISA_NAME=<name> and the flags of
 * simd/<name>.flags; this header then includes the mapping simd_<name>.h.
 * For each element type (vf: float, vd: double) a mapping defines
 *   the vector type vf / vd, its lanes VF_W, the register tile VF_MR x VF_NRV
 *   vectors of Q.K^T and the rows VF_PV_MR of P.V, the transpose block VF_TB;
 *   vf_load, vf_store (unaligned), vf_set1, vf_zero, vf_fma (a*b + c),
 *   vf_add, vf_sub, vf_mul, vf_max_acc (max, keeping acc where x is NaN),
 *   vf_nan_acc (sticky NaN detector), vf_hmax, vf_hsum, vf_transpose_block;
 *   and, for the vector exp of vmath_tmpl.h: vf_fnma (c - a*b), vf_max
 *   (max, the 2nd operand where either is NaN), vf_round (to nearest),
 *   vf_ldexp (p * 2^n, n integral, n >= exp's range), vf_zero_below (p, or 0
 *   where x < lo), vf_exp_bits (the integer image shifted into the exponent
 *   field) -- or its own vf_exp, vf_exp2 with FA_SIMD_LIBM_EXP (generic).
 * Same for vd_* and VD_*.  A new ISA: one mapping header, one line in
 * runtime/isa_list.h and one flags file.
 */
#ifndef FASTATTN_SIMD_H
#define FASTATTN_SIMD_H

#include <math.h>
#include <stdint.h>

#include "runtime/util.h"
#include "simd/vmath.h"

#ifndef FA_ISA_NAME
#error "FA_ISA_NAME (an ISA of runtime/isa_list.h) must be defined: see setup.py"
#endif
/* simd_<name>.h, e.g. simd_avx2.h */
#include FA_STR(FA_PASTE(simd_, FA_ISA_NAME).h)

#ifndef FA_SIMD_LIBM_EXP
#define FA_T float
#define FA_VP vf
#define FA_VPU VF
#include "simd/vmath_tmpl.h" /* vf_exp, vf_exp2 */
#undef FA_T
#undef FA_VP
#undef FA_VPU
#define FA_T double
#define FA_VP vd
#define FA_VPU VD
#include "simd/vmath_tmpl.h" /* vd_exp, vd_exp2 */
#undef FA_T
#undef FA_VP
#undef FA_VPU
#endif

#endif
