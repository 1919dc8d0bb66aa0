/* arch.h -- the target architecture, tested once.
 *
 * FA_ARCH_X86 / FA_ARCH_AARCH64 are 1 on that target, FA_ARCH_NONE on any
 * other.  FA_GENERIC_ONLY (setup.py defines it for a target whose
 * architecture it does not know, such as a universal macOS build of two at
 * once, and then builds only the ISA lines of arch `any`) turns them all
 * off: no kernel table of another line is referenced, no detection compiled.
 * FA_IF_ARCH_<arch>(x) is x when the ISA lines of runtime/isa_list.h of that
 * `arch` are built for this target, else NULL: the per-ISA tables generated
 * from the list keep one slot per line whatever the target.  The `arch`
 * values are those of setup.py's ARCH_OF_MACHINE. */
#ifndef FA_ARCH_H
#define FA_ARCH_H

#if (defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)) && \
    !defined(FA_GENERIC_ONLY)
#define FA_ARCH_X86 1
#else
#define FA_ARCH_X86 0
#endif

#if (defined(__aarch64__) || defined(_M_ARM64)) && !defined(FA_GENERIC_ONLY)
#define FA_ARCH_AARCH64 1
#else
#define FA_ARCH_AARCH64 0
#endif

/* neither: runtime/cpu_none.c reports no features */
#define FA_ARCH_NONE (!FA_ARCH_X86 && !FA_ARCH_AARCH64)

#define FA_IF_ARCH_any(x) x
#if FA_ARCH_X86
#define FA_IF_ARCH_x86(x) x
#else
#define FA_IF_ARCH_x86(x) NULL
#endif
/* FA_NEON_EMULATED (setup.py, FASTATTN_NEON_EMULATION=simde: an x86-64 test
 * build) compiles the aarch64 lines too, their intrinsics by SIMDe */
#if FA_ARCH_AARCH64 || defined(FA_NEON_EMULATED)
#define FA_IF_ARCH_aarch64(x) x
#else
#define FA_IF_ARCH_aarch64(x) NULL
#endif

#endif
