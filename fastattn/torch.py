"""fastattn for torch tensors: :func:`scaled_dot_product_attention`, with the
signature and semantics of :func:`torch.nn.functional.scaled_dot_product_attention`
for CPU tensors, computed by :func:`fastattn.attention`, plus its options;
:func:`attention_varlen` over packed sequences (flash-attn's varlen layout);
and :func:`attention_paged` / :func:`paged_append` over paged KV caches held
in tensors (another engine's included).

The inputs are read in place as NumPy views (any strides, no copies).
Importing this module needs torch; ``import fastattn`` does not.

:func:`scaled_dot_product_attention` and :func:`attention_varlen` are
differentiable in ``query``, ``key``, ``value`` and ``sinks``: when grad
mode is on and one of them requires grad, the call is a custom operator
that keeps each row's log-sum-exp (``fastattn::sdpa_lse``,
``fastattn::varlen``), registered with :func:`torch.library.register_autograd`;
its backward is the custom operator ``fastattn::sdpa_backward`` /
``fastattn::varlen_backward``, computed by :func:`fastattn.attention_backward`
/ :func:`fastattn.attention_varlen_backward`.  Masks and ALiBi slopes are
constants.

Under :func:`torch.compile` and :func:`torch.export` the calls are the custom
operators ``torch.ops.fastattn.sdpa`` (``fastattn::sdpa_lse`` with
``return_lse=True`` or when training), ``torch.ops.fastattn.varlen``,
``torch.ops.fastattn.attention_paged`` and ``torch.ops.fastattn.paged_append``
(which declares the caches it writes); each has a fake (meta)
implementation, so a model, and its training step, traces without graph
breaks.  Called eagerly with no input requiring grad (or under
:func:`torch.no_grad`), the functions go straight to the kernel: no
dispatcher round trip, no autograd node, no log-sum-exp kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._api import attention as _attention
from ._torch_paged import attention_paged, paged_append
from ._torch_varlen import attention_varlen
from ._torch_views import (FLOATS as _FLOATS, Tensor as _Tensor, array_view as _array,
                           causal_code, causal_of as _causal_of, checked_options, constants,
                           cpu_tensors, fake_grads, fill_out, float_tensors, mask_tensor,
                           from_numpy as _from_numpy, grad_tensors, nan_grads, no_dropout,
                           option_tensor as _slopes, optional_float, require_tensors,
                           second_order as _second_order, tensor_out as _tensor_out,
                           tensor_view as _tensor, transformed, window_of as _window_of,
                           window_pair as _window_pair, written as _written)
from ._grads import nonfinite_lse
from .backward import attention_backward as _attention_backward

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["scaled_dot_product_attention", "attention_varlen", "attention_paged",
           "paged_append"]

_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


# ---------------------------------------------------------------------------
# the public function
# ---------------------------------------------------------------------------

def _needs_grad(dropout_p, query, key, value, attn_mask, alibi_slopes, sinks) -> bool:
    """Called with grad mode on (or dropout): whether the call is recorded for
    autograd (query, key, value, sinks or a float attn_mask requiring grad);
    the errors for dropout and for slopes that require grad (fastattn gives
    them no gradient)."""
    no_dropout(dropout_p)
    if not any(getattr(t, "requires_grad", False) for t in (
            query, key, value, attn_mask, alibi_slopes, sinks)):
        return False
    constants({"alibi_slopes": alibi_slopes})
    return True


def _not_tensors(query, key, value) -> None:
    require_tensors({"query": query, "key": key, "value": value}, "fastattn.attention")


def scaled_dot_product_attention(
        query: _Tensor, key: _Tensor, value: _Tensor, attn_mask: _Tensor | None = None,
        dropout_p: float = 0.0, is_causal: bool | str = False, scale: float | None = None,
        enable_gqa: bool = False, *, key_padding_mask: _Tensor | None = None,
        window: int | tuple[int | None, int | None] | None = None,
        alibi_slopes: _Tensor | Sequence[float] | None = None, softcap: float | None = None,
        sinks: _Tensor | Sequence[float] | None = None, return_lse: bool = False,
        num_threads: int | None = None, out: _Tensor | None = None) -> Any:
    """Scaled dot-product attention of CPU tensors, ``softmax(Q Kᵀ · scale + mask) V``.

    :func:`torch.nn.functional.scaled_dot_product_attention`'s arguments and
    semantics (a bool ``attn_mask``: True = may attend; a float one is added
    to the scores; ``is_causal=True`` is upper-left aligned), computed by
    :func:`fastattn.attention` on views of the tensors' memory.  Differentiable
    in ``query``, ``key``, ``value``, ``sinks`` and a float ``attn_mask``
    (first-order gradients, by :func:`fastattn.attention_backward`, summed
    over what broadcast).

    Parameters
    ----------
    query, key, value : torch.Tensor, shapes (..., L, E), (..., S, E), (..., S, Ev)
        CPU tensors of float32, float64, float16 or bfloat16 (bfloat16 when
        this fastattn computes with it), any strides.  Leading dimensions
        broadcast.
    attn_mask : torch.Tensor, optional
        bool or float, broadcastable to ``(..., L, S)``.  A float mask that
        requires grad (a learned bias, such as T5's relative position bias)
        gets its gradient, the logits' summed to its shape, computed by the
        same pass through a float buffer of ``(..., L, S)``.
    dropout_p : float
        Must be 0: fastattn has no dropout.
    is_causal : bool or {'upper_left', 'lower_right'}
        ``True``: torch's (upper-left) causal mask; ``'lower_right'``: the
        alignment decoding with a KV cache needs.
    scale : float, optional
        Default ``1 / sqrt(E)``.
    enable_gqa : bool
        Query heads (dim -3) a multiple of the key/value heads, which are never
        repeated or copied.
    key_padding_mask, window, alibi_slopes, softcap, sinks, return_lse, num_threads
        As in :func:`fastattn.attention` (``key_padding_mask``: True = padding).
        ``sinks`` (a tensor) gets a gradient; ``alibi_slopes`` is a constant.
        With ``return_lse=True``, ``lse`` is differentiable too.
    out : torch.Tensor, optional
        A CPU tensor of the result's shape and dtype (any strides), filled and
        returned.

    Returns
    -------
    torch.Tensor, shape (..., L, Ev)
        The dtype of the inputs.  With ``return_lse=True``, ``(output, lse)``,
        ``lse`` of shape ``(..., L)`` (float32, float64 for float64 inputs).

    Raises
    ------
    ValueError
        ``dropout_p > 0``; a tensor not on the CPU; shapes that do not fit;
        ``alibi_slopes`` that require grad in grad mode.
    TypeError
        An unsupported dtype.

    Examples
    --------
    The walkthrough's three tokens, causal:

    >>> import torch
    >>> from fastattn.torch import scaled_dot_product_attention
    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> scaled_dot_product_attention(x, x, x, is_causal=True)
    tensor([[1.0000, 0.0000],
            [0.3302, 0.6698],
            [0.7517, 0.7517]])

    Into a given tensor, with a causal sliding window of one key back:

    >>> y = torch.empty(3, 2)
    >>> r = scaled_dot_product_attention(x, x, x, is_causal=True, window=(1, 0), out=y)
    >>> r is y, y[2]
    (True, tensor([0.6698, 1.0000]))

    Gradients, as torch's own SDPA gives them:

    >>> q = x.clone().requires_grad_(True)
    >>> scaled_dot_product_attention(q, x, x, is_causal=True).sum().backward()
    >>> ref = q.detach().clone().requires_grad_(True)
    >>> from torch.nn.functional import scaled_dot_product_attention as torch_sdpa
    >>> torch_sdpa(ref, x, x, is_causal=True).sum().backward()
    >>> torch.allclose(q.grad, ref.grad, atol=1e-6)
    True
    """
    if out is not None:
        _tensor_out(out)
    if (dropout_p or _is_grad_enabled()) and _needs_grad(dropout_p, query, key, value,
                                                          attn_mask, alibi_slopes, sinks):
        _not_tensors(query, key, value)
        transformed(query, key, value, sinks)
        return _traced(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                       key_padding_mask, window, alibi_slopes, softcap, sinks, return_lse,
                       num_threads, out, True)
    if (_is_compiling() or type(query) is not _Tensor or type(key) is not _Tensor
            or type(value) is not _Tensor or transformed(query, key, value, sinks)):
        _not_tensors(query, key, value)
        return _traced(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                       key_padding_mask, window, alibi_slopes, softcap, sinks, return_lse,
                       num_threads, out, False)
    return _sdpa_eager(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                       key_padding_mask, window, alibi_slopes, softcap, sinks, return_lse,
                       num_threads, out)


def _sdpa_eager(query, key, value, attn_mask, is_causal, scale, enable_gqa, key_padding_mask,
                window, alibi_slopes, softcap, sinks, return_lse, num_threads, out):
    """The call on NumPy views of the tensors, straight to the kernel (the
    operators' implementation too: a Tensor subclass, a Parameter say,
    reaches them through the dispatcher and must not be sent back there)."""
    if query.dtype not in _FLOATS or key.dtype not in _FLOATS or value.dtype not in _FLOATS:
        float_tensors({"query": query, "key": key, "value": value})
    q = _array(query, "query")
    k = _array(key, "key")
    v = _array(value, "value")
    m = None if attn_mask is None else _array(attn_mask, "attn_mask")
    o = None if out is None else _array(out, "out")
    pad = None if key_padding_mask is None else _array(key_padding_mask, "key_padding_mask")
    if alibi_slopes is not None or sinks is not None or softcap is not None or return_lse:
        res = _attention(q, k, v, m, is_causal, scale, enable_gqa, key_padding_mask=pad,
                         window=window, alibi_slopes=_array(alibi_slopes, "alibi_slopes"),
                         softcap=softcap, sinks=_array(sinks, "sinks"), return_lse=return_lse,
                         num_threads=num_threads, out=o)
    else:
        res = _attention(q, k, v, m, is_causal, scale, enable_gqa, key_padding_mask=pad,
                         window=window, num_threads=num_threads, out=o)
    _written(out)
    if return_lse:
        return (out if o is not None else _tensor(res[0])), _from_numpy(res[1])
    return out if o is not None else _tensor(res)


# ---------------------------------------------------------------------------
# the custom operator (torch.compile, torch.export)
# ---------------------------------------------------------------------------

def _traced(query, key, value, attn_mask, is_causal, scale, enable_gqa, key_padding_mask,
            window, alibi_slopes, softcap, sinks, return_lse, num_threads, out, train):
    """The call as the custom operator (what torch.compile and torch.export see,
    and what autograd records: ``fastattn::sdpa_lse`` when ``train``, whose
    lse the backward needs)."""
    float_tensors({"query": query, "key": key, "value": value})
    cpu_tensors({"query": query, "key": key, "value": value, "attn_mask": attn_mask,
                 "key_padding_mask": key_padding_mask, "alibi_slopes": alibi_slopes,
                 "sinks": sinks, "out": out})
    wl, wr = _window_pair(window)
    cap, nt = checked_options(softcap, num_threads)
    args = (query, key, value, mask_tensor(attn_mask), causal_code(is_causal),
            optional_float(scale, "scale"), bool(enable_gqa), mask_tensor(key_padding_mask), wl, wr,
            _slopes(alibi_slopes, query), cap, _slopes(sinks, query), nt)
    if return_lse or train:
        res, lse = torch.ops.fastattn.sdpa_lse(*args)
    else:
        res, lse = torch.ops.fastattn.sdpa(*args), None
    if out is not None:
        res = fill_out(out, res, {"query": query, "key": key, "value": value,
                                  "attn_mask": attn_mask, "key_padding_mask": key_padding_mask,
                                  "alibi_slopes": alibi_slopes, "sinks": sinks})
    return (res, lse) if return_lse else res


def _op_call(query, key, value, attn_mask, causal, scale, enable_gqa, key_padding_mask, wl, wr,
             alibi_slopes, softcap, sinks, num_threads, return_lse):
    """The operator's CPU implementation: the decoded arguments to the kernel."""
    return _sdpa_eager(query, key, value, attn_mask, _causal_of(causal), scale, enable_gqa,
                       key_padding_mask, _window_of(wl, wr), alibi_slopes, softcap, sinks,
                       return_lse, num_threads, None)


@torch.library.custom_op("fastattn::sdpa", mutates_args=(), device_types="cpu")
def _sdpa_op(query: _Tensor, key: _Tensor, value: _Tensor, attn_mask: _Tensor | None,
             is_causal: str, scale: float | None, enable_gqa: bool,
             key_padding_mask: _Tensor | None, window_left: int, window_right: int,
             alibi_slopes: _Tensor | None, softcap: float | None, sinks: _Tensor | None,
             num_threads: int | None) -> _Tensor:
    """``fastattn::sdpa``; ``is_causal`` is 'none', 'upper_left' or 'lower_right',
    a window side of -1 is unbounded."""
    with torch.no_grad():
        return _op_call(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                        key_padding_mask, window_left, window_right, alibi_slopes, softcap,
                        sinks, num_threads, False)


@torch.library.custom_op("fastattn::sdpa_lse", mutates_args=(), device_types="cpu")
def _sdpa_lse_op(query: _Tensor, key: _Tensor, value: _Tensor, attn_mask: _Tensor | None,
                 is_causal: str, scale: float | None, enable_gqa: bool,
                 key_padding_mask: _Tensor | None, window_left: int, window_right: int,
                 alibi_slopes: _Tensor | None, softcap: float | None, sinks: _Tensor | None,
                 num_threads: int | None) -> tuple[_Tensor, _Tensor]:
    """``fastattn::sdpa_lse``: ``fastattn::sdpa`` and each row's log-sum-exp."""
    with torch.no_grad():
        return _op_call(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                        key_padding_mask, window_left, window_right, alibi_slopes, softcap,
                        sinks, num_threads, True)


def _fake_shapes(query: _Tensor, key: _Tensor, value: _Tensor, enable_gqa: bool):
    """(result shape, lse shape, result dtype, lse dtype) as fastattn computes them."""
    qs, ks, vs = query.shape, key.shape, value.shape
    kb, vb = ks[:-2], vs[:-2]
    if enable_gqa and len(qs) >= 3 and len(ks) >= 3 and len(vs) >= 3:
        kb, vb = ks[:-3] + (qs[-3],), vs[:-3] + (qs[-3],)
    batch = torch.broadcast_shapes(qs[:-2], kb, vb)
    dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    lse_dt = torch.float64 if dt == torch.float64 else torch.float32
    return (*batch, qs[-2], vs[-1]), (*batch, qs[-2]), dt, lse_dt


@_sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, key_padding_mask,
               window_left, window_right, alibi_slopes, softcap, sinks, num_threads):
    shape, _, dt, _ = _fake_shapes(query, key, value, enable_gqa)
    return query.new_empty(shape, dtype=dt)


