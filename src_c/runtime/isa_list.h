/* isa_list.h -- every ISA path of fastattn, written once (an X-macro list).
 *
 * Each line is FA_ISA(name, NAME, arch, required), lowest path first; the
 * best one the CPU and OS support is the default (runtime/dispatch.c):
 *   name      lower case: the FASTATTN_ISA value, the mapping header
 *             simd/simd_<name>.h, the flags file simd/<name>.flags and the
 *             suffix of the kernel tables (fa_kernels_f32_<name>, ..._f64_...);
 *   NAME      upper case: the enum constant FA_ISA_<NAME> of fastattn.h;
 *   arch      any (portable C) or x86 (built only for an x86 target);
 *   required  the CPU/OS features it needs, FA_CPU_* bits of
 *             runtime/dispatch.c (cpuid and xgetbv, table-driven).
 * Its consumers define FA_ISA(...) and include this file (no include guard):
 * fastattn.h (the enum), kernels/kernels.h (the table externs),
 * runtime/dispatch.c (names, requirements, the table selectors), and setup.py,
 * which parses the lines below to compile kernels/kernels_isa.c once per ISA
 * with -DFA_ISA_NAME=<name> and the flags of simd/<name>.flags.
 * A new ISA: simd/simd_<name>.h, simd/<name>.flags and one line here.
 * avx512_bf16 and amx run float32/float64 through exactly the avx512 kernels
 * (their mappings include simd_avx512.h); they add the 16-bit matrix kernels
 * (kernels/flash16.h: VDPBF16PS on zmm registers, or AMX tiles). */
FA_ISA(generic, GENERIC, any, 0)
FA_ISA(avx2, AVX2, x86, FA_CPU_AVX | FA_CPU_FMA | FA_CPU_AVX2 | FA_CPU_F16C | FA_OS_YMM)
FA_ISA(avx512, AVX512, x86, FA_CPU_AVX | FA_CPU_FMA | FA_CPU_AVX2 | FA_CPU_F16C | FA_OS_YMM | FA_CPU_AVX512F | FA_OS_ZMM)
FA_ISA(avx512_bf16, AVX512_BF16, x86, FA_CPU_AVX | FA_CPU_FMA | FA_CPU_AVX2 | FA_CPU_F16C | FA_OS_YMM | FA_CPU_AVX512F | FA_OS_ZMM | FA_CPU_AVX512BW | FA_CPU_AVX512BF16)
FA_ISA(amx, AMX, x86, FA_CPU_AVX | FA_CPU_FMA | FA_CPU_AVX2 | FA_CPU_F16C | FA_OS_YMM | FA_CPU_AVX512F | FA_OS_ZMM | FA_CPU_AVX512BW | FA_CPU_AVX512BF16 | FA_CPU_AMX_BF16 | FA_OS_AMX)
