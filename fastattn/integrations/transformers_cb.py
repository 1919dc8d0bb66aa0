"""``transformers``' continuous batching (``model.generate_batch``) on fastattn.

:func:`fastattn.integrations.transformers.register` calls :func:`install`; a
user calls nothing else.  Continuous batching in ``transformers`` 5.x
(tested: 5.24) accepts only ``paged|eager``, ``sdpa`` and flash-attention
names, and its :class:`PagedAttentionCache` gathers every sequence's whole
context per layer and step (``index_select``) before attention runs.
:func:`install` wraps two of its methods, only for the names fastattn was
registered under (every other implementation runs unchanged):

- ``ContinuousBatchingManager.switch_to_cb_friendly_attn`` accepts the name
  as it is (no mask is built for it: transformers builds its
  ``(1, 1, M, N + M)`` masks only for ``paged|eager`` and ``sdpa``);
- ``PagedAttentionCache.update``, for a layer of full attention, writes the
  step's new keys and values into the cache and reads nothing back: it
  hands the attention function the layer's block pools (the cache's own
  ``(pages, page_size, Hkv, D)`` views) and the step's sequences: each one's
  block table (from the step's read indices), its length and the query
  offsets, as int64 NumPy arrays, built once per step by its first
  full-attention layer and kept for the others; the attention function calls
  :func:`fastattn.attention_paged` on NumPy views of the query, the pools and
  its result, in place.  A layer of
  sliding-window attention keeps transformers' path: its cache is a ring
  buffer (a position's slot is ``position % window``), which is not a block
  table's order, and what it gathers is at most the window; its attention is
  :func:`fastattn.attention_varlen` over the gathered keys.

Both wraps are installed only when the two methods exist with the arguments
they are written for; otherwise :func:`install` returns False and
``generate_batch`` refuses fastattn as before.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import numpy as np
import torch

from ..paged import attention_paged as _attention_paged
from ..varlen import attention_varlen as _attention_varlen

__all__ = ["install", "is_batching_call", "batching_attention"]

_NAMES: set[str] = set()
_UPDATE_ARGS = ["self", "key_states", "value_states", "layer_idx", "kwargs"]
_SWITCH_ARGS = ["self", "model", "auto_switch_to_flash"]
_KEY = "fastattn_pages"  # the kwarg the cache hands the attention function


def install(name: str) -> bool:
    """Let continuous batching run with the attention implementation ``name``.

    ``name`` is one fastattn's backend is registered under (``register``
    calls this).  Idempotent; each wrap is installed once for all names.

    Parameters
    ----------
    name : str

    Returns
    -------
    bool
        False (nothing installed) when this ``transformers`` has no
        continuous batching of the form the wraps are written for.

    Examples
    --------
    >>> from fastattn.integrations import transformers_cb
    >>> transformers_cb.install("fastattn")
    True
    """
    try:
        from transformers.generation.continuous_batching import cache as cb_cache
        from transformers.generation.continuous_batching import continuous_api
    except ImportError:
        return False
    manager = getattr(continuous_api, "ContinuousBatchingManager", None)
    paged = getattr(cb_cache, "PagedAttentionCache", None)
    if manager is None or paged is None or not (
            _takes(getattr(manager, "switch_to_cb_friendly_attn", None), _SWITCH_ARGS)
            and _takes(getattr(paged, "update", None), _UPDATE_ARGS)):
        return False
    _NAMES.add(name)
    if not getattr(paged.update, "_fastattn", False):
        paged.update = _wrap_update(paged.update)
        manager.switch_to_cb_friendly_attn = _wrap_switch(manager.switch_to_cb_friendly_attn)
    return True


def _takes(fn, names: list[str]) -> bool:
    """Whether ``fn`` is a function whose parameters start with ``names``."""
    fn = getattr(fn, "_fastattn_wrapped", fn)
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return params[:len(names)] == names


def _wrap_switch(switch):
    def switch_to_cb_friendly_attn(self, model, auto_switch_to_flash=True):
        if model.config._attn_implementation in _NAMES:
            return None
        return switch(self, model, auto_switch_to_flash)
    switch_to_cb_friendly_attn._fastattn_wrapped = switch
    return switch_to_cb_friendly_attn


def _wrap_update(update):
    @torch.compiler.disable
    def paged_update(self, key_states, value_states, layer_idx, kwargs):
        if (self.config._attn_implementation not in _NAMES
                or kwargs.get("block_table") is not None):
            return update(self, key_states, value_states, layer_idx, kwargs)
        allocator = self.layer_to_allocator[layer_idx]
        read = kwargs["read_index"][allocator.index]
        cu_k = kwargs["cu_seq_lens_k"]
        cu_k = cu_k[allocator.layer_type] if isinstance(cu_k, dict) else cu_k
        step = _step(self, allocator, layer_idx, read, cu_k, kwargs["cu_seq_lens_q"])
        if step is None:
            return update(self, key_states, value_states, layer_idx, kwargs)
        kwargs["cu_seq_lens_k"] = cu_k
        max_k = kwargs["max_length_k"]
        kwargs["max_length_k"] = max_k[allocator.layer_type] if isinstance(max_k, dict) else max_k
        # the write only: an empty read index is the allocator's no-read path
        allocator.update(key_states[0].transpose(0, 1), value_states[0].transpose(0, 1),
                         layer_idx, read[:0], kwargs["write_index"][allocator.index])
        k_pages, v_pages = allocator.get_cache_for_block_table(layer_idx)
        kwargs[_KEY] = (k_pages, v_pages, step)
        return key_states, value_states
    paged_update._fastattn = True
    paged_update._fastattn_wrapped = update
    return paged_update


class _Step:
    """What every full-attention layer of one batching step shares, computed
    by its first layer: each sequence's block table and length, the query
    offsets (NumPy int64, the kernel's form, so no layer converts them
    again) and the number of real query rows."""
    __slots__ = ("table", "lens", "cu_q", "nq")

    def __init__(self, table, lens, cu_q, nq: int):
        self.table, self.lens, self.cu_q, self.nq = table, lens, cu_q, nq


def _step(cache, allocator, layer_idx: int, read: torch.Tensor, cu_k: torch.Tensor,
          cu_q: torch.Tensor):
    """The step's :class:`_Step` for ``allocator``'s layers, None where the
    pages cannot be read in place (a sliding-window allocator, nothing cached
    yet, read indices that are not one per key).  Kept for the step's other
    layers: transformers makes new index tensors for every batch, so the same
    three tensors mean the same batch."""
    memo = cache.__dict__.setdefault("_fastattn_steps", {})
    hit = memo.get(allocator.index)
    if hit is not None and hit[0]() is read and hit[1]() is cu_k and hit[2]() is cu_q:
        return hit[3]
    step = None
    if (allocator.supports_block_table and read.numel() != 0
            and read.numel() == int(cu_k[-1])):
        page = allocator.get_cache_for_block_table(layer_idx)[0].shape[1]
        table, lens = _tables(read, cu_k, page)
        cu = cu_q.numpy().astype(np.int64)
        step = _Step(table, lens, cu, int(cu[-1]))
    memo[allocator.index] = (weakref.ref(read), weakref.ref(cu_k), weakref.ref(cu_q), step)
    return step


def _tables(read: torch.Tensor, cu_k: torch.Tensor, page: int):
    """Each sequence's block table and length (NumPy int64) from a
    full-attention layer's read indices (its positions' slots in order: page
    ``j`` of a sequence starts at slot ``read[cu_k[b] + j * page]``)."""
    cu = cu_k.numpy().astype(np.int64)
    lens = cu[1:] - cu[:-1]
    pages = (int(lens.max()) + page - 1) // page
    at = np.arange(pages, dtype=np.int64) * page
    pos = np.where(at[None, :] < lens[:, None], cu[:-1, None] + at[None, :], 0)
    return read.numpy()[pos] // page, lens


def is_batching_call(kwargs: dict[str, Any]) -> bool:
    """Whether the attention function was called by continuous batching."""
    return _KEY in kwargs or ("read_index" in kwargs and "cu_seq_lens_q" in kwargs)


def batching_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       kwargs: dict[str, Any], *, causal: bool, scale, window, softcap,
                       sinks, num_threads: int) -> torch.Tensor:
    """A continuous-batching step's attention: query (1, H, total_q, E), key
    and value (1, Hkv, total_k, E|Ev) -> (1, total_q, H, Ev); over the cache's
    pages when the cache handed them, else over the packed keys."""
    opts = dict(scale=scale, window=window, softcap=softcap, num_threads=num_threads)
    pages = kwargs.get(_KEY)
    if pages is not None:
        return _over_pages(query, pages, causal, sinks, opts)
    cu_q = kwargs["cu_seq_lens_q"]
    nq = int(cu_q[-1])
    q = query[0].transpose(0, 1)[:nq]
    out = _result(query, nq, value.shape[-1])
    cu_k = kwargs["cu_seq_lens_k"]
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    _attention_varlen(_view(q), _view(k), _view(v), _view(cu_q), _view(cu_k),
                      is_causal="lower_right" if causal else False, sinks=_view(sinks),
                      out=_view(out[0, :nq]), **opts)
    return out


def _result(query: torch.Tensor, nq: int, ev: int) -> torch.Tensor:
    """The (1, total_q, H, Ev) result; rows past the last sequence (padding)
    are zero."""
    shape = (1, query.shape[2], query.shape[1], ev)
    return (torch.empty if nq == shape[1] else torch.zeros)(shape, dtype=query.dtype)


def _over_pages(query: torch.Tensor, pages: tuple, causal: bool, sinks, opts: dict):
    """The step's attention over a full-attention layer's pages, read in
    place: NumPy views of the query, the pools and the result, the step's
    kernel-form block tables."""
    k_pages, v_pages, step = pages
    out = _result(query, step.nq, v_pages.shape[-1])
    q = _view(query)[0].transpose(1, 0, 2)[:step.nq]
    _attention_paged(q, _view(k_pages), _view(v_pages), step.table, step.lens,
                     cu_seqlens_q=step.cu_q, is_causal=causal, sinks=_view(sinks),
                     out=_view(out)[0, :step.nq], **opts)
    return out


def _view(t: torch.Tensor | None):
    """The NumPy view of CPU tensor ``t`` (bfloat16 as ``ml_dtypes.bfloat16``,
    which the model's bfloat16 cache then needs)."""
    if t is None:
        return None
    t = t.detach()
    if t.dtype is torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
