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
 *   vf_min (min, the 2nd operand where either is NaN),
 *   vf_nan_acc (sticky NaN detector), vf_hmax, vf_hsum, vf_transpose_block,
 *   vf_all_below (1 if every lane is < lo, NaN is not: the online softmax),
 *   vf_where_below (a where x < lo, else b; NaN x: b);
 *   and, for the vector exp of vmath_tmpl.h: vf_fnma (c - a*b), vf_max
 *   (max, the 2nd operand where either is NaN), vf_round (to nearest),
 *   vf_ldexp (p * 2^n, n integral, n >= exp's range), vf_zero_below (p, or 0
 *   where x < lo), vf_ldexp_from (ldexp, then zero_below), vf_exp_bits (the
 *   integer image shifted into the exponent field; FA_SIMD_SCALEF: a mapping
 *   whose ldexp is exact for any n, see vmath.h); for the vector tanh:
 *   vf_div, vf_abs, vf_copysign (m's magnitude, s's sign) -- or its own
 *   vf_exp, vf_exp2, vf_tanh with FA_SIMD_LIBM_EXP (generic); and, float
 *   only, vf_load_f16, vf_load_bf16: VF_W 16-bit elements widened, exactly,
 *   and vf_store_f16, vf_store_bf16: rounded to nearest even (runtime/half.h);
 *   vf_load_i8 (VF_W int8, converted), vf_hsum_lanes (x[0..VF_W) -> the
 *   vector of their horizontal sums).  Optionally FA_SIMD_Q8_DOT: the
 *   header of the int8 KV cache's integer dot products, its qd_* with
 *   QD_W = VF_W (simd/q8_dot_avx2.h, simd/q8_dot_avx512.h; without it that
 *   kernel converts the levels to float).
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
/* The mapping simd_<name>.h (e.g. simd_avx2.h): its types and constants,
 * then its operations once per element type, each followed by the vector
 * exp of vmath_tmpl.h.  In these per-type passes FA_SFX is f32 or f64 and
 * FA_T, VT, V(op), VC(name) stand for float, vf, vf_op, VF_name (double,
 * vd, vd_op, VD_name). */
#define FA_SIMD_MAPPING FA_STR(FA_PASTE(simd_, FA_ISA_NAME).h)
#include FA_SIMD_MAPPING
#define FA_T FA_TYPE(FA_SFX)
#define VT FA_VEC(FA_SFX)
#define V(op) FA_CAT(VT, op)
#define VC(name) FA_CAT(FA_VECU(FA_SFX), name)

#define FA_SFX f32
#include FA_SIMD_MAPPING /* vf_load, vf_fma, ... */
#ifndef FA_SIMD_LIBM_EXP
#include "simd/vmath_tmpl.h" /* vf_exp, vf_exp2, vf_tanh */
#endif
#undef FA_SFX

#define FA_SFX f64
#include FA_SIMD_MAPPING /* vd_load, vd_fma, ... */
#ifndef FA_SIMD_LIBM_EXP
#include "simd/vmath_tmpl.h" /* vd_exp, vd_exp2, vd_tanh */
#endif
#undef FA_SFX

#undef FA_T
#undef VT
#undef V
#undef VC

#endif
