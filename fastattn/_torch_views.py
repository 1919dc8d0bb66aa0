"""CPU tensors as NumPy views and back (never copies), and the encoding of
options that fastattn.torch's custom operators share.  Imported only by the
fastattn.torch modules (it needs torch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ._api import attention as _attention
from ._masks import UNBOUNDED, causal_offset, check_window
from ._scores import check_softcap
from ._validate import overlapping, text_or_bool, thread_count

Tensor = torch.Tensor
BF16 = torch.bfloat16
from_numpy = torch.from_numpy


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
    try:
        return t.numpy() if not t.requires_grad else t.detach().numpy()
    except TypeError:  # float8, complex32, ...: no NumPy dtype
        raise TypeError(f"{name} has dtype {t.dtype}, which fastattn cannot read") from None


FLOATS = frozenset({torch.float32, torch.float64, torch.float16, BF16})


def float_tensors(named: dict[str, Any]) -> None:
    """The TypeError for a tensor among ``named`` (query, key, value) whose
    dtype is not float32, float64, float16 or bfloat16: torch's SDPA refuses
    the others too, and the operators' fake implementations assume them."""
    for name, t in named.items():
        if isinstance(t, Tensor) and t.dtype not in FLOATS:
            raise TypeError(f"{name} has dtype {t.dtype}: fastattn.torch takes float32, "
                            f"float64, float16 or bfloat16 tensors")


def cpu_tensors(named: dict[str, Any]) -> None:
    """The error for a tensor among ``named`` not on the CPU, before an
    operator is called: given tensors of several devices the dispatcher would
    run the operator's fake implementation, whose result is uninitialised."""
    for name, t in named.items():
        if isinstance(t, Tensor) and t.device.type != "cpu":
            not_cpu(name, t)


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


_interpreters = torch._C._functorch.peek_interpreter_stack
_UNSUPPORTED = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)
_fw_ad = torch.autograd.forward_ad


def transformed(*tensors) -> bool:
    """Does the call run under torch.func's vmap (or functionalize): then it
    goes through the dispatcher as the custom operator, since the tensors
    are wrappers without storage.  The ValueError under torch.func's grad or
    jvp, and for a tensor with a forward-mode tangent
    (torch.autograd.forward_ad): fastattn's operators have reverse-mode
    gradients for autograd only."""
    if torch.compiler.is_compiling():
        return False
    if _fw_ad._current_level >= 0:
        for t in tensors:
            if isinstance(t, Tensor) and _fw_ad.unpack_dual(t).tangent is not None:
                raise ValueError("an input carries a forward-mode tangent "
                                 "(torch.autograd.forward_ad): fastattn.torch computes "
                                 "reverse-mode gradients only; use backward() or "
                                 "torch.autograd.grad, or torch's SDPA for forward mode")
    stack = _interpreters()
    if stack is not None and stack.key() in _UNSUPPORTED:
        raise ValueError("fastattn.torch's gradients are autograd's (backward(), "
                         "torch.autograd.grad), not torch.func.grad / jvp / jacrev: use those, "
                         "or torch's SDPA under torch.func")
    return stack is not None


def mask_tensor(x) -> Tensor | None:
    """A mask given as a sequence or array, as a tensor (operators take
    tensors; :func:`fastattn.attention` converts it the same way)."""
    if x is None or isinstance(x, Tensor):
        return x
    return torch.as_tensor(np.asarray(x))


def require_tensors(named: dict[str, Any], numpy_function: str) -> None:
    """The TypeError for an argument of ``named`` that is not a tensor
    (``numpy_function``: fastattn's function for NumPy arrays)."""
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} "
                            f"(for NumPy arrays use {numpy_function})")


def constants(named: dict[str, Any]) -> None:
    """The error for a mask or slopes that require grad where fastattn.torch
    gives them no gradient."""
    for name, t in named.items():
        if getattr(t, "requires_grad", False):
            raise ValueError(f"{name} requires grad, but fastattn.torch gives {name} no "
                             f"gradient here: pass {name}.detach(), or a learned bias as "
                             f"the float attn_mask of fastattn.torch.scaled_dot_product_"
                             f"attention (which has its gradient)")


