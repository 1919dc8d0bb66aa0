/* dispatch.c -- the one place the ISA path is chosen.
 *
 * The paths are the lines of runtime/isa_list.h.  At import,
 * fa_init_dispatch() asks the CPU (cpuid) and the OS (xgetbv: are the AVX /
 * AVX-512 register states saved on context switch?) which features it has
 * (FA_CPU_* below); a path is supported when it has every feature its line
 * requires.  Then it removes anything named in FASTATTN_DISABLE_CPU_FEATURES
 * (a comma list of path names other than the first, e.g. avx2,avx512: to test
 * the fallbacks on a capable machine, as numpy's NPY_DISABLE_CPU_FEATURES;
 * disabling a path also disables every path that requires all it requires),
 * and takes FASTATTN_ISA if set, else the best supported path.  In a test
 * build with FA_AVX512_EMULATED (setup.py, FASTATTN_AVX512_EMULATION=simde)
 * the avx512 kernels run through SIMDe on AVX2, and are offered wherever AVX2
 * is. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall() */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "fastattn.h"
#include "kernels/kernels.h"
#include "runtime/arch.h"

/* CPU and OS features, the `required` bits of isa_list.h. */
enum {
    FA_CPU_AVX = 1u << 0,
    FA_CPU_FMA = 1u << 1,
    FA_CPU_AVX2 = 1u << 2,
    FA_CPU_AVX512F = 1u << 3,
    FA_OS_YMM = 1u << 4, /* XCR0: XMM and YMM state */
    FA_OS_ZMM = 1u << 5, /* XCR0: plus opmask, ZMM_Hi256, Hi16_ZMM */
    FA_CPU_F16C = 1u << 6, /* float16 conversions */
    FA_CPU_AVX512BW = 1u << 7,
    FA_CPU_AVX512BF16 = 1u << 8,
    FA_CPU_AMX_BF16 = 1u << 9, /* AMX-TILE and AMX-BF16 */
    FA_OS_AMX = 1u << 10,      /* XCR0: XTILECFG, XTILEDATA; Linux: permission granted */
    FA_CPU_AMX_FP16 = 1u << 11 /* no tier requires it: the amx tier's float16 tiles */
};

