# The C-level interface of fastattn._core for other Cython modules (cimport).
#
# Not visible from Python: these functions are reached only through
# ``from fastattn._core cimport ...``, which calls _core's own copy of the C
# library -- the allocation-failure hook is a global of that copy, so a
# module that linked src_c/ again would set a different one.  Used by
# fastattn/_testing.pyx.

from libc.stdint cimport int64_t

# exp(x) (base2: 2**x) of n elements, float64 if double_precision else
# float32, by the vectorised exp of the ISA in use; raises on a kernel error.
cdef int exp_kernel(bint double_precision, bint base2, int64_t n, const void *x,
                    void *y) except -1
# tanh(x) of n elements, likewise, by the vectorised tanh of the softcap kernel.
cdef int tanh_kernel(bint double_precision, int64_t n, const void *x, void *y) except -1
# One instruction of the bfloat16 tiers on small arrays (fastattn.h: fa_bf16_op):
# its plain-C emulation, or (native) the instruction; the C status (0: done).
cdef int bf16_op(int op, bint native, const void *a, const void *b, void *c) noexcept
# The next n_ok kernel allocations succeed, then they fail (-1: hook off).
cdef void fail_alloc_after(int64_t n_ok) noexcept
# The bytes of freed scratch the kernels keep for later calls; all of it freed.
cdef int64_t cached_bytes() noexcept
cdef void release_cached() noexcept
# Every cached block's bytes set to byte (stale values no call may read).
cdef void poison_cached(int byte) noexcept
