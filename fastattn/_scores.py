"""The score options of :func:`fastattn.attention`, checked in one place.

``softcap``, ``alibi_slopes`` and ``sinks`` (the semantics are in the
docstring of :mod:`fastattn.reference`, which uses the same validators):
:func:`check_softcap` and :func:`per_head` check them as the reference does,
and :func:`resolve` turns them into what the kernel takes -- the cap as a
float (0 for none) and the slopes and sinks as float64 arrays of shape
``batch + (1, 1)`` (one value per batch index, broadcast, never copied per
row), after rounding them to the compute dtype as the reference does.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from . import _half
from ._validate import as_array

__all__ = ["ScoreOptions", "check_softcap", "per_head", "resolve"]


class ScoreOptions(NamedTuple):
    softcap: float                 # 0.0: none
    alibi: np.ndarray | None       # float64, batch + (1, 1)
    sinks: np.ndarray | None       # float64, batch + (1, 1)


def check_softcap(softcap: Any, cdt: Any = None) -> float | None:
    """``softcap`` as a float: None, or a finite real ``> 0`` whose
    reciprocal is finite (the kernels scale the scores by it: an infinite
    one would make a score of 0 NaN); with the arithmetic's dtype ``cdt``,
    all of that once rounded to it (the kernels read a cap of 0 as none)."""
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive float or None, "
                        f"got {type(softcap).__name__} {softcap!r}")
    try:
        c = float(softcap)
    except OverflowError:  # an int beyond float64
        c = math.inf
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"softcap must be finite and > 0, got {softcap!r}")
    if c < 1 / float(np.finfo(np.float64).max):
        raise ValueError(f"softcap must be >= 1/DBL_MAX (5.6e-309): its reciprocal scales the "
                         f"scores, got {softcap!r}")
    if cdt is not None and np.dtype(cdt) == np.float32:
        c32 = np.float32(c) if c <= float(np.finfo(np.float32).max) else np.float32(np.inf)
        if not (math.isfinite(c32) and c32 > 0):
            raise ValueError(f"softcap must be finite and > 0 in float32, the arithmetic's "
                             f"dtype, got {softcap!r}")
        with np.errstate(over="ignore"):
            if not math.isfinite(np.float32(1) / c32):
                raise ValueError(f"softcap must be >= 1/FLT_MAX (2.9e-39) in float32, the "
                                 f"arithmetic's dtype: its reciprocal scales the scores, "
                                 f"got {softcap!r}")
    return c


def per_head(name: str, values: Any, heads_shape: tuple, dtype: Any, *,
             neg_inf_ok: bool = False, in_range: bool = False,
             contiguous: bool = False) -> np.ndarray | None:
    """``values`` (slopes or sinks) checked and broadcast to ``heads_shape``
    (the batch shape, heads last) in ``dtype``; None stays None.

    ``in_range``: values that the rounding to ``dtype`` makes infinite are
    refused as the raw values would be (the kernels' rule; the reference
    computes with the rounded values).  ``contiguous``: a C-ordered array
    instead of a broadcast view (the int8 decoding kernel's layout)."""
    if values is None:
        return None
    a = as_array(values, name)
    if _half.is_bfloat16(a.dtype):  # a bfloat16 model's parameter: exact in float32
        a = a.astype(np.float32)
    if a.dtype == bool or a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real array, got dtype {a.dtype}")
    if len(heads_shape) == 0:
        raise ValueError(f"{name} needs a head axis: the inputs have no batch "
                         f"dimensions (..., H), {name} has shape {a.shape}")
    try:
        fits = np.broadcast_shapes(a.shape, heads_shape) == tuple(heads_shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {a.shape} is not broadcastable to "
                         f"(..., H) = {tuple(heads_shape)}")
    a64 = a.astype(np.float64)
    bad = np.isnan(a64) | (a64 == np.inf) if neg_inf_ok else ~np.isfinite(a64)
    if bad.any():
        what = "NaN or +inf" if neg_inf_ok else "non-finite"
        raise ValueError(f"{name} of shape {a.shape} has {what} entries: {a[bad][:4]}")
    small = _rounded(name, a, np.dtype(dtype), neg_inf_ok) if in_range else a.astype(dtype)
    full = np.broadcast_to(small, tuple(heads_shape))
    return np.ascontiguousarray(full) if contiguous else full


def _rounded(name: str, a: np.ndarray, dtype: np.dtype, neg_inf_ok: bool) -> np.ndarray:
    """a (checked) rounded to dtype, refused if the rounding made it infinite."""
    with np.errstate(over="ignore"):
        small = a.astype(dtype)
    bad = (small == np.inf) if neg_inf_ok else ~np.isfinite(small)
    if bad.any():
        raise ValueError(f"{name} has entries beyond the range of {dtype}: {a[bad][:4]}")
    return small


def _as_operand(a: np.ndarray | None) -> np.ndarray | None:
    """a (batch shape) as the kernel's float64 operand of shape batch + (1, 1)."""
    return None if a is None else a.astype(np.float64)[..., None, None]


def resolve(alibi_slopes: Any, softcap: Any, sinks: Any, batch: tuple,
            cdt: np.dtype) -> ScoreOptions:
    """The score options of one call, checked, as the kernel takes them."""
    cap = check_softcap(softcap, cdt)
    slopes = per_head("alibi_slopes", alibi_slopes, batch, cdt, in_range=True)
    sink = per_head("sinks", sinks, batch, cdt, neg_inf_ok=True, in_range=True)
    return ScoreOptions(0.0 if cap is None else cap, _as_operand(slopes), _as_operand(sink))