def no_dropout(dropout_p) -> None:
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p!r}: fastattn.torch has no dropout; use "
                         f"dropout_p=0, or torch.nn.functional.scaled_dot_product_attention "
                         f"for attention dropout")


def causal_code(is_causal) -> str:
    """``is_causal`` as the operators' string: 'none', 'upper_left' or
    'lower_right'; what :func:`fastattn.attention` accepts, nothing else."""
    causal, _ = causal_offset(is_causal, 0, 0)
    if not causal:
        return "none"
    return "lower_right" if isinstance(is_causal, str) and is_causal == "lower_right" \
        else "upper_left"


def causal_of(causal: str):
    """The operators' string back as ``is_causal``."""
    return False if causal == "none" else causal


def window_pair(window) -> tuple[int, int]:
    """``window`` as (left, right), -1 = unbounded (the operators' encoding),
    checked as :func:`fastattn.attention` checks it; a side beyond int64
    (which the operators' schemas refuse) as :data:`UNBOUNDED`, which bounds
    nothing either."""
    left, right = check_window(window)
    return (-1 if left is None else min(left, UNBOUNDED),
            -1 if right is None else min(right, UNBOUNDED))


def checked_options(softcap, num_threads) -> tuple[float | None, int | None]:
    """``softcap`` and ``num_threads`` as the operators take them, checked as
    :func:`fastattn.attention` checks them (the operators' schemas would
    take a bool for either); while compiling, as given (the operator's
    implementation checks them when it runs, and dynamo may hand over a
    symbolic int)."""
    if torch.compiler.is_compiling():
        return optional_float(softcap, "softcap"), num_threads
    return check_softcap(softcap), None if num_threads is None else thread_count(num_threads)


def window_of(wl: int, wr: int):
    """The operators' (left, right) encoding back as ``window``."""
    return None if wl < 0 and wr < 0 else (None if wl < 0 else wl, None if wr < 0 else wr)


def option_tensor(x, like: Tensor) -> Tensor | None:
    """Slopes or sinks given as a sequence, as a float64 tensor (operators take
    tensors)."""
    if x is None or isinstance(x, Tensor):
        return x
    return torch.tensor(x, dtype=torch.float64, device=like.device)


def optional_float(x, name: str) -> float | None:
    """``scale`` or ``softcap`` as the operators' float (an int beyond float64
    as an infinity, which the implementation then refuses by name)."""
    if x is None:
        return None
    if text_or_bool(x):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {x!r}") from None


def second_order(ctx, *grads) -> None:
    """The backward operators' own backward (torch.library.register_autograd):
    reached only by a gradient of a gradient, which fastattn does not compute
    (torch's CPU flash kernel neither); the error says what does."""
    raise NotImplementedError(
        "fastattn computes first derivatives only: a gradient of its gradients "
        "(create_graph=True and another backward, torch.func.hessian) is not implemented; "
        "torch.nn.functional.scaled_dot_product_attention under "
        "sdpa_kernel(SDPBackend.MATH) computes it")


def tensor_out(out) -> None:
    """The TypeError for an ``out=`` that is not a tensor (a NumPy array, a
    list): the torch functions write and return tensors, on every path; the
    ValueError for one that requires grad in grad mode (writing into it is
    not differentiable: torch's own ``out=`` functions refuse it too)."""
    if out is not None and not isinstance(out, Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    writable_target(out, "out")


def writable_target(t, name: str) -> None:
    """The ValueError for a tensor the call writes that requires grad, in
    grad mode (autograd cannot follow the write), or that is an inference
    tensor outside inference mode (torch refuses to write one there; while
    compiling, the operators' declared writes leave that to torch)."""
    if t is None:
        return
    if getattr(t, "requires_grad", False) and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, and writing into it is not differentiable: "
                         f"pass a tensor that does not, or call under torch.no_grad()")
    if (not torch.compiler.is_compiling() and isinstance(t, Tensor) and t.is_inference()
            and not torch.is_inference_mode_enabled()):
        raise ValueError(f"{name} is an inference tensor, which torch does not let a call "
                         f"write outside torch.inference_mode(): call it there, or pass "
                         f"a clone made outside it")


