"""CPU tensors as NumPy views and back (never copies), and the encoding of
options that fastattn.torch's custom operators share.  Imported only by the
fastattn.torch modules (it needs torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._api import attention as _attention

Tensor = torch.Tensor
BF16 = torch.bfloat16
from_numpy = torch.from_numpy
CAUSAL = {False: "none", True: "upper_left", "upper_left": "upper_left",
          "lower_right": "lower_right"}


def not_cpu(name: str, t: Tensor):
    raise ValueError(f"{name} is a {t.device.type} tensor: fastattn.torch computes on the CPU "
                     f"and needs CPU tensors (on other devices use "
                     f"torch.nn.functional.scaled_dot_product_attention)")


def array_view(t: Any, name: str) -> Any:
    """The NumPy view of CPU tensor ``t`` (non-tensors are returned as they are,
    for fastattn's own checks)."""
    if not isinstance(t, Tensor):
        return t
    if not t.is_cpu:
        not_cpu(name, t)
    if t.dtype is BF16:
        return _bf16_view(t, name)
    return t.numpy() if not t.requires_grad else t.detach().numpy()


_bf16 = None  # ml_dtypes.bfloat16 once a bfloat16 tensor was seen and fastattn takes it


def _bf16_view(t: Tensor, name: str) -> np.ndarray:
    """A bfloat16 tensor as an ``ml_dtypes.bfloat16`` array (the same memory)."""
    return t.detach().view(torch.int16).numpy().view(bfloat16_dtype(name))


def bfloat16_dtype(name: str) -> np.dtype:
    """ml_dtypes.bfloat16 if this fastattn computes with it, else a TypeError
    naming the argument ``name``; looked up once."""
    global _bf16
    if _bf16 is not None:
        return _bf16
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"{name} is a bfloat16 tensor: reading it needs the ml_dtypes package "
                        f"(pip install ml_dtypes), or convert it with .float()") from None
    x = np.zeros((1, 1), dtype=ml_dtypes.bfloat16)
    try:
        _attention(x, x, x)
    except TypeError:
        raise TypeError(f"{name} is a bfloat16 tensor, which this fastattn build does not "
                        f"accept: convert it with .float() (or use float16)") from None
    _bf16 = np.dtype(ml_dtypes.bfloat16)
    return _bf16


def tensor_view(a: np.ndarray) -> Tensor:
    """The torch tensor over array ``a`` (no copy)."""
    if a.dtype.kind == "V":  # ml_dtypes.bfloat16
        return from_numpy(a.view(np.int16)).view(BF16)
    return from_numpy(a)


def subclassed(tensors) -> bool:
    """Is one of ``tensors`` an instance of a Tensor subclass (a fake tensor
    while tracing, a parameter, ...): then the call goes through the
    dispatcher, as the custom operator."""
    return any(t is not None and type(t) is not Tensor and isinstance(t, Tensor)
               for t in tensors)


def require_tensors(named: dict[str, Any], numpy_function: str) -> None:
    """The TypeError for an argument of ``named`` that is not a tensor
    (``numpy_function``: fastattn's function for NumPy arrays)."""
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} "
                            f"(for NumPy arrays use {numpy_function})")


def constants(named: dict[str, Any]) -> None:
    """The error for a mask or slopes that require grad (no gradient reaches them)."""
    for name, t in named.items():
        if getattr(t, "requires_grad", False):
            raise ValueError(f"{name} requires grad, but fastattn.torch computes gradients "
                             f"only for query, key, value and sinks: pass {name}.detach(), "
                             f"or use torch.nn.functional.scaled_dot_product_attention with "
                             f"the bias as attn_mask")


def no_dropout(dropout_p) -> None:
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p!r}: fastattn.torch has no dropout; use "
                         f"dropout_p=0, or torch.nn.functional.scaled_dot_product_attention "
                         f"for attention dropout")


def causal_code(is_causal) -> str:
    """``is_causal`` as the operators' string: 'none', 'upper_left' or 'lower_right'."""
    if not (is_causal is True or is_causal is False or is_causal in ("upper_left", "lower_right")):
        raise ValueError(f"is_causal must be a bool, 'upper_left' or 'lower_right', "
                         f"got {is_causal!r}")
    return CAUSAL[is_causal]


def causal_of(causal: str):
    """The operators' string back as ``is_causal``."""
    return False if causal == "none" else causal


def window_pair(window) -> tuple[int, int]:
    """``window`` as (left, right), -1 = unbounded (the operators' encoding)."""
    if window is None:
        return -1, -1
    pair = (window, window) if not isinstance(window, (tuple, list)) else tuple(window)
    if len(pair) != 2:
        raise ValueError(f"window must be an int or a (left, right) pair, got {window!r}")
    res = []
    for side in pair:
        if side is None:
            res.append(-1)
        elif isinstance(side, bool) or not isinstance(side, int) or side < 0:
            raise ValueError(f"window sides must be ints >= 0 or None, got {window!r}")
        else:
            res.append(side)
    return res[0], res[1]


def window_of(wl: int, wr: int):
    """The operators' (left, right) encoding back as ``window``."""
    return None if wl < 0 and wr < 0 else (None if wl < 0 else wl, None if wr < 0 else wr)


def option_tensor(x, like: Tensor) -> Tensor | None:
    """Slopes or sinks given as a sequence, as a float64 tensor (operators take
    tensors)."""
    if x is None or isinstance(x, Tensor):
        return x
    return torch.tensor(x, dtype=torch.float64, device=like.device)


def optional_float(x) -> float | None:
    return None if x is None else float(x)


def fill_out(out, res: Tensor) -> Tensor:
    """``res`` copied into ``out`` (``out=`` on the operators' path, where the
    result is computed first): ``out`` of another type, shape or dtype is
    refused, as :func:`fastattn.attention` refuses it, with nothing written."""
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(res.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the result has shape "
                         f"{tuple(res.shape)}")
    if out.dtype != res.dtype:
        raise TypeError(f"out has dtype {out.dtype}, the result has dtype {res.dtype}")
    out.copy_(res)
    return out


def grad_tensors(grads, query: Tensor, sinks) -> tuple:
    """A NumPy backward's (dq, dk, dv[, d_sinks]) as the backward operators'
    four tensors (an empty tensor where there are no sinks)."""
    d_sinks = from_numpy(grads[3]) if sinks is not None else query.new_empty(0)
    return tensor_view(grads[0]), tensor_view(grads[1]), tensor_view(grads[2]), d_sinks


def fake_grads(query: Tensor, key: Tensor, value: Tensor, sinks) -> tuple:
    """The backward operators' fake results: grad_tensors' shapes and dtypes."""
    if sinks is None:
        d_sinks = query.new_empty(0)
    else:
        d_sinks = sinks.new_empty(sinks.shape, dtype=sinks.dtype if sinks.is_floating_point()
                                  else torch.float64)
    return (query.new_empty(query.shape), key.new_empty(key.shape),
            value.new_empty(value.shape), d_sinks)
