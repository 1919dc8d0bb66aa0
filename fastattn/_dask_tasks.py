"""The tasks of :func:`fastattn.dask.attention`: plain NumPy and fastattn,
no Dask (the graph is built in :mod:`fastattn.dask`).

* :func:`chunk_limits` -- where a (query chunk, key chunk) pair sits in the
  whole problem: pruned (nothing visible), or the kernel's causal offset and
  window sides for that pair, so that causality, the window and ALiBi see
  the global positions;
* :func:`partial_attention` -- one pair's ``(out, lse)``, in the compute dtype;
* :func:`accumulate` -- one step of a query block's running merge: a pair's
  partial merged into the result of the block's earlier key chunks;
* :func:`finish` -- the sinks (added once, here) and the result dtype;
* :func:`empty_result` -- a block no key chunk reaches.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from . import _api, _half, _scores
from ._masks import UNBOUNDED, resolve
from .merge import merge_attention

__all__ = ["Limits", "chunk_limits", "partial_attention", "accumulate", "finish",
           "empty_result", "first", "second"]


class Limits(NamedTuple):
    """A pair's kernel arguments: ``p(i') = i' + offset`` (local rows and keys),
    the window sides, and ``band`` = (lo, hi) (None: that side is open) when the
    window must be given as a boolean mask instead (``j' >= i' + lo``,
    ``j' <= i' + hi``); ``band`` is None when the sides say it all."""
    offset: int
    win_left: int
    win_right: int
    band: tuple | None


def chunk_limits(q0: int, Lc: int, s0: int, Sc: int, lo_full: int | None,
                 hi_full: int | None, pos_offset: int, alibi: bool) -> Limits | None:
    """The kernel's view of the query rows ``[q0, q0 + Lc)`` against the keys
    ``[s0, s0 + Sc)`` of a problem where query ``i`` sees the keys
    ``i + lo_full <= j <= i + hi_full`` (None: that side open) and sits at
    position ``i + pos_offset`` (ALiBi); None when no row sees any key.

    Without ALiBi the offset is free and is chosen so that both sides are
    small (the kernel drops a side wider than ``Lc + Sc``, which is right for
    a whole problem but not for a pair far from the diagonal).  With ALiBi the
    offset must be the true one; a side the kernel would drop while it still
    cuts the pair is then given as a band (an ``Lc x Sc`` boolean mask)."""
    if Lc <= 0 or Sc <= 0:
        return None
    base = q0 - s0
    lo = None if lo_full is None else base + lo_full
    hi = None if hi_full is None else base + hi_full
    first_row = 0 if hi is None else max(0, -hi)                   # i' + hi >= 0
    last_row = Lc - 1 if lo is None else min(Lc - 1, Sc - 1 - lo)  # i' + lo <= Sc - 1
    if first_row > last_row:
        return None
    has_lo = lo is not None and lo > 1 - Lc     # cuts the last row's keys
    has_hi = hi is not None and hi < Sc - 1     # cuts the first row's keys
    if alibi:
        offset = base + pos_offset
        wl = offset - lo if has_lo else UNBOUNDED
        wr = hi - offset if has_hi else UNBOUNDED
        wide = Lc + Sc + 1
        if (has_lo and wl >= wide) or (has_hi and wr >= wide):
            return Limits(offset, UNBOUNDED, UNBOUNDED,
                          (lo if has_lo else None, hi if has_hi else None))
        return Limits(offset, wl, wr, None)
    offset = hi if has_hi else (lo if has_lo else 0)
    return Limits(offset, offset - lo if has_lo else UNBOUNDED,
                  hi - offset if has_hi else UNBOUNDED, None)


class PartSpec(NamedTuple):
    """What a partial task needs besides its blocks."""
    scale: float
    limits: Limits
    query_ndim: int              # the caller's query.ndim (key_padding_mask's N axis)
    kv_heads: tuple | None       # (start, stop, index or None): the block's kv heads
    gqa: bool                    # the query heads are whole groups of the kv heads
    slopes: np.ndarray | None    # ALiBi slopes of the block's batch
    softcap: float | None
    num_threads: int             # 0: the worker's threads


def _worker_threads() -> int:
    """The threads of the dask.distributed worker running this task; 0 (the
    OpenMP default) outside a worker."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return 0
    try:
        worker = distributed.get_worker()
    except ValueError:
        return 0
    state = getattr(worker, "state", worker)
    return int(getattr(state, "nthreads", 0) or 0)


