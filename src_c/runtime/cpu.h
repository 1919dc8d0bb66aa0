/* cpu.h -- what this CPU and OS offer, asked once per architecture.
 *
 * fa_cpu_features() returns the feature bits below that the CPU has and the
 * OS enables (register state saved on context switch, permission granted):
 * the `required` column of runtime/isa_list.h is written in them, and
 * runtime/dispatch.c calls it once, at import.  One implementation per
 * architecture, each compiling to nothing on other targets (runtime/arch.h
 * decides):
 *   cpu_x86.c      cpuid, xgetbv, Linux's AMX tile permission;
 *   cpu_aarch64.c  Linux/Android getauxval(AT_HWCAP, AT_HWCAP2), FreeBSD
 *                  elf_aux_info, macOS sysctlbyname("hw.optional..."),
 *                  Windows IsProcessorFeaturePresent;
 *   cpu_none.c     every other target: 0 (only the ISAs of arch `any`).
 * The bits of each architecture have their own positions (x86 from bit 0,
 * aarch64 from bit 32): the list names both, and a line of another
 * architecture can never look satisfied.
 * A new architecture: its bits here, runtime/cpu_<arch>.c, FA_ARCH_<ARCH>
 * (and in FA_ARCH_NONE) and FA_IF_ARCH_<arch> in runtime/arch.h, its
 * machine names in setup.py's ARCH_OF_MACHINE. */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "runtime/arch.h"

/* x86: CPU features (cpuid) ... */
#define FA_CPU_X86_AVX (1ULL << 0)
#define FA_CPU_X86_FMA (1ULL << 1)
#define FA_CPU_X86_AVX2 (1ULL << 2)
#define FA_CPU_X86_AVX512F (1ULL << 3)
#define FA_CPU_X86_F16C (1ULL << 6)       /* float16 conversions */
#define FA_CPU_X86_AVX512BW (1ULL << 7)
#define FA_CPU_X86_AVX512BF16 (1ULL << 8)
#define FA_CPU_X86_AMX_BF16 (1ULL << 9)   /* AMX-TILE and AMX-BF16 */
#define FA_CPU_X86_AVX512VNNI (1ULL << 12) /* VPDPWSSD: the int8 KV cache's kernel */
#define FA_CPU_X86_AMX_FP16 (1ULL << 11)  /* no tier requires it: the amx tier's float16 tiles */
/* ... and the register states the OS saves (xgetbv XCR0) */
#define FA_OS_X86_YMM (1ULL << 4)         /* XMM and YMM */
#define FA_OS_X86_ZMM (1ULL << 5)         /* plus opmask, ZMM_Hi256, Hi16_ZMM */
#define FA_OS_X86_AMX (1ULL << 10)        /* XTILECFG, XTILEDATA; Linux: permission granted */

/* aarch64 (the OS reports them: user space cannot read the ID registers
 * everywhere) */
#define FA_CPU_ARM_ASIMD (1ULL << 32)     /* Advanced SIMD (NEON) */
#define FA_CPU_ARM_FP16 (1ULL << 33)      /* half-precision arithmetic, scalar and vector */
#define FA_CPU_ARM_DOTPROD (1ULL << 34)   /* SDOT/UDOT */
#define FA_CPU_ARM_BF16 (1ULL << 35)      /* BFDOT, BFMMLA on Advanced SIMD */
#define FA_CPU_ARM_I8MM (1ULL << 36)      /* SMMLA, USDOT on Advanced SIMD */
#define FA_CPU_ARM_SVE (1ULL << 37)
#define FA_CPU_ARM_SVE2 (1ULL << 38)
#define FA_CPU_ARM_SVE_BF16 (1ULL << 39)  /* the bfloat16 instructions on SVE */
#define FA_CPU_ARM_SVE_I8MM (1ULL << 40)
#define FA_CPU_ARM_SME (1ULL << 41)
#define FA_CPU_ARM_SVE256 (1ULL << 42)   /* SVE, this thread's vector length exactly 256 bits */

/* The bits above this CPU and OS have, of the target's architecture. */
unsigned long long fa_cpu_features(void);

#if FA_ARCH_AARCH64
/* The SVE vector length of this thread in bytes (16 .. 256); 0 without SVE
 * or where the OS does not say (kernels whose blocking depends on it check
 * it at dispatch). */
int fa_cpu_sve_bytes(void);
#endif

#endif
