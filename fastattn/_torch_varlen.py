"""fastattn.torch over packed sequences: :func:`attention_varlen`, flash-attn's
varlen layout on CPU tensors, differentiable in query, key, value and sinks
(the custom operators ``fastattn::varlen`` and ``fastattn::varlen_backward``,
with :func:`torch.library.register_autograd`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._torch_views import (FLOATS, Tensor, array_view, causal_code, causal_of, checked_options,
                           constants, cpu_tensors, fake_grads, fill_out, float_tensors,
                           from_numpy, grad_tensors, nan_grads, option_tensor, optional_float,
                           require_tensors, second_order, subclassed, tensor_out, tensor_view,
                           transformed, window_of, window_pair, written)
from ._grads import nonfinite_lse
from .varlen import attention_varlen as _attention_varlen
from .varlen_backward import attention_varlen_backward as _attention_varlen_backward

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["attention_varlen"]

_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


def attention_varlen(query: Tensor, key: Tensor, value: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, *, is_causal: bool | str = False,
                     scale: float | None = None,
                     window: int | tuple[int | None, int | None] | None = None,
                     alibi_slopes: Tensor | Sequence[float] | None = None,
                     softcap: float | None = None, sinks: Tensor | Sequence[float] | None = None,
                     return_lse: bool = False, num_threads: int | None = None,
                     out: Tensor | None = None) -> Any:
    """Attention over a packed batch of sequences of CPU tensors, differentiable.

    :func:`fastattn.attention_varlen` (flash-attn's varlen layout: sequence
    ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key
    rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``, nothing padded) on views of
    the tensors' memory.  Differentiable in ``query``, ``key``, ``value`` and
    ``sinks`` (and through ``lse`` with ``return_lse=True``), by
    :func:`fastattn.attention_varlen_backward`: packed-sequence training
    without a block-diagonal mask.

    Parameters
    ----------
    query, key, value : torch.Tensor, shapes (total_q, H, E), (total_k, H_kv, E), (total_k, H_kv, Ev)
        CPU tensors of float32, float64, float16 or bfloat16, any strides;
        ``H`` a multiple of ``H_kv`` (grouped-query attention).
    cu_seqlens_q, cu_seqlens_k : torch.Tensor of int32 or int64, shape (n + 1,)
        Cumulative sequence lengths, from 0 to ``total_q`` / ``total_k``.
    is_causal : bool or {'upper_left', 'lower_right'}
        Within each sequence, as in :func:`fastattn.attention` (``True`` is
        upper-left; flash-attn's varlen causal mask is ``'lower_right'``).
    scale, window, softcap, num_threads
        As in :func:`fastattn.attention_varlen`.
    alibi_slopes : torch.Tensor or sequence of float, optional
        Broadcastable to ``(n, H)``; a constant.
    sinks : torch.Tensor or sequence of float, optional
        Broadcastable to ``(n, H)``; a tensor gets a gradient.
    return_lse : bool
        Also return each row's log-sum-exp, ``(H, total_q)``, differentiable.
    out : torch.Tensor, optional
        A CPU tensor of the result's shape and dtype, filled and returned.

    Returns
    -------
    torch.Tensor, shape (total_q, H, Ev)
        The inputs' dtype; with ``return_lse=True``, ``(output, lse)``.

    Raises
    ------
    ValueError
        As :func:`fastattn.attention_varlen`; a tensor not on the CPU;
        ``alibi_slopes`` that require grad in grad mode.
    TypeError
        An unsupported dtype, or ``query``, ``key`` or ``value`` not a tensor.

    Examples
    --------
    Two sequences of 2 and 3 tokens packed into 5 rows, one head of 4
    dimensions, causal; the gradient reaches every packed row:

    >>> import torch, fastattn.torch
    >>> x = torch.randn(5, 1, 4, generator=torch.Generator().manual_seed(0))
    >>> q = x.clone().requires_grad_(True)
    >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    >>> out = fastattn.torch.attention_varlen(q, x, x, cu, cu, is_causal=True)
    >>> out.shape
    torch.Size([5, 1, 4])
    >>> out.sum().backward()
    >>> q.grad.shape
    torch.Size([5, 1, 4])

    Each sequence as its own call of torch's SDPA:

    >>> from torch.nn.functional import scaled_dot_product_attention as sdpa
    >>> ref = torch.cat([sdpa(x[a:b].transpose(0, 1), x[a:b].transpose(0, 1),
    ...                       x[a:b].transpose(0, 1), is_causal=True).transpose(0, 1)
    ...                  for a, b in ((0, 2), (2, 5))])
    >>> torch.allclose(out, ref, atol=1e-6)
    True
    """
    tensor_out(out)
    args = (query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window,
            alibi_slopes, softcap, sinks, return_lse, num_threads, out)
    if _is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (
            query, key, value, alibi_slopes, sinks)):
        constants({"alibi_slopes": alibi_slopes})
        transformed(query, key, value, sinks)
        return _traced(*args)
    if _is_compiling() or subclassed((query, key, value, cu_seqlens_q, cu_seqlens_k,
                                      alibi_slopes, sinks, out)) or transformed(
                                          query, key, value, sinks):
        return _traced(*args)
    require_tensors({"query": query, "key": key, "value": value}, "fastattn.attention_varlen")
    return _eager(*args)


def _eager(query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window,
           alibi_slopes, softcap, sinks, return_lse, num_threads, out):
    """The call on NumPy views of the tensors, straight to the kernel (the
    operator's implementation too)."""
    if query.dtype not in FLOATS or key.dtype not in FLOATS or value.dtype not in FLOATS:
        float_tensors({"query": query, "key": key, "value": value})
    a = array_view
    res = _attention_varlen(
        a(query, "query"), a(key, "key"), a(value, "value"), a(cu_seqlens_q, "cu_seqlens_q"),
        a(cu_seqlens_k, "cu_seqlens_k"), is_causal=is_causal, scale=scale, window=window,
        alibi_slopes=a(alibi_slopes, "alibi_slopes"), softcap=softcap,
        sinks=a(sinks, "sinks"), return_lse=return_lse,
        out=None if out is None else a(out, "out"), num_threads=num_threads)
    written(out)
    if return_lse:
        return (out if out is not None else tensor_view(res[0])), from_numpy(res[1])
    return out if out is not None else tensor_view(res)


def _index_tensor(x, name: str) -> Tensor:
    """``cu_seqlens_*`` as a tensor for the operator (a list or array converted)."""
    if isinstance(x, Tensor):
        return x
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold int32 or int64 offsets, got dtype {a.dtype}")
    return torch.as_tensor(a)


def _traced(query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window,
            alibi_slopes, softcap, sinks, return_lse, num_threads, out):
    """The call as the operator ``fastattn::varlen`` (what autograd records and
    torch.compile / torch.export see); ``out`` is filled from its result."""
    require_tensors({"query": query, "key": key, "value": value}, "fastattn.attention_varlen")
    float_tensors({"query": query, "key": key, "value": value})
    cpu_tensors({"query": query, "key": key, "value": value, "cu_seqlens_q": cu_seqlens_q,
                 "cu_seqlens_k": cu_seqlens_k, "alibi_slopes": alibi_slopes, "sinks": sinks,
                 "out": out})
    wl, wr = window_pair(window)
    cap, nt = checked_options(softcap, num_threads)
    res, lse = torch.ops.fastattn.varlen(
        query, key, value, _index_tensor(cu_seqlens_q, "cu_seqlens_q"),
        _index_tensor(cu_seqlens_k, "cu_seqlens_k"), causal_code(is_causal),
        optional_float(scale, "scale"), wl, wr, option_tensor(alibi_slopes, query),
        cap, option_tensor(sinks, query), nt)
    if out is not None:
        res = fill_out(out, res, {"query": query, "key": key, "value": value,
                                  "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                                  "alibi_slopes": alibi_slopes, "sinks": sinks})
    return (res, lse) if return_lse else res


@torch.library.custom_op("fastattn::varlen", mutates_args=(), device_types="cpu")
def _varlen_op(query: Tensor, key: Tensor, value: Tensor, cu_seqlens_q: Tensor,
               cu_seqlens_k: Tensor, is_causal: str, scale: float | None, window_left: int,
               window_right: int, alibi_slopes: Tensor | None, softcap: float | None,
               sinks: Tensor | None, num_threads: int | None) -> tuple[Tensor, Tensor]:
    """``fastattn::varlen``: the result and each row's log-sum-exp ``(H, total_q)``;
    ``is_causal`` is 'none', 'upper_left' or 'lower_right', a window side of
    -1 is unbounded."""
    with torch.no_grad():
        return _eager(query, key, value, cu_seqlens_q, cu_seqlens_k, causal_of(is_causal),
                      scale, window_of(window_left, window_right), alibi_slopes, softcap,
                      sinks, True, num_threads, None)


@_varlen_op.register_fake
def _varlen_fake(query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale,
                 window_left, window_right, alibi_slopes, softcap, sinks, num_threads):
    dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    lse_dt = torch.float64 if dt == torch.float64 else torch.float32
    total_q, heads = query.shape[0], query.shape[1]
    return (query.new_empty((total_q, heads, value.shape[-1]), dtype=dt),
            query.new_empty((heads, total_q), dtype=lse_dt))


@torch.library.custom_op("fastattn::varlen_backward", mutates_args=(), device_types="cpu")
def _varlen_backward_op(grad_out: Tensor, grad_lse: Tensor | None, query: Tensor, key: Tensor,
                        value: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                        cu_seqlens_k: Tensor, is_causal: str, scale: float | None,
                        window_left: int, window_right: int, alibi_slopes: Tensor | None,
                        softcap: float | None, sinks: Tensor | None, num_threads: int | None
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``fastattn::varlen_backward``: the gradients of ``fastattn::varlen`` in
    query, key, value and sinks (an empty tensor without sinks)."""
    lse_a = array_view(lse, "lse")
    if nonfinite_lse(lse_a).any():
        return nan_grads(query, key, value, sinks)
    a = array_view
    grads = _attention_varlen_backward(
        a(grad_out, "grad_out"), a(query, "query"), a(key, "key"), a(value, "value"),
        a(out, "out"), lse_a, a(cu_seqlens_q, "cu_seqlens_q"),
        a(cu_seqlens_k, "cu_seqlens_k"), is_causal=causal_of(is_causal), scale=scale,
        window=window_of(window_left, window_right),
        alibi_slopes=a(alibi_slopes, "alibi_slopes"), softcap=softcap,
        sinks=a(sinks, "sinks"), grad_lse=a(grad_lse, "grad_lse"), num_threads=num_threads)
    return grad_tensors(grads, query, sinks)


@_varlen_backward_op.register_fake
def _varlen_backward_fake(grad_out, grad_lse, query, key, value, out, lse, cu_seqlens_q,
                          cu_seqlens_k, is_causal, scale, window_left, window_right,
                          alibi_slopes, softcap, sinks, num_threads):
    return fake_grads(query, key, value, sinks)


def _setup(ctx, inputs, output) -> None:
    (q, k, v, cu_q, cu_k, causal, scale, wl, wr, slopes, cap, sinks, nt) = inputs
    constants({"alibi_slopes": slopes})
    ctx.options = (causal, scale, wl, wr, cap, nt)
    ctx.has_sinks = sinks is not None
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, cu_q, cu_k, slopes, sinks, *output)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, cu_q, cu_k, slopes, sinks, out, lse = ctx.saved_tensors
    causal, scale, wl, wr, cap, nt = ctx.options
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, ds = torch.ops.fastattn.varlen_backward(
        grad_out, grad_lse, q, k, v, out, lse, cu_q, cu_k, causal, scale, wl, wr, slopes, cap,
        sinks, nt)
    return (dq, dk, dv, None, None, None, None, None, None, None, None,
            ds if ctx.has_sinks else None, None)


torch.library.register_autograd("fastattn::varlen", _backward, setup_context=_setup)
torch.library.register_autograd("fastattn::varlen_backward", second_order)
