"""The argument checks and conversions that several public functions share.

Plain Python and NumPy, no kernel: the dtype rules (:func:`kernel_dtypes`),
``num_threads`` (:func:`thread_count`), ``scale`` (:func:`check_scale`),
``out=`` (:func:`check_out`), and the integer and real-array checks of the
multi-head layer and its cache (:func:`positive_int`, :func:`real_array`),
array-likes NumPy cannot make one array of (:func:`as_array`).
Each raises a TypeError or ValueError that names the argument."""

from __future__ import annotations

import math
import numbers
import operator
import os
from typing import Any

import numpy as np

from . import _half

__all__ = ["MAX_THREADS", "as_array", "kernel_dtypes", "thread_count", "check_scale",
           "text_or_bool", "check_out", "overlapping", "positive_int", "real_array",
           "forward_array", "whole_elements", "addressable", "physical_memory"]

_F16, _F32, _F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
_F32_MAX = float(np.finfo(np.float32).max)
# More threads than this are not honoured (the result is the same for any count).
MAX_THREADS = 256


def kernel_dtypes(named) -> tuple[np.dtype, np.dtype]:
    """(kernel dtype, result dtype) for the (name, dtype) pairs of the inputs.

    The kernel dtype is the element type the kernel reads: float32, float64,
    or, when every input has it, float16 or bfloat16 (read in place,
    computed in float32, the result rounded once).  Mixed 16-bit dtypes give
    float32, a 16-bit one with float32 float32, with float64 float64; integer
    and bool inputs alone give float64."""
    for name, dt in named:
        if dt.kind not in "biuf" and not _half.is_bfloat16(dt):
            raise TypeError(f"{name} has unsupported dtype {dt}: fastattn computes in float32 or "
                            f"float64 (float16 and bfloat16 are read in place, integer and "
                            f"bool inputs are converted)")
    dts = [dt for _, dt in named]
    bf = [dt for dt in dts if _half.is_bfloat16(dt)]
    if bf:
        rest = [dt for dt in dts if not _half.is_bfloat16(dt)]
        if not rest:
            return bf[0], bf[0]
        rt = np.result_type(*rest)
        return (_F64, _F64) if rt == _F64 or rt.kind in "biu" else (_F32, _F32)
    rt = np.result_type(*dts)
    if rt.kind in "biu":
        return _F64, _F64
    if rt == _F16:
        return (_F16, _F16) if all(dt == _F16 for dt in dts) else (_F32, _F16)
    if rt == _F32 or rt == _F64:
        return rt, rt
    raise TypeError(f"unsupported dtype {rt} ({', '.join(n for n, _ in named)}): use float16, "
                    f"bfloat16, float32 or float64")


def thread_count(num_threads) -> int:
    """``num_threads`` as the kernels take it: 0 for None (the OpenMP
    default), else an int >= 1, at most :data:`MAX_THREADS`."""
    if num_threads is None:
        return 0
    if type(num_threads) is int and 1 <= num_threads <= MAX_THREADS:
        return num_threads
    if isinstance(num_threads, (bool, np.bool_)):
        raise TypeError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
    try:
        n = operator.index(num_threads)
    except TypeError:
        raise TypeError(f"num_threads must be None or an int >= 1, got {num_threads!r}") from None
    if n < 1:
        raise ValueError(f"num_threads must be None or an int >= 1, got {n}")
    return min(n, MAX_THREADS)


def text_or_bool(x: Any) -> bool:
    """Whether x is a string, bytes or a bool, which ``float()`` would take
    for a number ("1", True) where fastattn's real options refuse them."""
    return isinstance(x, (str, bytes, bool, np.bool_))


def check_scale(scale, cdt: np.dtype) -> float:
    """A given ``scale`` as a float, finite in the compute dtype ``cdt`` (the
    default, 1 / sqrt(E), is computed by the callers: the common case)."""
    if text_or_bool(scale):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__} {scale!r}")
    try:
        sc = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a real number, got {scale!r}") from None
    except OverflowError:  # an int beyond float64
        raise ValueError(f"scale must be finite in {cdt}, got {scale!r}") from None
    if not math.isfinite(sc) or (cdt == _F32 and abs(sc) > _F32_MAX):
        raise ValueError(f"scale must be finite in {cdt}, got {scale!r}")
    return sc


def check_out(out, shape: tuple, dtype: np.dtype, inputs) -> None:
    """``out`` fits a result of ``shape`` and ``dtype``, is writeable and
    overlaps none of the (name, array or None) pairs ``inputs``."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, the result has shape {shape}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, the result has dtype {dtype}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if overlapping(out.shape, out.strides, out.itemsize):
        raise ValueError(f"out's strides {out.strides} (shape {out.shape}) give two elements "
                         f"the same memory (a broadcast view?): give an array whose elements "
                         f"are distinct")
    for name, x in inputs:
        if x is not None and np.may_share_memory(out, x):
            raise ValueError(f"out overlaps {name}: give a separate output array")


def overlapping(shape: tuple, strides: tuple, itemsize: int) -> bool:
    """May two elements of an array of ``shape`` and ``strides`` (in units of
    ``itemsize``) share memory?  False when, axes taken by increasing stride,
    each stride clears the span of the axes before it (every array made by
    allocating, slicing, transposing or reshaping); True for a zero stride
    on an axis of length > 1, as a broadcast view has."""
    span = itemsize
    for st, n in sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1):
        if st < span:
            return 0 not in shape
        span += st * (n - 1)
    return False


def physical_memory() -> int:
    """This machine's memory in bytes (2**62 where the OS does not say): an
    array larger cannot be filled, so it is refused before NumPy is asked
    (whose request for petabytes a sanitizer's allocator aborts on)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def as_array(a: Any, name: str) -> np.ndarray:
    """``np.asarray(a)``; a ValueError naming ``name`` where NumPy cannot make
    one array of ``a`` (a ragged nested sequence)."""
    try:
        return np.asarray(a)
    except ValueError as e:
        raise ValueError(f"{name} cannot be made an array: {e}") from None


def positive_int(value, name: str, *, minimum: int = 1) -> int:
    """An integer ``value`` >= ``minimum`` (bools are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def real_array(a: Any, name: str) -> np.ndarray:
    """``a`` as an array of real numbers: bool, integer, floating or bfloat16."""
    arr = as_array(a, name)
    if arr.dtype.kind in "biu":
        return arr
    if arr.dtype.kind != "f" and not _half.is_bfloat16(arr.dtype):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr


def forward_array(name: str, a: Any, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """``a`` as an array of exactly the forward call's ``shape`` and ``dtype``
    (a backward's ``grad_out``, ``out``, ``lse``), else a ValueError naming it."""
    x = as_array(a, name)
    if x.shape != shape or x.dtype != dtype:
        raise ValueError(f"{name} must have the forward's shape {shape} and dtype {dtype}, "
                         f"got shape {x.shape} and dtype {x.dtype}")
    return addressable(x)


def whole_elements(a: np.ndarray) -> bool:
    """Can the kernels address ``a`` by element strides: aligned, every stride
    a whole number of elements?"""
    return a.flags.aligned and all(st % a.itemsize == 0 for st in a.strides)


def addressable(a: np.ndarray | None) -> np.ndarray | None:
    """``a`` as the kernels address it (whole_elements; a copy of a view that
    is not: a field of a structured array, say)."""
    return a if a is None or whole_elements(a) else np.ascontiguousarray(a)
