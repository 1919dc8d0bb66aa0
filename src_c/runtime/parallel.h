/* omp_shim.h -- OpenMP behind one #ifdef, so a compiler without OpenMP still
 * builds a serial extension (setup.py warns when it does). */
#ifndef FASTATTN_OMP_SHIM_H
#define FASTATTN_OMP_SHIM_H
#ifdef _OPENMP
#include <omp.h>
#define FA_OMP_THREAD_NUM() omp_get_thread_num()
#define FA_OMP_MAX_THREADS() omp_get_max_threads()
#else
#define FA_OMP_THREAD_NUM() 0
#define FA_OMP_MAX_THREADS() 1
#endif
#endif
