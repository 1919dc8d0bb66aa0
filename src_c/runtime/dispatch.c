/* dispatch.c -- the one place the ISA path is chosen.
 *
 * The paths are the lines of runtime/isa_list.h.  At import,
 * fa_init_dispatch() asks runtime/cpu.h which features this CPU and OS have
 * (the FA_CPU_* / FA_OS_* bits of the target's architecture); a path is
 * supported when it is built for this target and has every feature its line
 * requires.  Then it removes anything named in FASTATTN_DISABLE_CPU_FEATURES
 * (a comma list of path names other than the first, e.g. avx2,avx512: to test
 * the fallbacks on a capable machine, as numpy's NPY_DISABLE_CPU_FEATURES;
 * disabling a path also disables every path that requires all it requires),
 * and takes FASTATTN_ISA if set, else the best supported path.  In a test
 * build with FA_AVX512_EMULATED (setup.py, FASTATTN_AVX512_EMULATION=simde)
 * the avx512 kernels run through SIMDe on AVX2, and are offered wherever AVX2
 * is; with FA_NEON_EMULATED (FASTATTN_NEON_EMULATION=simde) the aarch64
 * paths are compiled for x86-64 through SIMDe and offered wherever AVX2 is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastattn.h"
#include "kernels/kernels.h"
#include "runtime/arch.h"
#include "runtime/cpu.h"

/* The list, as tables indexed by FA_ISA_<NAME>. */
#define FA_ISA(name, NAME, arch, required) #name,
static const char *const g_names[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA
/* each line's architecture, by name: fa_flash16_current borrows within one */
#define FA_ISA(name, NAME, arch, required) #arch,
static const char *const g_arch[FA_ISA_COUNT] = {
#include "runtime/isa_list.h"
};
#undef FA_ISA
#define FA_ISA(name, NAME, arch, required) (unsigned long long)(required),
static const unsigned long long g_required[FA_ISA_COUNT] = {
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
static unsigned long long g_features;       /* fa_cpu_features() */
static int g_isa = 0;

static void detect(void)
{
    const unsigned long long have = g_features = fa_cpu_features();
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
#ifdef FA_NEON_EMULATED
    /* test build: the neon kernels were compiled for AVX2 + FMA through SIMDe */
    g_supported[FA_ISA_NEON] = g_supported[FA_ISA_AVX2];
    /* and neon_bf16's BFDOT by simd/bf16_emulate_arm.h */
    g_supported[FA_ISA_NEON_BF16] = g_supported[FA_ISA_AVX2];
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

int fa_neon_emulated(void)
{
#ifdef FA_NEON_EMULATED
    return 1;
#else
    return 0;
#endif
}

int fa_isa_built(int isa) { return isa >= 0 && isa < FA_ISA_COUNT && g_f32[isa] != NULL; }
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
const fa_flash16_kernels *fa_flash16_current(void)
{
    /* the same architecture only: the emulation builds offer x86 and aarch64
     * lines side by side, and a neon line must not run avx512_bf16's kernels */
    for (int i = g_isa; i > 0; i--)
        if (g_supported[i] && g_f32[i]->flash16.pack_kv && strcmp(g_arch[i], g_arch[g_isa]) == 0)
            return &g_f32[i]->flash16;
    return &g_f32[g_isa]->flash16;
}
const fa_kernels_f64 *fa_kernels_f64_current(void) { return g_f64[g_isa]; }
int fa_amx_fp16(void)
{
#if defined(FA_BF16_EMULATED)
    return g_supported[FA_ISA_AMX]; /* emulated, wherever the tier is */
#else
    return g_supported[FA_ISA_AMX] && (g_features & FA_CPU_X86_AMX_FP16) != 0;
#endif
}
fa_bf16_op_fn fa_bf16_native_op(void)
{
    const int order[3] = {FA_ISA_AMX, FA_ISA_AVX512_BF16, FA_ISA_NEON_BF16};
    for (int i = 0; i < 3; i++)
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
            snprintf(msg, msg_len, "FASTATTN_ISA=%s: %s (supported: %s)", want,
                     fa_isa_built(i) ? "this CPU/OS does not support it"
                                     : "not built for this architecture",
                     join_names(names, sizeof names, 0, ", ", ", ", g_supported));
            return FA_EINVAL;
        }
        g_isa = i;
    }
    return FA_OK;
}
