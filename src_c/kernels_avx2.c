/* kernels_avx2.c -- the avx2 micro-kernels (see kernels.h for the contract).
 * setup.py compiles this file alone with the flags for avx2. */
#define FA_ISA_AVX2 1
#include "kernels_impl.h"