@_sdpa_lse_op.register_fake
def _sdpa_lse_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                   key_padding_mask, window_left, window_right, alibi_slopes, softcap, sinks,
                   num_threads):
    shape, lshape, dt, ldt = _fake_shapes(query, key, value, enable_gqa)
    return query.new_empty(shape, dtype=dt), query.new_empty(lshape, dtype=ldt)


# ---------------------------------------------------------------------------
# autograd: the backward operator and its registration on both forward ones
# ---------------------------------------------------------------------------

@torch.library.custom_op("fastattn::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward_op(grad_out: _Tensor, grad_lse: _Tensor | None, query: _Tensor,
                      key: _Tensor, value: _Tensor, out: _Tensor, lse: _Tensor,
                      attn_mask: _Tensor | None, is_causal: str, scale: float | None,
                      enable_gqa: bool, key_padding_mask: _Tensor | None, window_left: int,
                      window_right: int, alibi_slopes: _Tensor | None, softcap: float | None,
                      sinks: _Tensor | None, num_threads: int | None, mask_grad: bool
                      ) -> tuple[_Tensor, _Tensor, _Tensor, _Tensor, _Tensor]:
    """``fastattn::sdpa_backward``: the gradients of ``fastattn::sdpa_lse`` in
    query, key, value, sinks (an empty tensor without sinks) and, with
    ``mask_grad``, the float attn_mask (else an empty tensor), from the
    forward's ``out`` and ``lse`` and the gradients flowing into them
    (``grad_lse`` None: zero)."""
    lse_a = _array(lse, "lse")
    if nonfinite_lse(lse_a).any():
        return _five(nan_grads(query, key, value, sinks, attn_mask if mask_grad else None),
                     query)
    a = _array
    grads = _attention_backward(
        a(grad_out, "grad_out"), a(query, "query"), a(key, "key"), a(value, "value"),
        a(out, "out"), lse_a, a(attn_mask, "attn_mask"), _causal_of(is_causal), scale,
        enable_gqa, key_padding_mask=a(key_padding_mask, "key_padding_mask"),
        window=_window_of(window_left, window_right),
        alibi_slopes=a(alibi_slopes, "alibi_slopes"), softcap=softcap,
        sinks=a(sinks, "sinks"), grad_lse=a(grad_lse, "grad_lse"), num_threads=num_threads,
        return_mask_grad=mask_grad)
    return _five(grad_tensors(grads, query, sinks, mask_grad), query)


