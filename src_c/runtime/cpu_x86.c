/* cpu_x86.c -- fa_cpu_features() on x86 (runtime/cpu.h): the CPU's features
 * from cpuid, the register states the OS saves from xgetbv (an AVX
 * instruction faults where the OS does not save its registers, whatever
 * cpuid says), and on Linux the permission AMX tile data needs.  Compiles to
 * nothing on other targets. */
#include "runtime/arch.h"

#if FA_ARCH_X86

#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall() */
#endif
#include <stddef.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "runtime/cpu.h"

#if defined(_MSC_VER)
#include <intrin.h>
static void fa_cpuid(int leaf, int sub, unsigned r[4])
{
    int t[4];
    __cpuidex(t, leaf, sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)t[i];
}
static unsigned long long fa_xgetbv(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void fa_cpuid(int leaf, int sub, unsigned r[4])
{
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
/* by its bytes: compilers without -mxsave have no _xgetbv */
static unsigned long long fa_xgetbv(void)
{
    unsigned lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Linux keeps the AMX tile data (XTILEDATA, XSAVE component 18) off until a
 * process asks (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+): without it
 * the first tile instruction faults.  1 if granted (or not Linux). */
static int amx_permitted(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 1;
#endif
}

/* The FA_CPU_X86_* bits cpuid reports. */
static unsigned long long cpuid_features(void)
{
    /* cpuid leaf, subleaf, register (0 eax .. 3 edx), bit: what each feature needs
     * (a feature listed twice needs both bits) */
    static const struct { unsigned long long feature; unsigned leaf, sub; int reg, bit; } bits[] = {
        {FA_CPU_X86_AVX, 1, 0, 2, 28}, {FA_CPU_X86_FMA, 1, 0, 2, 12},
        {FA_CPU_X86_F16C, 1, 0, 2, 29}, {FA_CPU_X86_AVX2, 7, 0, 1, 5},
        {FA_CPU_X86_AVX512F, 7, 0, 1, 16}, {FA_CPU_X86_AVX512BW, 7, 0, 1, 30},
        {FA_CPU_X86_AVX512BF16, 7, 1, 0, 5}, {FA_CPU_X86_AMX_BF16, 7, 0, 3, 22},
        {FA_CPU_X86_AMX_BF16, 7, 0, 3, 24}, {FA_CPU_X86_AMX_FP16, 7, 1, 0, 21},
        {FA_CPU_X86_AVX512VNNI, 7, 0, 2, 11}};
    unsigned r0[4], r[4];
    unsigned long long have = 0, missing = 0;
    fa_cpuid(0, 0, r0);
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        if (bits[i].leaf > r0[0]) { missing |= bits[i].feature; continue; }
        fa_cpuid((int)bits[i].leaf, (int)bits[i].sub, r);
        if ((r[bits[i].reg] >> bits[i].bit) & 1)
            have |= bits[i].feature;
        else
            missing |= bits[i].feature;
    }
    return have & ~missing;
}

/* The FA_OS_X86_* bits: the register states XCR0 says the OS saves. */
static unsigned long long os_features(void)
{
    static const struct { unsigned long long feature; unsigned long long xcr0; } bits[] = {
        {FA_OS_X86_YMM, 0x6}, {FA_OS_X86_ZMM, 0xe6}, {FA_OS_X86_AMX, 0x60000}};
    unsigned r1[4];
    unsigned long long have = 0;
    fa_cpuid(1, 0, r1);
    const int osxsave = (r1[2] >> 27) & 1;
    const unsigned long long xcr0 = osxsave ? fa_xgetbv() : 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if ((xcr0 & bits[i].xcr0) == bits[i].xcr0) have |= bits[i].feature;
    return have;
}

unsigned long long fa_cpu_features(void)
{
    unsigned long long have = cpuid_features() | os_features();
    const unsigned long long amx = FA_CPU_X86_AMX_BF16 | FA_OS_X86_AMX;
    if ((have & amx) == amx && !amx_permitted())
        have &= ~FA_OS_X86_AMX; /* refused: the next path down */
    return have;
}

#else
typedef int fa_cpu_x86_unused; /* ISO C: a translation unit declares something */
#endif
