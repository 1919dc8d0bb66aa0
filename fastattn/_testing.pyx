# cython: language_level=3, boundscheck=False, wraparound=False
"""Test hooks into the C kernels of fastattn._core; not part of the API.

The C functions are reached through ``_core``'s C-level interface
(``fastattn/_core.pxd``), so they act on the very library ``fastattn._core``
runs: the allocation-failure hook is a global of that library."""

cimport numpy as cnp
from libc.stdint cimport int64_t

from fastattn cimport _core

cnp.import_array()


def exp(cnp.ndarray x, bint base2):
    """exp(x) (base2: 2**x) of a 1-D C-contiguous float32/float64 array, by
    the vectorised exp of the ISA in use (the one the kernels use), as a new
    array: for the accuracy tests."""
    if (x.ndim != 1 or not cnp.PyArray_ISCARRAY_RO(x) or not x.dtype.isnative
            or x.dtype.kind != "f" or x.dtype.itemsize not in (4, 8)):
        raise TypeError("x must be a 1-D C-contiguous, aligned float32 or float64 array in "
                        f"native byte order, got {x.dtype.str} with {x.ndim} dimension(s)")
    cdef cnp.ndarray y = cnp.PyArray_EMPTY(1, x.shape, cnp.PyArray_TYPE(x), 0)
    _core.exp_kernel(x.dtype.itemsize == 8, base2, x.shape[0], cnp.PyArray_DATA(x),
                     cnp.PyArray_DATA(y))
    return y


def tanh(cnp.ndarray x):
    """tanh(x) of a 1-D C-contiguous float32/float64 array, by the vectorised
    tanh of the ISA in use (the softcap kernel's), as a new array: for the
    accuracy tests."""
    if (x.ndim != 1 or not cnp.PyArray_ISCARRAY_RO(x) or not x.dtype.isnative
            or x.dtype.kind != "f" or x.dtype.itemsize not in (4, 8)):
        raise TypeError("x must be a 1-D C-contiguous, aligned float32 or float64 array in "
                        f"native byte order, got {x.dtype.str} with {x.ndim} dimension(s)")
    cdef cnp.ndarray y = cnp.PyArray_EMPTY(1, x.shape, cnp.PyArray_TYPE(x), 0)
    _core.tanh_kernel(x.dtype.itemsize == 8, x.shape[0], cnp.PyArray_DATA(x),
                      cnp.PyArray_DATA(y))
    return y


def fail_alloc_after(int64_t n_ok):
    """The next n_ok kernel allocations succeed, then they fail (-1 turns the
    hook off)."""
    _core.fail_alloc_after(n_ok)
