"""fastattn.torch over paged KV caches held in tensors: :func:`attention_paged`
and :func:`paged_append`, each read or written in place, eagerly or as the
custom operators ``fastattn::attention_paged`` and ``fastattn::paged_append``
(torch.compile, torch.export).  Inference only."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._torch_views import (Tensor as _Tensor, array_view as _array, checked_options,
                           cpu_tensors, fill_out, option_tensor as _slopes, optional_float,
                           require_tensors, subclassed as _subclassed, tensor_out,
                           tensor_view as _tensor, transformed, window_of as _window_of,
                           window_pair as _window_pair, writable_target, written)
from ._validate import as_array
from .paged import attention_paged as _attention_paged
from .paged import paged_append as _paged_append

__all__ = ["attention_paged", "paged_append"]

_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


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
    options (``layout``, ``scale``, ``is_causal``, ``window``, ...; tensors among them,
    ``alibi_slopes`` or ``sinks``, read in place too); with
    ``return_lse=True`` the result is ``(out, lse)``.  Inference only.

    Under :func:`torch.compile` and :func:`torch.export` the call is the
    custom operator ``torch.ops.fastattn.attention_paged`` (it has a fake
    implementation, so a model's step traces without a graph break); called
    eagerly it goes straight to the kernel.

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
    tensor_out(out)
    if _is_grad_enabled():
        _inference_only({**named, "alibi_slopes": options.get("alibi_slopes"),
                         "sinks": options.get("sinks")}, "attention_paged",
                        "; for training use attention_varlen")
    if _is_compiling() or _subclassed(named.values()) or transformed(query):
        return _paged_traced(named, options)
    return _paged_eager(named, options)


def _inference_only(named: dict, call: str, hint: str = "") -> None:
    """The ValueError for a tensor among ``named`` that requires grad (called
    in grad mode): ``call`` has no backward, and its result (or the cache it
    writes) would silently carry no gradient."""
    for name, t in named.items():
        if name != "out" and getattr(t, "requires_grad", False):
            raise ValueError(f"{name} requires grad, but fastattn.torch.{call} has no "
                             f"gradients (it is inference only): call it under "
                             f"torch.no_grad() or torch.inference_mode(), or pass "
                             f"{name}.detach(){hint}")


def _as_tensor(x: Any, name: str) -> _Tensor | None:
    """A block table, lengths or scales given as a sequence or array, as a
    tensor for the operator (its implementation checks the dtype and shape,
    as the eager call does)."""
    if x is None or isinstance(x, _Tensor):
        return x
    return torch.as_tensor(as_array(x, name))


def _paged_eager(named: dict, options: dict) -> Any:
    """attention_paged on NumPy views of the tensors (the operator's
    implementation too)."""
    out = named["out"]
    a = {name: (None if t is None else _array(t, name)) for name, t in named.items()}
    opts = {name: _array(t, name) for name, t in options.items()}  # alibi_slopes, sinks
    res = _attention_paged(a.pop("query"), a.pop("key_cache"), a.pop("value_cache"),
                           a.pop("block_table"), a.pop("seq_lens"), **a, **opts)
    written(out)
    if isinstance(res, tuple):
        return (out if out is not None else _tensor(res[0])), _tensor(res[1])
    return out if out is not None else _tensor(res)


_PAGED_OPTIONS = frozenset({"layout", "scale", "is_causal", "window", "alibi_slopes",
                            "softcap", "sinks", "return_lse", "num_threads"})


def _paged_traced(named: dict, options: dict) -> Any:
    """The call as the custom operator ``fastattn::attention_paged`` (what
    torch.compile and torch.export see); ``out`` is filled from its result."""
    unknown = sorted(set(options) - _PAGED_OPTIONS)
    if unknown:
        raise TypeError(f"attention_paged() got unexpected keyword arguments {unknown}")
    query = named["query"]
    require_tensors({"query": query}, "fastattn.attention_paged")
    cpu_tensors({**named, "alibi_slopes": options.get("alibi_slopes"),
                 "sinks": options.get("sinks")})
    is_causal = options.get("is_causal", True)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    wl, wr = _window_pair(options.get("window"))
    cap, nt = checked_options(options.get("softcap"), options.get("num_threads"))
    t = {name: _as_tensor(named[name], name) for name in (
        "block_table", "seq_lens", "cu_seqlens_q", "key_scales", "value_scales")}
    res, lse = torch.ops.fastattn.attention_paged(
        query, named["key_cache"], named["value_cache"], t["block_table"], t["seq_lens"],
        t["cu_seqlens_q"], t["key_scales"], t["value_scales"],
        _slopes(options.get("alibi_slopes"), query), _slopes(options.get("sinks"), query),
        str(options.get("layout", "NHD")), optional_float(options.get("scale"), "scale"),
        bool(is_causal), wl, wr, cap, nt)
    if named["out"] is not None:
        res = fill_out(named["out"], res, {**named, "out": None,
                                           "alibi_slopes": options.get("alibi_slopes"),
                                           "sinks": options.get("sinks")})
    return (res, lse) if options.get("return_lse", False) else res


@torch.library.custom_op("fastattn::attention_paged", mutates_args=(), device_types="cpu")
def _paged_op(query: _Tensor, key_cache: _Tensor, value_cache: _Tensor, block_table: _Tensor,
              seq_lens: _Tensor, cu_seqlens_q: _Tensor | None, key_scales: _Tensor | None,
              value_scales: _Tensor | None, alibi_slopes: _Tensor | None,
              sinks: _Tensor | None, layout: str, scale: float | None, is_causal: bool,
              window_left: int, window_right: int, softcap: float | None,
              num_threads: int | None) -> tuple[_Tensor, _Tensor]:
    """``fastattn::attention_paged``: the result and each row's log-sum-exp
    ``(Hq, total_q)``; a window side of -1 is unbounded."""
    named = {"query": query, "key_cache": key_cache, "value_cache": value_cache,
             "block_table": block_table, "seq_lens": seq_lens, "cu_seqlens_q": cu_seqlens_q,
             "key_scales": key_scales, "value_scales": value_scales, "out": None}
    return _paged_eager(named, dict(layout=layout, scale=scale, is_causal=is_causal,
                                    window=_window_of(window_left, window_right),
                                    alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks,
                                    return_lse=True, num_threads=num_threads))


@_paged_op.register_fake
def _paged_fake(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, key_scales,
                value_scales, alibi_slopes, sinks, layout, scale, is_causal, window_left,
                window_right, softcap, num_threads):
    total_q, hq = query.shape[0], query.shape[1]
    lse_dt = torch.float64 if query.dtype == torch.float64 else torch.float32
    return (query.new_empty((total_q, hq, value_cache.shape[-1])),
            query.new_empty((hq, total_q), dtype=lse_dt))


def paged_append(key_cache: _Tensor, value_cache: _Tensor, slot_mapping: _Tensor,
                 key: _Tensor, value: _Tensor, *, layout: str = "NHD",
                 key_scales: _Tensor | None = None, value_scales: _Tensor | None = None) -> None:
    """:func:`fastattn.paged_append` on CPU tensors: the caches (and, for
    int8 caches, the scales) written in place.

    Every check happens before anything is written.  Under
    :func:`torch.compile` and :func:`torch.export` the call is the custom
    operator ``torch.ops.fastattn.paged_append``, which declares the caches
    and scales it writes.

    Examples
    --------
    >>> import torch, fastattn.torch
    >>> kc = torch.zeros(2, 4, 1, 2, dtype=torch.bfloat16); vc = torch.zeros_like(kc)
    >>> kv = torch.ones(2, 1, 2)
    >>> fastattn.torch.paged_append(kc, vc, torch.tensor([5, -1]), kv, 2 * kv)
    >>> vc[1, 1, 0].tolist(), float(vc.sum())
    ([2.0, 2.0], 4.0)
    """
    named = {"key_cache": key_cache, "value_cache": value_cache, "slot_mapping": slot_mapping,
             "key": key, "value": value, "key_scales": key_scales, "value_scales": value_scales}
    for name in ("key_cache", "value_cache", "key_scales", "value_scales"):
        writable_target(named[name], name)
    if _is_grad_enabled():
        _inference_only({"key": key, "value": value}, "paged_append")
    if _is_compiling() or _subclassed(named.values()):
        require_tensors({name: named[name] for name in ("key_cache", "value_cache",
                                                        "slot_mapping", "key", "value")},
                        "fastattn.paged_append")
        torch.ops.fastattn.paged_append(key_cache, value_cache, slot_mapping, key, value,
                                        str(layout), key_scales, value_scales)
        return
    _append_eager(named, layout)


def _append_eager(named: dict, layout: str) -> None:
    """paged_append on NumPy views of the tensors (the operator's
    implementation too)."""
    a = {name: (None if t is None else _array(t, name)) for name, t in named.items()}
    _paged_append(a.pop("key_cache"), a.pop("value_cache"), a.pop("slot_mapping"),
                  a.pop("key"), a.pop("value"), layout=layout, **a)
    written(*(named[n] for n in ("key_cache", "value_cache", "key_scales", "value_scales")))


@torch.library.custom_op("fastattn::paged_append",
                         mutates_args=("key_cache", "value_cache", "key_scales", "value_scales"),
                         device_types="cpu")
def _paged_append_op(key_cache: _Tensor, value_cache: _Tensor, slot_mapping: _Tensor,
                     key: _Tensor, value: _Tensor, layout: str, key_scales: _Tensor | None,
                     value_scales: _Tensor | None) -> None:
    """``fastattn::paged_append``: writes the caches and scales in place."""
    _append_eager({"key_cache": key_cache, "value_cache": value_cache,
                   "slot_mapping": slot_mapping, "key": key, "value": value,
                   "key_scales": key_scales, "value_scales": value_scales}, layout)


@_paged_append_op.register_fake
def _paged_append_fake(key_cache, value_cache, slot_mapping, key, value, layout, key_scales,
                       value_scales):
    return None
