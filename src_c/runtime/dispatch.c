/* dispatch.c -- the one place the ISA path is chosen.
 *
 * At import, fa_init_dispatch() asks the CPU (cpuid) and the OS (xgetbv: are
 * the AVX / AVX-512 register states saved on context switch?) what can run,
 * removes anything named in FASTATTN_DISABLE_CPU_FEATURES (comma list of
 * avx2, avx512: to test the fallbacks on a capable machine, as numpy's
 * NPY_DISABLE_CPU_FEATURES), then takes FASTATTN_ISA (generic, avx2,
 * avx512) if set, else the best available path.  In a test build with
 * FA_AVX512_EMULATED (setup.py, FASTATTN_AVX512_EMULATION=simde) the avx512
 * kernels run through SIMDe on AVX2, and are offered wherever AVX2 is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastattn.h"
#include "kernels.h"

#if (defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)) && \
    !defined(FA_NO_X86_KERNELS)
#define FA_X86 1
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

static int g_supported[FA_ISA_COUNT] = {1, 0, 0};
static int g_isa = FA_ISA_GENERIC;
static const char *g_names[FA_ISA_COUNT] = {"generic", "avx2", "avx512"};

static void detect(void)
{
#ifdef FA_X86
    unsigned r1[4], r7[4] = {0, 0, 0, 0}, r0[4];
    fa_cpuid(0, 0, r0);
    fa_cpuid(1, 0, r1);
    if (r0[0] >= 7) fa_cpuid(7, 0, r7);
    int osxsave = (r1[2] >> 27) & 1;
    unsigned long long xcr0 = osxsave ? fa_xgetbv() : 0;
    int avx_os = (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    int avx512_os = (xcr0 & 0xe6) == 0xe6;       /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    int avx = (r1[2] >> 28) & 1, fma = (r1[2] >> 12) & 1;
    int avx2 = (r7[1] >> 5) & 1, avx512f = (r7[1] >> 16) & 1;
    g_supported[FA_ISA_AVX2] = avx_os && avx && fma && avx2;
    g_supported[FA_ISA_AVX512] = g_supported[FA_ISA_AVX2] && avx512_os && avx512f;
#ifdef FA_AVX512_EMULATED
    /* test build: the avx512 kernels were compiled for AVX2 through SIMDe */
    g_supported[FA_ISA_AVX512] = g_supported[FA_ISA_AVX2];
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

const fa_kernels_f32 *fa_kernels_f32_current(void)
{
#ifdef FA_X86
    if (g_isa == FA_ISA_AVX512) return &fa_kernels_f32_avx512;
    if (g_isa == FA_ISA_AVX2) return &fa_kernels_f32_avx2;
#endif
    return &fa_kernels_f32_generic;
}

const fa_kernels_f64 *fa_kernels_f64_current(void)
{
#ifdef FA_X86
    if (g_isa == FA_ISA_AVX512) return &fa_kernels_f64_avx512;
    if (g_isa == FA_ISA_AVX2) return &fa_kernels_f64_avx2;
#endif
    return &fa_kernels_f64_generic;
}

static int isa_from_name(const char *s, size_t n)
{
    for (int i = 0; i < FA_ISA_COUNT; i++)
        if (strlen(g_names[i]) == n && strncmp(s, g_names[i], n) == 0) return i;
    return -1;
}

int fa_init_dispatch(char *msg, size_t msg_len)
{
    detect();
    const char *dis = getenv("FASTATTN_DISABLE_CPU_FEATURES");
    if (dis) {
        const char *p = dis;
        while (*p) {
            size_t n = strcspn(p, ", ");
            if (n) {
                int i = isa_from_name(p, n);
                if (i <= 0) {
                    snprintf(msg, msg_len,
                             "FASTATTN_DISABLE_CPU_FEATURES=%s: unknown feature '%.*s' "
                             "(expected a comma list of avx2, avx512)", dis, (int)n, p);
                    return FA_EINVAL;
                }
                g_supported[i] = 0;
                if (i == FA_ISA_AVX2) g_supported[FA_ISA_AVX512] = 0;
            }
            p += n;
            while (*p == ',' || *p == ' ') p++;
        }
    }
    g_isa = FA_ISA_GENERIC;
    for (int i = FA_ISA_COUNT - 1; i >= 0; i--)
        if (g_supported[i]) { g_isa = i; break; }
    const char *want = getenv("FASTATTN_ISA");
    if (want && *want) {
        int i = isa_from_name(want, strlen(want));
        if (i < 0) {
            snprintf(msg, msg_len, "FASTATTN_ISA=%s: unknown path (expected generic, avx2 or avx512)",
                     want);
            return FA_EINVAL;
        }
        if (!g_supported[i]) {
            snprintf(msg, msg_len, "FASTATTN_ISA=%s: this CPU/OS does not support it "
                     "(supported: generic%s%s)", want, g_supported[1] ? ", avx2" : "",
                     g_supported[2] ? ", avx512" : "");
            return FA_EINVAL;
        }
        g_isa = i;
    }
    return FA_OK;
}
