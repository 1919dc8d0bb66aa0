"""fastattn for torch tensors: :func:`scaled_dot_product_attention`, with the
signature and semantics of :func:`torch.nn.functional.scaled_dot_product_attention`
for CPU tensors, computed by :func:`fastattn.attention`, plus its options.

Inference only: the inputs are read in place as NumPy views (any strides, no
copies) and nothing is recorded for autograd.  Importing this module needs
torch; ``import fastattn`` does not.

Under :func:`torch.compile` and :func:`torch.export` the call is the custom
operator ``torch.ops.fastattn.sdpa`` (``fastattn::sdpa_lse`` with
``return_lse=True``), which has a fake (meta) implementation, so a model
traces without graph breaks; called eagerly, the function goes straight to
the kernel (no dispatcher round trip: a few microseconds per call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._api import attention as _attention
from .paged import attention_paged as _attention_paged

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["scaled_dot_product_attention", "attention_paged"]

_Tensor = torch.Tensor
_BF16 = torch.bfloat16
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_from_numpy = torch.from_numpy
_CAUSAL = {False: "none", True: "upper_left", "upper_left": "upper_left",
           "lower_right": "lower_right"}


# ---------------------------------------------------------------------------
# tensors <-> arrays (views, never copies)
# ---------------------------------------------------------------------------

def _not_cpu(name: str, t: _Tensor):
    raise ValueError(f"{name} is a {t.device.type} tensor: fastattn.torch computes on the CPU "
                     f"and needs CPU tensors (on other devices use "
                     f"torch.nn.functional.scaled_dot_product_attention)")


def _array(t: Any, name: str) -> Any:
    """The NumPy view of CPU tensor ``t`` (non-tensors are returned as they are,
    for fastattn's own checks)."""
    if not isinstance(t, _Tensor):
        return t
    if not t.is_cpu:
        _not_cpu(name, t)
    if t.dtype is _BF16:
        return _bf16_view(t, name)
    return t.numpy() if not t.requires_grad else t.detach().numpy()


_bf16 = None  # ml_dtypes.bfloat16 once a bfloat16 tensor was seen and fastattn takes it


def _bf16_view(t: _Tensor, name: str) -> np.ndarray:
    """A bfloat16 tensor as an ``ml_dtypes.bfloat16`` array (the same memory)."""
    global _bf16
    if _bf16 is None:
        _bf16 = _bfloat16_dtype(name)
    return t.detach().view(torch.int16).numpy().view(_bf16)


def _bfloat16_dtype(name: str):
    """ml_dtypes.bfloat16 if this fastattn computes with it, else a TypeError."""
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
    return np.dtype(ml_dtypes.bfloat16)


def _tensor(a: np.ndarray) -> _Tensor:
    """The torch tensor over array ``a`` (no copy)."""
    if a.dtype.kind == "V":  # ml_dtypes.bfloat16
        return _from_numpy(a.view(np.int16)).view(_BF16)
    return _from_numpy(a)


# ---------------------------------------------------------------------------
# the public function
# ---------------------------------------------------------------------------

def _refuse_training(dropout_p, *tensors) -> None:
    """The errors for dropout and for tensors that require grad in grad mode
    (query, key, value, attn_mask, alibi_slopes, sinks)."""
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p!r}: fastattn.torch is for inference and has no "
                         f"dropout; to train, use torch.nn.functional."
                         f"scaled_dot_product_attention")
    if _is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise RuntimeError("fastattn.torch is for inference: an input requires grad and grad "
                           "mode is on, but fastattn computes no gradients.  Run it under "
                           "torch.no_grad() or torch.inference_mode(), or use "
                           "torch.nn.functional.scaled_dot_product_attention to train")


