"""The parts of a backward call around its kernel, shared by
:func:`fastattn.attention_backward` and
:func:`fastattn.attention_varlen_backward`: the forward's ``lse`` and the
gradient into it checked, and the gradients summed over what the forward
broadcast and rounded once to their inputs' dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from . import _half
from ._api import kernel_operand
from ._validate import as_array

__all__ = ["nonfinite_lse", "check_lse", "grad_lse_operand", "no_empty_features", "drop_features",
           "sum_to", "grad_as", "sinks_grad"]


def nonfinite_lse(lse: np.ndarray) -> np.ndarray:
    """Where lse is NaN or +inf (NaN or Inf among the forward's inputs; -inf
    is a row that sees no key)."""
    return np.isnan(lse) | (lse == np.inf)


def check_lse(lse: np.ndarray) -> None:
    """A ValueError naming lse if it has NaN or +inf entries."""
    bad = nonfinite_lse(lse)
    if bad.any():
        raise ValueError(f"lse of shape {lse.shape} has NaN or +inf entries ({int(bad.sum())}): "
                         f"lse must be finite, or -inf on a row that sees no key")


def grad_lse_operand(grad_lse: Any, shape: tuple, adt: np.dtype) -> np.ndarray:
    """``grad_lse`` checked against lse's shape, in the arithmetic dtype."""
    g = as_array(grad_lse, "grad_lse")
    if g.shape != shape:
        raise ValueError(f"grad_lse must have lse's shape {shape}, got {g.shape}")
    if g.dtype.kind != "f" and not _half.is_half(g.dtype):
        raise TypeError(f"grad_lse must be floating point, got dtype {g.dtype}")
    return kernel_operand(g, adt)


def sum_to(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """``grad`` summed over the axes broadcasting added or stretched from
    ``shape`` (autograd's rule); an array even where ``shape`` is ``()``
    (NumPy's sum over every axis gives a scalar)."""
    lead = grad.ndim - len(shape)
    if lead and all(n == 1 for n in grad.shape[:lead]):
        grad = grad.reshape(grad.shape[lead:])  # nothing to add up: no copy
    elif lead:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return np.asarray(grad.sum(axis=axes, keepdims=True) if axes else grad)


def grad_as(grad: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A gradient in its input's dtype (float64 for integer inputs), rounded once."""
    dt = like.dtype
    if grad.dtype == dt and _half.is_half(dt):  # the kernel rounded it already
        return grad
    if _half.is_half(dt) and grad.dtype == np.float32 and grad.flags.c_contiguous:
        out = np.empty(grad.shape, dt)  # the kernels' vector rounding, not a ufunc loop
        _core.round_half(grad, out)
        return out
    return grad.astype(dt if dt.kind == "f" else np.float64, copy=False)


def no_empty_features(arrays: tuple, rows: int, keys: int) -> tuple:
    """The backward's (q, k, v, out, grad_out) with one zero feature in place
    of an empty feature axis (E or Ev = 0) when there are rows and keys: the
    kernels need one, and a zero feature leaves the scores, D and the other
    gradients as they are (the callers drop its gradient column)."""
    if rows == 0 or keys == 0:
        return arrays
    return tuple(np.zeros(x.shape[:-1] + (1,), x.dtype) if x.shape[-1] == 0 else x
                 for x in arrays)


def drop_features(grad: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``grad`` without the column no_empty_features added where ``like``
    has no features."""
    return grad if grad.shape[-1] == like.shape[-1] else grad[..., :like.shape[-1]]


def sinks_grad(grad: np.ndarray, sinks: Any) -> np.ndarray:
    """The sinks' gradient (float64, per batch index) summed to their shape,
    in their dtype when it is a float one (bfloat16 included), else float64."""
    s = as_array(sinks, "sinks")
    dt = s.dtype if s.dtype.kind == "f" or _half.is_bfloat16(s.dtype) else np.dtype(np.float64)
    return sum_to(grad, s.shape).astype(dt)
