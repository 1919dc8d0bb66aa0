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


# op: (operand a, b, c) as (dtype, size) -- fastattn.h, fa_bf16_op
_BF16_OPS = {
    "tdpbf16ps": (0, ("u2", 512), ("u2", 512), ("f4", 256)),
    "tdpfp16ps": (1, ("u2", 512), ("u2", 512), ("f4", 256)),
    "vdpbf16ps": (2, ("u2", 32), ("u2", 32), ("f4", 16)),
    "vcvtne2ps2bf16": (3, ("f4", 16), ("f4", 16), ("u2", 32)),
    "vcvtneps2bf16": (4, ("f4", 16), ("f4", 16), ("u2", 16)),
    "tdpbf16ps_bytes": (5, ("u2", 512), ("u2", 512), ("f4", 256)),
    "bfdot": (6, ("u2", 8), ("u2", 8), ("f4", 4)),
    "bfmmla": (7, ("u2", 8), ("u2", 8), ("f4", 4)),
}


def bf16_op(str name, bint native, cnp.ndarray a, cnp.ndarray b, cnp.ndarray c):
    """One instruction of the bfloat16 tiers: c updated in place by the plain-C
    emulation (native False) or by the instruction itself.  Operands are
    C-contiguous arrays of the raw bits (uint16 halves) or float32, of the
    sizes in _BF16_OPS.  Returns False where the instruction is unavailable
    (native only)."""
    op, *specs = _BF16_OPS[name]
    for arr, (kind, size) in zip((a, b, c), specs):
        if (not cnp.PyArray_ISCARRAY(arr) or arr.dtype.str.lstrip("<=") != kind
                or arr.size != size):
            raise TypeError(f"{name}: operands must be C-contiguous {specs}")
    status = _core.bf16_op(op, native, cnp.PyArray_DATA(a), cnp.PyArray_DATA(b),
                           cnp.PyArray_DATA(c))
    if status != 0 and not native:
        raise RuntimeError(f"{name}: emulation failed ({status})")
    return status == 0


def fail_alloc_after(int64_t n_ok):
    """The next n_ok kernel allocations succeed, then they fail (-1 turns the
    hook off)."""
    _core.fail_alloc_after(n_ok)


def cached_bytes():
    """The bytes of freed scratch the kernels keep for their next calls."""
    return _core.cached_bytes()


def release_cached():
    """Every block of that scratch given back to the system."""
    _core.release_cached()


def poison_cached(int byte):
    """Every byte of that scratch set to ``byte`` (0xFF: float NaNs), values
    that no later call may read."""
    _core.poison_cached(byte)