def _band_mask(plan, band: tuple, L: int, S: int, cdt: np.dtype):
    """``plan`` with the window band of an ``L x S`` pair folded into its mask."""
    lo, hi = band
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    keep = np.ones((L, S), bool)
    if lo is not None:
        keep &= j >= i + lo
    if hi is not None:
        keep &= j <= i + hi
    if plan.add_mask is not None:
        add = np.where(keep, plan.add_mask, cdt.type(-np.inf)).astype(cdt, copy=False)
        return plan._replace(add_mask=add)
    if plan.bool_mask is not None:
        keep = keep & plan.bool_mask.astype(bool)
    return plan._replace(bool_mask=keep.view(np.uint8))


def _in_dtype(mask, dtype: np.dtype):
    """A float ``mask`` rounded to the 16-bit inputs' ``dtype``, as the
    in-memory call uses it (a value beyond its range becomes infinite)."""
    if mask is None or mask.dtype == np.bool_ or mask.dtype == dtype:
        return mask
    with np.errstate(over="ignore"):
        return mask.astype(dtype)


def partial_attention(q, k, v, mask, pad, *, spec: PartSpec):
    """``(out, lse)`` of the query block against one key block, in the compute
    dtype (float32 for 16-bit inputs): the kernel, with the pair's offset and
    window."""
    if spec.kv_heads is not None:
        start, stop, index = spec.kv_heads
        k, v = k[..., start:stop, :, :], v[..., start:stop, :, :]
        if index is not None:       # query heads cut across groups: one kv head each
            k, v = np.take(k, index, axis=-3), np.take(v, index, axis=-3)
    q, k, v, cdt, _ = _api.arrays_and_dtypes(q, k, v)
    if cdt.itemsize == 2:  # 16-bit inputs: float32 partials (the result is rounded once, at
        mask = _in_dtype(mask, cdt)  # the end); K and V are still read in place as 16-bit
        cdt = _half.arith(cdt)
        q = q.astype(cdt)
    batch, gqa, L, S, _, _ = _api.problem_shape(q.shape, k.shape, v.shape, spec.gqa)
    plan = resolve(mask, False, pad, batch, L, S, cdt, spec.query_ndim)
    lim = spec.limits
    if lim.band is not None:
        plan = _band_mask(plan, lim.band, L, S, cdt)
    plan = plan._replace(causal=False, offset=lim.offset, win_left=lim.win_left,
                         win_right=lim.win_right)
    opts = _scores.resolve(spec.slopes, spec.softcap, None, batch, cdt)
    lse = np.empty(batch + (L,), cdt)
    nt = spec.num_threads or _worker_threads()
    out = _api.run_kernel(q, k, v, cdt, cdt, batch, gqa, spec.scale, plan, None, None, nt,
                           opts, lse)
    return out, lse


def accumulate(acc, q, k, v, mask, pad, *, spec: PartSpec):
    """The pair's partial ``(out, lse)`` merged into ``acc``, the merge of the
    query block's earlier key chunks (None at its first): one step of the
    block's running merge, which holds one partial at a time."""
    part = partial_attention(q, k, v, mask, pad, spec=spec)
    if acc is None:
        return part
    return merge_attention([acc[0], part[0]], [acc[1], part[1]])


def finish(part, *, sinks, odt):
    """The block's result: the sinks joined once (a row that sees no key keeps
    a zero output and ``lse = -inf``), the output in the result dtype."""
    out, lse = part
    if sinks is not None:
        sink = np.broadcast_to(np.asarray(sinks, lse.dtype)[..., None], lse.shape)
        zero = np.broadcast_to(np.zeros((), out.dtype), out.shape)
        dead = lse == -np.inf
        out, lse = merge_attention([out, zero], [lse, sink])
        lse[dead] = -np.inf
    return out.astype(odt, copy=False), lse


def empty_result(*, out_shape, cdt, odt):
    """A block no key reaches: zeros and ``lse = -inf``."""
    return np.zeros(out_shape, odt), np.full(out_shape[:-1], -np.inf, cdt)


def first(pair):
    return pair[0]


def second(pair):
    return pair[1]
