/* arch.h -- the target architecture, tested once.
 *
 * FA_ARCH_X86 / FA_ARCH_AARCH64 are 1 on that target (FA_NO_X86_KERNELS
 * turns x86 off: a portable build on an x86 host).  FA_IF_ARCH_<arch>(x) is
 * x when the ISA lines of runtime/isa_list.h of that `arch` are built for
 * this target, else NULL: the per-ISA tables generated from the list keep
 * one slot per line whatever the target. */
#ifndef FA_ARCH_H
#define FA_ARCH_H

#if (defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)) && \
    !defined(FA_NO_X86_KERNELS)
#define FA_ARCH_X86 1
#else
#define FA_ARCH_X86 0
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define FA_ARCH_AARCH64 1
#else
#define FA_ARCH_AARCH64 0
#endif

#define FA_IF_ARCH_any(x) x
#if FA_ARCH_X86
#define FA_IF_ARCH_x86(x) x
#else
#define FA_IF_ARCH_x86(x) NULL
#endif
#if FA_ARCH_AARCH64
#define FA_IF_ARCH_aarch64(x) x
#else
#define FA_IF_ARCH_aarch64(x) NULL
#endif

#endif