def _not_tensors(query, key, value) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, _Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} "
                            f"(for NumPy arrays use fastattn.attention)")


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
    :func:`fastattn.attention` on views of the tensors' memory.

    Parameters
    ----------
    query, key, value : torch.Tensor, shapes (..., L, E), (..., S, E), (..., S, Ev)
        CPU tensors of float32, float64, float16 or bfloat16 (bfloat16 when
        this fastattn computes with it), any strides.  Leading dimensions
        broadcast.
    attn_mask : torch.Tensor, optional
        bool or float, broadcastable to ``(..., L, S)``.
    dropout_p : float
        Must be 0: fastattn is for inference.
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
        ``dropout_p > 0``; a tensor not on the CPU; shapes that do not fit.
    RuntimeError
        Inputs that require grad while grad mode is on (train with torch's own
        SDPA).
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
    """
    if dropout_p or _is_grad_enabled():
        _refuse_training(dropout_p, query, key, value, attn_mask, alibi_slopes, sinks)
    if (_is_compiling() or type(query) is not _Tensor or type(key) is not _Tensor
            or type(value) is not _Tensor):
        _not_tensors(query, key, value)
        return _traced(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                       key_padding_mask, window, alibi_slopes, softcap, sinks, return_lse,
                       num_threads, out)
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
    if return_lse:
        return (out if o is not None else _tensor(res[0])), _from_numpy(res[1])
    return out if o is not None else _tensor(res)


# ---------------------------------------------------------------------------
# the custom operator (torch.compile, torch.export)
# ---------------------------------------------------------------------------

def _window_pair(window) -> tuple[int, int]:
    """``window`` as (left, right), -1 = unbounded (the operator's encoding)."""
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


def _slopes(x, like: _Tensor) -> _Tensor | None:
    if x is None or isinstance(x, _Tensor):
        return x
    return torch.tensor(x, dtype=torch.float64, device=like.device)


def _traced(query, key, value, attn_mask, is_causal, scale, enable_gqa, key_padding_mask,
            window, alibi_slopes, softcap, sinks, return_lse, num_threads, out):
    """The call as the custom operator (what torch.compile and torch.export see)."""
    if not (is_causal is True or is_causal is False or is_causal in ("upper_left", "lower_right")):
        raise ValueError(f"is_causal must be a bool, 'upper_left' or 'lower_right', "
                         f"got {is_causal!r}")
    wl, wr = _window_pair(window)
    args = (query, key, value, attn_mask, _CAUSAL[is_causal],
            None if scale is None else float(scale), bool(enable_gqa), key_padding_mask, wl, wr,
            _slopes(alibi_slopes, query), None if softcap is None else float(softcap),
            _slopes(sinks, query), num_threads)
    if return_lse:
        res, lse = torch.ops.fastattn.sdpa_lse(*args)
    else:
        res, lse = torch.ops.fastattn.sdpa(*args), None
    if out is not None:
        out.copy_(res)
        res = out
    return (res, lse) if return_lse else res


def _op_call(query, key, value, attn_mask, causal, scale, enable_gqa, key_padding_mask, wl, wr,
             alibi_slopes, softcap, sinks, num_threads, return_lse):
    """The operator's CPU implementation: the decoded arguments to the kernel."""
    window = None if wl < 0 and wr < 0 else (None if wl < 0 else wl, None if wr < 0 else wr)
    is_causal = False if causal == "none" else causal
    return scaled_dot_product_attention(
        query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa,
        key_padding_mask=key_padding_mask, window=window, alibi_slopes=alibi_slopes,
        softcap=softcap, sinks=sinks, return_lse=return_lse, num_threads=num_threads)


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
# paged KV caches
# ---------------------------------------------------------------------------

def attention_paged(query: _Tensor, key_cache: _Tensor, value_cache: _Tensor,
                    block_table: _Tensor, seq_lens: _Tensor, *,
                    cu_seqlens_q: _Tensor | None = None, key_scales: _Tensor | None = None,
                    value_scales: _Tensor | None = None, out: _Tensor | None = None,
                    **options: Any) -> Any:
    """:func:`fastattn.attention_paged` on CPU tensors, read in place.

    The caches (another engine's, for instance) are NumPy views of the
    tensors' memory, never copies; ``out``, if given, is written in place and
    returned.  ``options`` are :func:`fastattn.attention_paged`'s keyword
    options (``layout``, ``scale``, ``is_causal``, ``window``, ...); with
    ``return_lse=True`` the result is ``(out, lse)``.  Inference only.

    Examples
    --------
    >>> import torch, fastattn.torch
    >>> kc, vc = torch.randn(4, 16, 2, 8), torch.randn(4, 16, 2, 8)
    >>> q = torch.randn(2, 4, 8)
    >>> out = fastattn.torch.attention_paged(q, kc, vc, torch.tensor([[0, 1], [3, 2]]),
    ...                                      torch.tensor([20, 31]))
    >>> out.shape
    torch.Size([2, 4, 8])
    """
    named = {"query": query, "key_cache": key_cache, "value_cache": value_cache,
             "block_table": block_table, "seq_lens": seq_lens, "cu_seqlens_q": cu_seqlens_q,
             "key_scales": key_scales, "value_scales": value_scales, "out": out}
    a = {name: (None if t is None else _array(t, name)) for name, t in named.items()}
    res = _attention_paged(a.pop("query"), a.pop("key_cache"), a.pop("value_cache"),
                           a.pop("block_table"), a.pop("seq_lens"), **a, **options)
    if isinstance(res, tuple):
        return (out if out is not None else _tensor(res[0])), _tensor(res[1])
    return out if out is not None else _tensor(res)
