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
  ``(pages, page_size, Hkv, D)`` views), each sequence's block table (from
  the step's read indices) and its length, and the attention function calls
  :func:`fastattn.torch.attention_paged` on them, in place.  A layer of
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

import torch

from ..torch import attention_paged as _attention_paged
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
        if (not allocator.supports_block_table or read.numel() == 0
                or read.numel() != int(cu_k[-1])):
            return update(self, key_states, value_states, layer_idx, kwargs)
        kwargs["cu_seq_lens_k"] = cu_k.to(torch.int32)
        max_k = kwargs["max_length_k"]
        kwargs["max_length_k"] = max_k[allocator.layer_type] if isinstance(max_k, dict) else max_k
        # the write only: an empty read index is the allocator's no-read path
        allocator.update(key_states[0].transpose(0, 1), value_states[0].transpose(0, 1),
                         layer_idx, read[:0], kwargs["write_index"][allocator.index])
        k_pages, v_pages = allocator.get_cache_for_block_table(layer_idx)
        table, lens = _tables(self, allocator.index, read, cu_k, k_pages.shape[1])
        kwargs[_KEY] = (k_pages, v_pages, table, lens)
        return key_states, value_states
    paged_update._fastattn = True
    paged_update._fastattn_wrapped = update
    return paged_update


def _tables(cache, index: int, read: torch.Tensor, cu_k: torch.Tensor, page: int):
    """Each sequence's block table and length from a full-attention layer's
    read indices (its positions' slots in order: page ``j`` of a sequence
    starts at slot ``read[cu_k[b] + j * page]``), kept for the step's other
    layers (the same read-index tensor)."""
    memo = cache.__dict__.setdefault("_fastattn_tables", {})
    hit = memo.get(index)
    if hit is not None and hit[0]() is read and hit[1]() is cu_k:
        return hit[2]
    cu = cu_k.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    pages = (int(lens.max()) + page - 1) // page
    at = torch.arange(pages, dtype=torch.int64) * page
    pos = torch.where(at[None, :] < lens[:, None], cu[:-1, None] + at[None, :], 0)
    res = (read[pos] // page, lens)
    memo[index] = (weakref.ref(read), weakref.ref(cu_k), res)
    return res


def is_batching_call(kwargs: dict[str, Any]) -> bool:
    """Whether the attention function was called by continuous batching."""
    return _KEY in kwargs or ("read_index" in kwargs and "cu_seq_lens_q" in kwargs)


def batching_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       kwargs: dict[str, Any], *, causal: bool, scale, window, softcap,
                       sinks, num_threads: int) -> torch.Tensor:
    """A continuous-batching step's attention: query (1, H, total_q, E), key
    and value (1, Hkv, total_k, E|Ev) -> (1, total_q, H, Ev); over the cache's
    pages when the cache handed them, else over the packed keys."""
    cu_q = kwargs["cu_seq_lens_q"]
    nq = int(cu_q[-1])
    q = query[0].transpose(0, 1)[:nq]
    shape = (1, query.shape[2], query.shape[1], value.shape[-1])
    # rows past the last sequence (padding) are zero
    out = (torch.empty if nq == shape[1] else torch.zeros)(shape, dtype=query.dtype)
    opts = dict(scale=scale, window=window, softcap=softcap, num_threads=num_threads)
    pages = kwargs.get(_KEY)
    if pages is not None:
        k_pages, v_pages, table, lens = pages
        _attention_paged(q, k_pages, v_pages, table, lens, cu_seqlens_q=cu_q, is_causal=causal,
                         sinks=sinks, out=out[0, :nq], **opts)
        return out
    cu_k = kwargs["cu_seq_lens_k"]
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    _attention_varlen(_view(q), _view(k), _view(v), _view(cu_q), _view(cu_k),
                      is_causal="lower_right" if causal else False, sinks=_view(sinks),
                      out=_view(out[0, :nq]), **opts)
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
