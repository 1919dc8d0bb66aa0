/* x86.h -- what the x86 mappings (simd_avx2.h, simd_avx512.h) share: the
 * naming of their intrinsics, and the 256-bit horizontal reductions (the
 * AVX-512 ones halve to 256 bits first).  Included after <immintrin.h>. */
#ifndef FASTATTN_X86_H
#define FASTATTN_X86_H

#include "runtime/util.h"

/* In a mapping's per-type pass (FA_SFX f32 or f64; FA_MM the intrinsics'
 * prefix _mm256 or _mm512, FA_MMSI their integer vector si256 or si512):
 *   MM(add)     -> _mm256_add_ps, _mm512_add_pd, ...
 *   MM_INT(add) -> _mm256_add_epi32 (f32), _mm512_add_epi64 (f64)
 *   MM_TO_INT   -> _mm256_castps_si256 ...; MM_FROM_INT: the reverse
 *   MM_SI(and)  -> _mm256_and_si256, _mm512_and_si512 (bitwise, integer) */
#define FA_PS_f32 ps
#define FA_PS_f64 pd
#define FA_EPI_f32 epi32
#define FA_EPI_f64 epi64
#define FA_MANT_f32 23 /* mantissa bits */
#define FA_MANT_f64 52
#define MM(op) FA_CAT(FA_CAT(FA_MM, op), FA_PASTE(FA_PS_, FA_SFX))
#define MM_INT(op) FA_CAT(FA_CAT(FA_MM, op), FA_PASTE(FA_EPI_, FA_SFX))
#define MM_TO_INT FA_CAT(FA_CAT(FA_MM, FA_PASTE(cast, FA_PASTE(FA_PS_, FA_SFX))), FA_MMSI)
#define MM_FROM_INT MM(FA_PASTE(cast, FA_MMSI))
#define MM_SI(op) FA_CAT3(FA_MM, op, FA_MMSI)
#define FA_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* The lanes of a 256-bit vector reduced by max or add: fa_hmax256_ps,
 * fa_hmax256_pd, fa_hsum256_ps, fa_hsum256_pd. */
#define FA_HOP max
#define FA_HNAME hmax
#include "simd/x86_hreduce_tmpl.h"
#undef FA_HOP
#undef FA_HNAME
#define FA_HOP add
#define FA_HNAME hsum
#include "simd/x86_hreduce_tmpl.h"
#undef FA_HOP
#undef FA_HNAME

#endif
