/* cpu_none.c -- fa_cpu_features() (runtime/cpu.h) on a target without its
 * own runtime/cpu_<arch>.c: no features, so only the ISAs of arch `any`
 * (portable C) are ever chosen.  Compiles to nothing on the targets that
 * have one. */
#include "runtime/arch.h"

#if FA_ARCH_NONE

#include "runtime/cpu.h"

unsigned long long fa_cpu_features(void) { return 0; }

#else
typedef int fa_cpu_none_unused; /* ISO C: a translation unit declares something */
#endif
