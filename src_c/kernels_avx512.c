/* kernels_avx512.c -- the avx512 micro-kernels (see kernels.h for the contract).
 * setup.py compiles this file alone with the flags for avx512. */
#define FA_ISA_AVX512 1
#include "kernels_impl.h"
