"""The 16-bit storage dtypes: float16 and bfloat16 (``ml_dtypes.bfloat16``).

Arrays of these dtypes are read by the kernels in place and computed in
float32; the result is rounded once.  ``ml_dtypes`` (a dependency) is
imported only when a bfloat16 is asked for by name: an array that already
has the dtype is recognised without it."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["F16", "is_half", "is_bfloat16", "arith", "bfloat16", "as_storage_dtype"]

F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


_bf16_seen: list = []  # the bfloat16 dtype object once met: dtype.name costs ~1.8 µs a call


def is_bfloat16(dt: np.dtype) -> bool:
    """Whether dt is ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    if _bf16_seen and dt is _bf16_seen[0]:
        return True
    if dt.kind != "V" or dt.itemsize != 2 or dt.name != "bfloat16":
        return False
    _bf16_seen[:] = [dt]
    return True


def is_half(dt: np.dtype) -> bool:
    """Whether dt is a 16-bit storage dtype (float16 or bfloat16)."""
    return dt == F16 or is_bfloat16(dt)


def arith(dt: np.dtype) -> np.dtype:
    """The arithmetic dtype of kernel dtype dt: float32 for the 16-bit ones."""
    return _F32 if dt.itemsize == 2 else dt


def bfloat16() -> np.dtype:
    """The bfloat16 dtype; ImportError naming ml_dtypes if it is missing."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("bfloat16 needs the package ml_dtypes (pip install ml_dtypes), a "
                          "dependency of fastattn that is not installed") from None
    return np.dtype(ml_dtypes.bfloat16)


def as_storage_dtype(dtype: Any) -> np.dtype:
    """np.dtype(dtype), "bfloat16" (the string or the type) included."""
    if isinstance(dtype, str) and dtype.strip().lower() == "bfloat16":
        return bfloat16()
    return np.dtype(dtype)
