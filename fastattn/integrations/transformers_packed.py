"""One row of packed sequences in the transformers backend: the check that
a mask is exactly their pattern, and the operator that runs the row under
``torch.compile``.

Eagerly, the backend finds the documents (a flattening collator's
``cu_seq_lens_q`` / ``cu_seq_lens_k``, or restarting ``position_ids``) and
checks the mask in Python (:func:`row_offsets`, from ``transformers.py``'s
``_packed_rows``), then runs :func:`fastattn.torch.attention_varlen`.  While
``torch.compile`` traces, no tensor's values can be read, so a call that
carries the collator's offsets, or ``position_ids`` and a mask, becomes the
operator ``fastattn::packed_rows`` (:func:`packed_or_masked`), which makes
the same decision when it runs: the documents through ``attention_varlen``
where they are found and the mask (if any) is their pattern, else the mask
as it is (or, with no mask, the causal row with its window) -- the eager
call's result either way.  Its
backward is the operator ``fastattn::packed_rows_backward``, down the branch
the forward took.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._api import attention as _attention
from ..backward import attention_backward as _attention_backward
from ..varlen import attention_varlen as _attention_varlen
from ..varlen_backward import attention_varlen_backward as _attention_varlen_backward
from .._torch_views import (array_view, constants, fake_grads, tensor_view, window_of,
                            window_pair)

__all__ = ["PATTERN_ROWS", "is_packed_pattern", "offsets_of", "restarts", "row_offsets",
           "packed_or_masked"]

_Tensor = torch.Tensor


def offsets_of(cu_q: _Tensor, cu_k: _Tensor, L: int, mask: _Tensor | None, causal: bool,
               window: tuple | None, *, given: bool) -> _Tensor | None:
    """The packed row's offsets (int64, from 0 to L) when ``cu_q`` and ``cu_k``
    are the same valid offsets and ``mask`` is None or exactly their pattern,
    else None.  Offsets ``given`` by a flattening collator also stand against
    the row's own pattern (causal, with the window, or full: the mask
    transformers builds where it does not see the packing, e.g. with its
    cache on), as where the backend's mask function returned no mask for it;
    offsets found from ``position_ids`` do not."""
    if cu_q.ndim != 1 or cu_q.shape != cu_k.shape or not torch.equal(cu_q, cu_k):
        return None
    cu = cu_q.to(torch.int64)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != L or bool((cu[1:] < cu[:-1]).any()):
        return None
    if mask is None or is_packed_pattern(mask, cu, causal, window):
        return cu
    whole = cu.new_tensor([0, L])
    return cu if given and is_packed_pattern(mask, whole, causal, window) else None


def restarts(position_ids: _Tensor, L: int) -> _Tensor | None:
    """The offsets (int64, from 0 to L) of the sequences of a row of ``L``
    positions, a sequence starting where a position does not follow its
    predecessor by 1 (as transformers finds packed sequences); None for one
    sequence (the mask path is as fast) or positions of another length."""
    if position_ids.shape[-1] != L or position_ids.numel() < L:
        return None
    pos = position_ids.reshape(-1, L)[0]
    starts = torch.nonzero(pos[1:] - pos[:-1] != 1).flatten() + 1
    if starts.numel() == 0:
        return None
    return torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), L)])


def row_offsets(cu_q: _Tensor | None, cu_k: _Tensor | None, position_ids: _Tensor | None,
                L: int, mask: _Tensor | None, causal: bool, window: tuple | None
                ) -> _Tensor | None:
    """A row's documents: a flattening collator's offsets (``cu_q``, ``cu_k``
    tensors) where given, else the restarts of ``position_ids`` with a mask
    (that must then be their pattern); checked by :func:`offsets_of`.
    None: the row is read through its mask."""
    if cu_q is not None:
        return None if cu_k is None else offsets_of(cu_q, cu_k, L, mask, causal, window,
                                                    given=True)
    cu = None if position_ids is None or mask is None else restarts(position_ids, L)
    return None if cu is None else offsets_of(cu, cu, L, mask, causal, window, given=False)


PATTERN_ROWS = 256  # rows of the mask compared at a time (is_packed_pattern)


# The last masks checked (a model hands the same mask to each of its layers
# of a kind; two kinds alternate in Gemma 2 and gpt-oss; a mask may be
# checked against the documents and then the whole row): (weak reference to
# the mask, what it was checked against with its version counter, verdict).
_checked: list[tuple[Any, tuple, bool]] = []


def is_packed_pattern(mask, cu, causal, window) -> bool:
    """Whether ``mask`` ((1, 1, L, L): bool True = attend, or float 0 / -inf)
    is exactly attention within the sequences of ``cu``, causal (and in the
    window) if so; a mask checked before against the same arguments, and not
    written since, is not read again (an inference tensor, which has no
    version counter, always is)."""
    L = int(cu[-1])
    if mask.shape[-2:] != (L, L) or mask.numel() != L * L:
        return False
    if mask.is_inference():
        return _pattern_of_bands(mask, cu, causal, window)
    key = (mask._version, tuple(cu.tolist()), bool(causal), window)
    for ref, seen, verdict in _checked:
        if ref() is mask and seen == key:
            return verdict
    verdict = _pattern_of_bands(mask, cu, causal, window)
    _checked[:] = [(weakref.ref(mask), key, verdict)] + _checked[:3]
    return verdict


def _pattern_of_bands(mask, cu, causal, window) -> bool:
    """is_packed_pattern's check of an (L, L) mask, a band of rows at a time,
    so that its own temporaries stay a small part of the mask."""
    L = int(cu[-1])
    seg = torch.searchsorted(cu[1:], torch.arange(L), right=True)
    got_all = mask.reshape(L, L)
    j = torch.arange(L)[None, :]
    for r0 in range(0, L, PATTERN_ROWS):
        r1 = min(L, r0 + PATTERN_ROWS)
        i = torch.arange(r0, r1)[:, None]
        want = seg[r0:r1, None] == seg[None, :]
        if causal:
            want &= j <= i
            if window is not None:
                want &= j >= i - window[0]
        got = got_all[r0:r1]
        if got.dtype is not torch.bool:
            attend = got == 0
            if not bool((attend | (got == float("-inf"))).all()):
                return False
            got = attend
        if not torch.equal(got, want):
            return False
    return True


# ---------------------------------------------------------------------------
# the operator traced in place of a packed row
# ---------------------------------------------------------------------------

def packed_or_masked(query: _Tensor, key: _Tensor, value: _Tensor, mask: _Tensor | None,
                     cu_q: _Tensor | None, cu_k: _Tensor | None,
                     position_ids: _Tensor | None, *, causal: bool, window: tuple | None,
                     scale: float | None, softcap: float | None, sinks: _Tensor | None,
                     num_threads: int | None) -> _Tensor:
    """The row's attention as ``fastattn::packed_rows``: query ``(1, H, L, E)``,
    key and value ``(1, Hkv, L, .)``, ``mask`` ``(1, 1, L, L)`` (bool True =
    attend, or float 0 / -inf) or None, the documents as :func:`row_offsets`
    finds them when it runs -> ``(1, L, H, Ev)``, differentiable in query,
    key, value and ``sinks``."""
    constants({"attention_mask": mask})
    wl, wr = window_pair(window)
    return torch.ops.fastattn.packed_rows(query, key, value, mask, cu_q, cu_k, position_ids,
                                          causal, wl, wr, scale, softcap, sinks,
                                          num_threads)[0]


@torch.library.custom_op("fastattn::packed_rows", mutates_args=(), device_types="cpu")
def _packed_rows_op(query: _Tensor, key: _Tensor, value: _Tensor, mask: _Tensor | None,
                    cu_q: _Tensor | None, cu_k: _Tensor | None, position_ids: _Tensor | None,
                    causal: bool, window_left: int, window_right: int, scale: float | None,
                    softcap: float | None, sinks: _Tensor | None, num_threads: int | None
                    ) -> tuple[_Tensor, _Tensor, _Tensor]:
    """``fastattn::packed_rows``: the result ``(1, L, H, Ev)``, each row's
    log-sum-exp ``(H, L)``, and 1 where the documents ran alone (else 0: the
    mask, or the causal row, as it is)."""
    a = array_view
    _, H, L, _ = query.shape
    window = window_of(window_left, window_right)
    cu = row_offsets(cu_q, cu_k, position_ids, L, mask, causal, window)
    with torch.no_grad():
        if cu is not None:
            q, k, v = (a(x[0].transpose(0, 1), n) for x, n in ((query, "query"), (key, "key"),
                                                                  (value, "value")))
            out, lse = _attention_varlen(q, k, v, a(cu, "cu_q"), a(cu, "cu_k"),
                                         is_causal="lower_right" if causal else False,
                                         scale=scale, window=window, softcap=softcap,
                                         sinks=a(sinks, "sinks"), return_lse=True,
                                         num_threads=num_threads)
            return tensor_view(out)[None], torch.from_numpy(lse), torch.ones((), dtype=torch.int64)
        res = torch.empty((1, L, H, value.shape[-1]), dtype=query.dtype)
        is_causal, win = _masked(mask, causal, window)
        _, lse = _attention(a(query, "query"), a(key, "key"), a(value, "value"),
                            a(mask, "mask"), is_causal, scale, key.shape[1] != H, window=win,
                            softcap=softcap, sinks=a(sinks, "sinks"), return_lse=True,
                            out=a(res.transpose(1, 2), "out"), num_threads=num_threads)
        return res, torch.from_numpy(lse[0]), torch.zeros((), dtype=torch.int64)


def _masked(mask, causal, window) -> tuple:
    """(is_causal, window) of the branch that reads the mask: the mask alone,
    or with none the causal row (lower-right) with its window."""
    if mask is not None:
        return False, None
    return ("lower_right" if causal else False), window


@_packed_rows_op.register_fake
def _packed_rows_fake(query, key, value, mask, cu_q, cu_k, position_ids, causal, window_left,
                      window_right, scale, softcap, sinks, num_threads):
    _, H, L, _ = query.shape
    lse_dt = torch.float64 if query.dtype == torch.float64 else torch.float32
    return (query.new_empty((1, L, H, value.shape[-1])), query.new_empty((H, L), dtype=lse_dt),
            query.new_empty((), dtype=torch.int64))


@torch.library.custom_op("fastattn::packed_rows_backward", mutates_args=(), device_types="cpu")
def _packed_rows_backward_op(grad_out: _Tensor, grad_lse: _Tensor | None, query: _Tensor,
                             key: _Tensor, value: _Tensor, mask: _Tensor | None,
                             cu_q: _Tensor | None, position_ids: _Tensor | None, out: _Tensor,
                             lse: _Tensor, alone: _Tensor, causal: bool, window_left: int,
                             window_right: int, scale: float | None, softcap: float | None,
                             sinks: _Tensor | None, num_threads: int | None
                             ) -> tuple[_Tensor, _Tensor, _Tensor, _Tensor]:
    """``fastattn::packed_rows_backward``: the gradients of
    ``fastattn::packed_rows`` in query, key, value and sinks (an empty tensor
    without sinks), down the branch its forward took (``alone``), from the
    gradients flowing into its result and (None: zero) its lse."""
    a = array_view
    window = window_of(window_left, window_right)
    common = dict(scale=scale, softcap=softcap, sinks=a(sinks, "sinks"),
                  num_threads=num_threads)
    if bool(alone):
        L = query.shape[2]  # the forward found these offsets valid
        cu = a(cu_q.to(torch.int64) if cu_q is not None else restarts(position_ids, L), "cu")
        rows = [a(x[0].transpose(0, 1), n) for x, n in ((query, "query"), (key, "key"),
                                                        (value, "value"))]
        grads = _attention_varlen_backward(a(grad_out[0], "grad_out"), *rows, a(out[0], "out"),
                                           a(lse, "lse"), cu, cu, window=window,
                                           is_causal="lower_right" if causal else False,
                                           grad_lse=a(grad_lse, "grad_lse"), **common)
        # (L, heads, .) -> the inputs' (1, heads, L, .), contiguous as the fake's
        qkv = [tensor_view(g).transpose(0, 1).contiguous()[None] for g in grads[:3]]
    else:
        is_causal, win = _masked(mask, causal, window)
        grads = _attention_backward(a(grad_out.transpose(1, 2), "grad_out"), a(query, "query"),
                                    a(key, "key"), a(value, "value"),
                                    a(out.transpose(1, 2), "out"), a(lse[None], "lse"),
                                    a(mask, "mask"), is_causal,
                                    enable_gqa=key.shape[1] != query.shape[1], window=win,
                                    grad_lse=None if grad_lse is None else a(grad_lse[None],
                                                                             "grad_lse"),
                                    **common)
        qkv = [tensor_view(g) for g in grads[:3]]
    d_sinks = torch.from_numpy(grads[3]) if sinks is not None else query.new_empty(0)
    return qkv[0], qkv[1], qkv[2], d_sinks


@_packed_rows_backward_op.register_fake
def _packed_rows_backward_fake(grad_out, grad_lse, query, key, value, mask, cu_q,
                               position_ids, out, lse, alone, causal, window_left,
                               window_right, scale, softcap, sinks, num_threads):
    return fake_grads(query, key, value, sinks)


def _setup(ctx, inputs, output) -> None:
    (q, k, v, mask, cu_q, cu_k, pos, causal, wl, wr, scale, cap, sinks, nt) = inputs
    constants({"attention_mask": mask})
    ctx.options = (causal, wl, wr, scale, cap, nt)
    ctx.has_sinks = sinks is not None
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, mask, cu_q, pos, sinks, *output)


def _backward(ctx, grad_out, grad_lse, grad_alone):
    q, k, v, mask, cu_q, pos, sinks, out, lse, alone = ctx.saved_tensors
    causal, wl, wr, scale, cap, nt = ctx.options
    if grad_out is None and grad_lse is None:
        return (None,) * 14
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, ds = torch.ops.fastattn.packed_rows_backward(
        grad_out, grad_lse, q, k, v, mask, cu_q, pos, out, lse, alone, causal, wl, wr, scale,
        cap, sinks, nt)
    return (dq, dk, dv) + (None,) * 9 + (ds if ctx.has_sinks else None, None)


torch.library.register_autograd("fastattn::packed_rows", _backward, setup_context=_setup)
