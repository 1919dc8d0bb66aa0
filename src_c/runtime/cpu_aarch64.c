/* cpu_aarch64.c -- fa_cpu_features() and fa_cpu_sve_bytes() on aarch64
 * (runtime/cpu.h).  The ID registers are the kernel's to read, so each OS is
 * asked in its own way: Linux and Android getauxval(AT_HWCAP, AT_HWCAP2),
 * FreeBSD elf_aux_info (the same bits), macOS sysctlbyname, Windows
 * IsProcessorFeaturePresent; elsewhere only what the compiler's baseline
 * already assumes.  Compiles to nothing on other targets. */
#include "runtime/arch.h"

#if FA_ARCH_AARCH64

#include <stddef.h>

#include "runtime/cpu.h"

/* What the compiler's baseline for this build already assumes: the CPU has it
 * or nothing of this build runs at all. */
static unsigned long long baseline_features(void)
{
    unsigned long long have = 0;
#if defined(__ARM_NEON) || defined(_M_ARM64)
    have |= FA_CPU_ARM_ASIMD;
#endif
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
    have |= FA_CPU_ARM_FP16;
#endif
    return have;
}

#if defined(__linux__) || defined(__FreeBSD__)
#include <sys/auxv.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#endif
#define FA_PR_SVE_VL_LEN_MASK 0xffff

/* (word: 0 AT_HWCAP, 1 AT_HWCAP2; bit) of the Linux ABI
 * (arch/arm64/include/uapi/asm/hwcap.h, which FreeBSD follows), by value:
 * a C library's headers may predate the newer bits.  A feature listed twice
 * needs both bits. */
static const struct { unsigned long long feature; int word, bit; } g_hwcap[] = {
    {FA_CPU_ARM_ASIMD, 0, 1},
    {FA_CPU_ARM_FP16, 0, 9}, {FA_CPU_ARM_FP16, 0, 10}, /* FPHP, ASIMDHP */
    {FA_CPU_ARM_DOTPROD, 0, 20},
    {FA_CPU_ARM_SVE, 0, 22},
    {FA_CPU_ARM_SVE2, 1, 1},
    {FA_CPU_ARM_SVE_I8MM, 1, 9},
    {FA_CPU_ARM_SVE_BF16, 1, 12},
    {FA_CPU_ARM_I8MM, 1, 13},
    {FA_CPU_ARM_BF16, 1, 14},
    {FA_CPU_ARM_SME, 1, 23}};

static unsigned long hwcap_word(int word)
{
    const int type = word ? AT_HWCAP2 : AT_HWCAP;
#if defined(__linux__)
    return getauxval((unsigned long)type);
#else
    unsigned long v = 0;
    return elf_aux_info(type, &v, sizeof v) == 0 ? v : 0;
#endif
}

/* this thread's SVE vector length in bytes (threads made later inherit it),
 * 0 where the OS does not say; only asked when the CPU has SVE */
static int sve_vl_bytes(void)
{
#if defined(__linux__)
    const int vl = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
    return vl < 0 ? 0 : (vl & FA_PR_SVE_VL_LEN_MASK);
#else
    return 0;
#endif
}

unsigned long long fa_cpu_features(void)
{
    const unsigned long words[2] = {hwcap_word(0), hwcap_word(1)};
    unsigned long long have = 0, missing = 0;
    for (size_t i = 0; i < sizeof g_hwcap / sizeof g_hwcap[0]; i++) {
        if ((words[g_hwcap[i].word] >> g_hwcap[i].bit) & 1)
            have |= g_hwcap[i].feature;
        else
            missing |= g_hwcap[i].feature;
    }
    have = baseline_features() | (have & ~missing);
    /* the sve tier's code is for one vector length (simd/simd_sve.h) */
    if ((have & FA_CPU_ARM_SVE) && sve_vl_bytes() == 32) have |= FA_CPU_ARM_SVE256;
    return have;
}

int fa_cpu_sve_bytes(void) { return (fa_cpu_features() & FA_CPU_ARM_SVE) ? sve_vl_bytes() : 0; }

#elif defined(__APPLE__)
#include <sys/sysctl.h>

/* The hw.optional.arm.FEAT_* keys exist from macOS 12 on; a key the running
 * release lacks reads as absent.  Apple's cores have no SVE. */
static const struct { unsigned long long feature; const char *key; } g_keys[] = {
    {FA_CPU_ARM_ASIMD, "hw.optional.AdvSIMD"},
    {FA_CPU_ARM_FP16, "hw.optional.arm.FEAT_FP16"},
    {FA_CPU_ARM_DOTPROD, "hw.optional.arm.FEAT_DotProd"},
    {FA_CPU_ARM_BF16, "hw.optional.arm.FEAT_BF16"},
    {FA_CPU_ARM_I8MM, "hw.optional.arm.FEAT_I8MM"},
    {FA_CPU_ARM_SME, "hw.optional.arm.FEAT_SME"}};

unsigned long long fa_cpu_features(void)
{
    unsigned long long have = baseline_features();
    for (size_t i = 0; i < sizeof g_keys / sizeof g_keys[0]; i++) {
        int v = 0;
        size_t len = sizeof v;
        if (sysctlbyname(g_keys[i].key, &v, &len, NULL, 0) == 0 && len == sizeof v && v)
            have |= g_keys[i].feature;
    }
    return have;
}

int fa_cpu_sve_bytes(void) { return 0; }

#elif defined(_WIN32)
#include <windows.h>

unsigned long long fa_cpu_features(void)
{
    unsigned long long have = baseline_features() | FA_CPU_ARM_ASIMD; /* Windows on Arm requires it */
#ifdef PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
    if (IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE)) have |= FA_CPU_ARM_DOTPROD;
#endif
    return have;
}

int fa_cpu_sve_bytes(void) { return 0; }

#else
unsigned long long fa_cpu_features(void) { return baseline_features(); }

int fa_cpu_sve_bytes(void) { return 0; }
#endif

#else
typedef int fa_cpu_aarch64_unused; /* ISO C: a translation unit declares something */
#endif