def written(*tensors) -> None:
    """Tell autograd that ``tensors`` (None skipped) changed: written through
    NumPy views, their version counters would not move, and a backward that
    saved one of them would silently use the new values."""
    for t in tensors:
        if t is not None:
            torch.autograd.graph.increment_version(t)


def fill_out(out, res: Tensor, inputs: dict[str, Any]) -> Tensor:
    """``res`` copied into ``out`` (``out=`` on the operators' path, where the
    result is computed first): ``out`` of another type, shape or dtype, or
    sharing memory with one of the tensors ``inputs`` (name: tensor or
    None), is refused, as :func:`fastattn.attention` refuses it, with
    nothing written."""
    tensor_out(out)
    if tuple(out.shape) != tuple(res.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the result has shape "
                         f"{tuple(res.shape)}")
    if out.dtype != res.dtype:
        raise TypeError(f"out has dtype {out.dtype}, the result has dtype {res.dtype}")
    # (symbolic strides while compiling cannot be sorted: out.copy_ below
    # refuses an out with overlapping elements there)
    if not torch.compiler.is_compiling() and overlapping(tuple(out.shape), tuple(out.stride()), 1):
        raise ValueError(f"out's strides {tuple(out.stride())} (shape {tuple(out.shape)}) give "
                         f"two elements the same memory: give an array whose elements are "
                         f"distinct")
    _separate(out, inputs)
    out.copy_(res)
    return out


def _separate(out: Tensor, inputs: dict[str, Any]) -> None:
    """The ValueError for ``out`` sharing memory with one of ``inputs``
    (checked on tensors with memory: not while compiling, not on vmap's
    wrappers); copied into, the input would change under autograd's feet."""
    if torch.compiler.is_compiling():
        return
    try:
        o = array_view(out, "out")
        arrays = {name: array_view(t, name) for name, t in inputs.items()
                  if isinstance(t, Tensor)}
    except (RuntimeError, TypeError):  # a tensor without storage (vmap, functionalize)
        return
    for name, a in arrays.items():
        if np.may_share_memory(o, a):
            raise ValueError(f"out overlaps {name}: give a separate output tensor")


def grad_tensors(grads, query: Tensor, sinks, mask_grad: bool = False) -> tuple:
    """A NumPy backward's (dq, dk, dv[, d_sinks][, d_mask]) as the backward
    operators' four tensors (an empty tensor where there are no sinks), and a
    fifth with ``mask_grad`` (the mask's gradient)."""
    d_sinks = tensor_view(grads[3]) if sinks is not None else query.new_empty(0)
    res = tensor_view(grads[0]), tensor_view(grads[1]), tensor_view(grads[2]), d_sinks
    return res + (tensor_view(grads[-1]),) if mask_grad else res


def nan_grads(query: Tensor, key: Tensor, value: Tensor, sinks, mask=None) -> tuple:
    """The backward operators' results for a forward whose lse has NaN or
    +inf entries (NaN or Inf among its inputs, :func:`_grads.nonfinite_lse`):
    every gradient NaN (NumPy's attention_backward refuses such an lse; a
    training step is told by its gradients, as with torch's own kernels)."""
    return tuple(g.fill_(float("nan")) if g.numel() else g
                 for g in fake_grads(query, key, value, sinks, mask))


def fake_grads(query: Tensor, key: Tensor, value: Tensor, sinks, mask=None) -> tuple:
    """The backward operators' fake results: grad_tensors' shapes and dtypes
    (with ``mask``, whose gradient is asked for, a fifth of its shape and dtype)."""
    if sinks is None:
        d_sinks = query.new_empty(0)
    else:
        d_sinks = sinks.new_empty(sinks.shape, dtype=sinks.dtype if sinks.is_floating_point()
                                  else torch.float64)
    res = (query.new_empty(query.shape), key.new_empty(key.shape),
           value.new_empty(value.shape), d_sinks)
    return res + (mask.new_empty(mask.shape),) if mask is not None else res