def _five(grads: tuple, query: _Tensor) -> tuple:
    """The backward operator's five results: an empty mask gradient where
    none was asked for."""
    return grads if len(grads) == 5 else grads + (query.new_empty(0),)


@_sdpa_backward_op.register_fake
def _sdpa_backward_fake(grad_out, grad_lse, query, key, value, out, lse, attn_mask, is_causal,
                        scale, enable_gqa, key_padding_mask, window_left, window_right,
                        alibi_slopes, softcap, sinks, num_threads, mask_grad):
    return _five(fake_grads(query, key, value, sinks, attn_mask if mask_grad else None), query)


def _save(ctx, inputs) -> tuple:
    """What either forward operator's backward needs of its inputs; the error
    for slopes that require grad."""
    (q, k, v, mask, causal, scale, gqa, pad, wl, wr, slopes, cap, sinks, nt) = inputs
    constants({"alibi_slopes": slopes})
    ctx.options = (causal, scale, gqa, wl, wr, cap, nt)
    ctx.has_sinks = sinks is not None
    ctx.mask_grad = mask is not None and mask.requires_grad
    ctx.set_materialize_grads(False)
    return q, k, v, mask, pad, slopes, sinks


def _grads(ctx, grad_out, grad_lse, q, k, v, mask, pad, slopes, sinks, out, lse) -> tuple:
    """The backward operator's gradients, one per forward input (None for the
    constants)."""
    causal, scale, gqa, wl, wr, cap, nt = ctx.options
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, ds, dm = torch.ops.fastattn.sdpa_backward(
        grad_out, grad_lse, q, k, v, out, lse, mask, causal, scale, gqa, pad, wl, wr, slopes,
        cap, sinks, nt, ctx.mask_grad)
    return (dq, dk, dv, dm if ctx.mask_grad else None, None, None, None, None, None, None,
            None, None, ds if ctx.has_sinks else None, None)