#if FA_ARCH_X86
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
static unsigned long long fa_xgetbv(void)
{
    unsigned lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif
#endif

/* The list, as tables indexed by FA_ISA_<NAME>. */
#define FA_ISA(name, NAME, arch, required) #name,
static const char *const g_names[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA
#define FA_ISA(name, NAME, arch, required) (unsigned)(required),
static const unsigned g_required[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA
#define FA_ISA(name, NAME, arch, required) FA_IF_ARCH_##arch(&fa_kernels_f32_##name),
static const fa_kernels_f32 *const g_f32[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA
#define FA_ISA(name, NAME, arch, required) FA_IF_ARCH_##arch(&fa_kernels_f64_##name),
static const fa_kernels_f64 *const g_f64[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA

static int g_supported[FA_ISA_COUNT] = {1}; /* the first path: portable C */
static unsigned g_features;                 /* detect_features() */
static int g_isa = 0;

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

/* The features of this CPU and OS (FA_CPU_* bits). */
static unsigned detect_features(void)
{
    unsigned have = 0;
#if FA_ARCH_X86
    /* cpuid leaf, subleaf, register (0 eax .. 3 edx), bit: what each feature needs
     * (a feature listed twice needs both bits) */
    static const struct { unsigned feature; unsigned leaf, sub; int reg, bit; } cpuid_bits[] = {
        {FA_CPU_AVX, 1, 0, 2, 28}, {FA_CPU_FMA, 1, 0, 2, 12}, {FA_CPU_F16C, 1, 0, 2, 29},
        {FA_CPU_AVX2, 7, 0, 1, 5}, {FA_CPU_AVX512F, 7, 0, 1, 16},
        {FA_CPU_AVX512BW, 7, 0, 1, 30}, {FA_CPU_AVX512BF16, 7, 1, 0, 5},
        {FA_CPU_AMX_BF16, 7, 0, 3, 22}, {FA_CPU_AMX_BF16, 7, 0, 3, 24},
        {FA_CPU_AMX_FP16, 7, 1, 0, 21}};
    static const struct { unsigned feature; unsigned long long xcr0; } os_bits[] = {
        {FA_OS_YMM, 0x6}, {FA_OS_ZMM, 0xe6}, {FA_OS_AMX, 0x60000}};
    unsigned r0[4], r[4], r1[4];
    fa_cpuid(0, 0, r0);
    unsigned missing = 0;
    for (size_t i = 0; i < sizeof cpuid_bits / sizeof cpuid_bits[0]; i++) {
        if (cpuid_bits[i].leaf > r0[0]) { missing |= cpuid_bits[i].feature; continue; }
        fa_cpuid((int)cpuid_bits[i].leaf, (int)cpuid_bits[i].sub, r);
        if ((r[cpuid_bits[i].reg] >> cpuid_bits[i].bit) & 1)
            have |= cpuid_bits[i].feature;
        else
            missing |= cpuid_bits[i].feature;
    }
    have &= ~missing;
    fa_cpuid(1, 0, r1);
    const int osxsave = (r1[2] >> 27) & 1;
    const unsigned long long xcr0 = osxsave ? fa_xgetbv() : 0;
    for (size_t i = 0; i < sizeof os_bits / sizeof os_bits[0]; i++)
        if ((xcr0 & os_bits[i].xcr0) == os_bits[i].xcr0) have |= os_bits[i].feature;
    if ((have & (FA_CPU_AMX_BF16 | FA_OS_AMX)) == (FA_CPU_AMX_BF16 | FA_OS_AMX) &&
        !amx_permitted())
        have &= ~FA_OS_AMX; /* refused: the next path down */
#endif
    return have;
}

static void detect(void)
{
    const unsigned have = g_features = detect_features();
    for (int i = 1; i < FA_ISA_COUNT; i++)
        g_supported[i] = g_f32[i] != NULL && (have & g_required[i]) == g_required[i];
#ifdef FA_AVX512_EMULATED
    /* test build: the avx512 kernels were compiled for AVX2 through SIMDe */
    g_supported[FA_ISA_AVX512] = g_supported[FA_ISA_AVX2];
#ifdef FA_BF16_EMULATED
    /* and the bfloat16 paths' tiles and dot products by simd/bf16_emulate.h */
    g_supported[FA_ISA_AVX512_BF16] = g_supported[FA_ISA_AMX] = g_supported[FA_ISA_AVX2];
#endif
#endif
}

int fa_avx512_emulated(void)
{
#ifdef FA_AVX512_EMULATED
    return 1;
#else
    return 0;
#endif
}

int fa_cpu_supports(int isa) { return isa >= 0 && isa < FA_ISA_COUNT && g_supported[isa]; }
int fa_get_isa(void) { return g_isa; }
const char *fa_isa_name(int isa) { return (isa >= 0 && isa < FA_ISA_COUNT) ? g_names[isa] : "?"; }

int fa_set_isa(int isa)
{
    if (!fa_cpu_supports(isa)) return FA_EINVAL;
    g_isa = isa;
    return FA_OK;
}

const fa_kernels_f32 *fa_kernels_f32_current(void) { return g_f32[g_isa]; }
const fa_kernels_f64 *fa_kernels_f64_current(void) { return g_f64[g_isa]; }
int fa_amx_fp16(void)
{
#if defined(FA_BF16_EMULATED)
    return g_supported[FA_ISA_AMX]; /* emulated, wherever the tier is */
#else
    return g_supported[FA_ISA_AMX] && (g_features & FA_CPU_AMX_FP16) != 0;
#endif
}
fa_bf16_op_fn fa_bf16_native_op(void)
{
    const int order[2] = {FA_ISA_AMX, FA_ISA_AVX512_BF16};
    for (int i = 0; i < 2; i++)
        if (g_supported[order[i]] && g_f32[order[i]]->native_op16) return g_f32[order[i]]->native_op16;
    return NULL;
}

static int isa_from_name(const char *s, size_t n)
{
    for (int i = 0; i < FA_ISA_COUNT; i++)
        if (strlen(g_names[i]) == n && strncmp(s, g_names[i], n) == 0) return i;
    return -1;
}

/* names[from ..] joined by sep, with `last` before the final one, into buf */
static const char *join_names(char *buf, size_t len, int from, const char *sep, const char *last,
                              const int *only)
{
    size_t used = 0;
    int count = 0, total = 0;
    buf[0] = 0;
    for (int i = from; i < FA_ISA_COUNT; i++) total += !only || only[i];
    for (int i = from; i < FA_ISA_COUNT; i++) {
        if (only && !only[i]) continue;
        const char *s = count == 0 ? "" : (count == total - 1 ? last : sep);
        int w = snprintf(buf + used, len - used, "%s%s", s, g_names[i]);
        if (w < 0 || (size_t)w >= len - used) break;
        used += (size_t)w;
        count++;
    }
    return buf;
}

/* FASTATTN_DISABLE_CPU_FEATURES=dis: unsupport every path it names (and
 * the paths that require all a named one requires). */
static int disable_features(const char *dis, char *msg, size_t msg_len)
{
    const char *p = dis;
    while (*p) {
        size_t n = strcspn(p, ", ");
        if (n) {
            int i = isa_from_name(p, n);
            if (i <= 0) {
                char names[128];
                snprintf(msg, msg_len,
                         "FASTATTN_DISABLE_CPU_FEATURES=%s: unknown feature '%.*s' "
                         "(expected a comma list of %s)", dis, (int)n, p,
                         join_names(names, sizeof names, 1, ", ", ", ", NULL));
                return FA_EINVAL;
            }
            for (int j = 1; j < FA_ISA_COUNT; j++)
                if ((g_required[j] & g_required[i]) == g_required[i]) g_supported[j] = 0;
        }
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    return FA_OK;
}

int fa_init_dispatch(char *msg, size_t msg_len)
{
    detect();
    const char *dis = getenv("FASTATTN_DISABLE_CPU_FEATURES");
    if (dis && disable_features(dis, msg, msg_len) != FA_OK) return FA_EINVAL;
    g_isa = 0;
    for (int i = FA_ISA_COUNT - 1; i >= 0; i--)
        if (g_supported[i]) { g_isa = i; break; }
    const char *want = getenv("FASTATTN_ISA");
    if (want && *want) {
        char names[128];
        int i = isa_from_name(want, strlen(want));
        if (i < 0) {
            snprintf(msg, msg_len, "FASTATTN_ISA=%s: unknown path (expected %s)", want,
                     join_names(names, sizeof names, 0, ", ", " or ", NULL));
            return FA_EINVAL;
        }
        if (!g_supported[i]) {
            snprintf(msg, msg_len, "FASTATTN_ISA=%s: this CPU/OS does not support it "
                     "(supported: %s)", want,
                     join_names(names, sizeof names, 0, ", ", ", ", g_supported));
            return FA_EINVAL;
        }
        g_isa = i;
    }
    return FA_OK;
}
