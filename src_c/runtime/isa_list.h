/* isa_list.h -- every ISA path of fastattn, written once (an X-macro list).
 *
 * Each line is FA_ISA(name, NAME, arch, required), lowest path first; the
 * best one the CPU and OS support is the default (runtime/dispatch.c):
 *   name      lower case: the FASTATTN_ISA value, the mapping header
 *             simd/simd_<name>.h, the flags file simd/<name>.flags and the
 *             suffix of the kernel tables (fa_kernels_f32_<name>, ..._f64_...);
 *   NAME      upper case: the enum constant FA_ISA_<NAME> of fastattn.h;
 *   arch      the architecture it is built for: any (portable C, built for
 *             every target; the first line must be one), x86 (x86-64 and
 *             32-bit x86) or aarch64; setup.py stops on any other value;
 *   required  the CPU/OS features it needs, bits of runtime/cpu.h of its
 *             architecture (FA_CPU_X86_* / FA_OS_X86_*, FA_CPU_ARM_*).
 * Its consumers define FA_ISA(...) and include this file (no include guard):
 *   fastattn.h            the enum FA_ISA_<NAME>, FA_ISA_COUNT;
 *   kernels/kernels.h     the externs of each line's kernel tables;
 *   runtime/dispatch.c    the names, the required bits, the table selectors;
 *   setup.py              parses the lines: compiles kernels/kernels_isa.c
 *                         once per line of arch `any` or of the target's
 *                         architecture, with -DFA_ISA_NAME=<name> and the
 *                         flags of simd/<name>.flags.
 * Every line has its slot in each table whatever the target (runtime/arch.h:
 * NULL where the line is not built), so FA_ISA_<NAME> means the same path
 * everywhere.  A new ISA: simd/simd_<name>.h, simd/<name>.flags and one line
 * here.  avx512_bf16 and amx run float32/float64 through exactly the avx512
 * kernels (their mappings include simd_avx512.h); they add the 16-bit
 * matrix kernels (kernels/flash16.h: VDPBF16PS on zmm registers, or AMX
 * tiles) and the test hook's native instructions.  neon (Armv8 Advanced
 * SIMD) runs every element type on the same kernels as x86; neon_bf16 runs
 * the neon kernels for float32/float64/float16 and adds the 16-bit matrix
 * kernels for bfloat16 over BFMMLA (simd/flash16_neon.h); sve runs every
 * element type at a vector length of exactly 256 bits (simd/simd_sve.h
 * says why), above neon_bf16: on a CPU with both (Neoverse V1) the 256-bit
 * float kernels run, and bfloat16 on neon_bf16's matrix kernels (dispatch.c's
 * fa_flash16_current: a path without them takes those of the best path below
 * it that has them). */
FA_ISA(generic, GENERIC, any, 0)
FA_ISA(avx2, AVX2, x86, FA_CPU_X86_AVX | FA_CPU_X86_FMA | FA_CPU_X86_AVX2 | FA_CPU_X86_F16C | FA_OS_X86_YMM)
FA_ISA(avx512, AVX512, x86, FA_CPU_X86_AVX | FA_CPU_X86_FMA | FA_CPU_X86_AVX2 | FA_CPU_X86_F16C | FA_OS_X86_YMM | FA_CPU_X86_AVX512F | FA_OS_X86_ZMM)
FA_ISA(avx512_bf16, AVX512_BF16, x86, FA_CPU_X86_AVX | FA_CPU_X86_FMA | FA_CPU_X86_AVX2 | FA_CPU_X86_F16C | FA_OS_X86_YMM | FA_CPU_X86_AVX512F | FA_OS_X86_ZMM | FA_CPU_X86_AVX512BW | FA_CPU_X86_AVX512BF16 | FA_CPU_X86_AVX512VNNI)
FA_ISA(amx, AMX, x86, FA_CPU_X86_AVX | FA_CPU_X86_FMA | FA_CPU_X86_AVX2 | FA_CPU_X86_F16C | FA_OS_X86_YMM | FA_CPU_X86_AVX512F | FA_OS_X86_ZMM | FA_CPU_X86_AVX512BW | FA_CPU_X86_AVX512BF16 | FA_CPU_X86_AVX512VNNI | FA_CPU_X86_AMX_BF16 | FA_OS_X86_AMX)
FA_ISA(neon, NEON, aarch64, FA_CPU_ARM_ASIMD)
FA_ISA(neon_bf16, NEON_BF16, aarch64, FA_CPU_ARM_ASIMD | FA_CPU_ARM_BF16)
FA_ISA(sve, SVE, aarch64, FA_CPU_ARM_ASIMD | FA_CPU_ARM_SVE | FA_CPU_ARM_SVE256)
