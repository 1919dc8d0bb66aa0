/* kernels_generic.c -- the generic micro-kernels (see kernels.h for the contract).
 * setup.py compiles this file alone with the flags for generic. */
#define FA_ISA_GENERIC 1
#include "kernels_impl.h"