def _setup_lse(ctx, inputs, output) -> None:
    q, k, v, mask, pad, slopes, sinks = _save(ctx, inputs)
    ctx.save_for_backward(q, k, v, mask, pad, slopes, sinks, *output)


def _backward_lse(ctx, grad_out, grad_lse):
    return _grads(ctx, grad_out, grad_lse, *ctx.saved_tensors)


def _setup_plain(ctx, inputs, output) -> None:
    ctx.save_for_backward(*_save(ctx, inputs))


def _backward_plain(ctx, grad_out):
    """``fastattn::sdpa`` keeps no lse: the forward runs again to get it (the
    public function records ``fastattn::sdpa_lse`` instead)."""
    q, k, v, mask, pad, slopes, sinks = ctx.saved_tensors
    causal, scale, gqa, wl, wr, cap, nt = ctx.options
    out, lse = torch.ops.fastattn.sdpa_lse(q, k, v, mask, causal, scale, gqa, pad, wl, wr,
                                           slopes, cap, sinks, nt)
    return _grads(ctx, grad_out, None, q, k, v, mask, pad, slopes, sinks, out, lse)


torch.library.register_autograd("fastattn::sdpa_lse", _backward_lse, setup_context=_setup_lse)
torch.library.register_autograd("fastattn::sdpa", _backward_plain, setup_context=_setup_plain)
torch.library.register_autograd("fastattn::sdpa_backward", _second_order)
