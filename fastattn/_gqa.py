"""Grouped-query attention (``enable_gqa``): the g query heads of a group
share one key/value head, which is read in place, never repeated.

Two ways through the kernel:

* **folded**: when every query row sees the same range of keys (no causal
  or window bound that cuts the rows differently; always so for one query
  row, a decoding step, whose bounds leave one range), nothing differs
  between the heads of a group but the queries (no ALiBi slopes or sinks,
  one key padding for every head, no returned weights), and the rows of the
  g heads share one stride (always so for one query row), the group's
  ``g x L`` query rows are one problem of ``g * L`` rows against its
  key/value head sliced to that range, with no bound left to apply: each key
  block is read once for the whole group instead of once per head (the
  decoding step of a model with 4 query heads per key/value head reads a
  quarter of the cache traffic).  A target (``out=``) whose strides do not
  join the g heads' rows is filled from a folded result, so its layout
  never changes the choice, nor so the result's bits (which depend on a
  problem's row count); queries or masks whose rows do not join (the packed
  ``(L, H, E)`` layout viewed head-first) run per head, as each sequence of
  :func:`fastattn.attention_varlen` does;
* **per head**: otherwise the key/value head is broadcast over a ``g`` axis
  (stride 0) and every query head is its own batch item.

Either way the result is a view written in place; no input is copied."""

from __future__ import annotations

import numpy as np

from . import _core
from . import _scores
from ._masks import UNBOUNDED, MaskPlan

__all__ = ["run_grouped", "group_heads"]

_as_strided = np.lib.stride_tricks.as_strided


def group_heads(a: np.ndarray, hkv: int, g: int) -> np.ndarray:
    """View (..., H, R, C) as (..., hkv, g, R, C) with H = hkv * g (never a copy)."""
    st = a.strides
    shape = a.shape[:-3] + (hkv, g) + a.shape[-2:]
    strides = st[:-3] + (st[-3] * g, st[-3]) + st[-2:]
    return _as_strided(a, shape, strides, writeable=a.flags.writeable)


def _merge_rows(a: np.ndarray, hkv: int) -> np.ndarray | None:
    """View (..., H, L, C), H = hkv * g, as (..., hkv, g * L, C) when one row
    stride spans the g heads and their L rows (always when L = 1), else None."""
    H, L, C = a.shape[-3:]
    if L != 1 and H // hkv != 1 and a.strides[-3] != L * a.strides[-2]:
        return None
    r = a.reshape(a.shape[:-3] + (hkv, H // hkv * L, C))  # a view: the strides allow it
    return r if np.may_share_memory(r, a) else None  # (never a copy: target is written)


def _key_range(plan: MaskPlan, L: int, S: int) -> tuple[int, int] | None:
    """The keys [lo, hi) that each of the L rows sees, all of them, under the
    plan's causal bound and window (its masks are separate operands): (0, S)
    when no bound cuts a row; for one row, the one range its bounds leave
    (causal and window sides cut a single row into a range); None when rows
    see different ranges."""
    causal, offset, wl, wr = plan[:4]
    if L != 1:
        every = ((not causal or offset >= S - 1) and (wr >= UNBOUNDED or offset + wr >= S - 1)
                 and (wl >= UNBOUNDED or offset + L - 1 - wl <= 0))
        return (0, S) if every else None
    hi = S if not causal else min(S, offset + 1)
    if wr < UNBOUNDED:
        hi = min(hi, offset + wr + 1)
    lo = 0 if wl >= UNBOUNDED else max(0, offset - wl)
    return (lo, hi) if lo < hi else None


def _run_folded(q, k, v, target, batch, hk, sc, plan, keys, nt, cap, lse) -> bool:
    """The folded call (module docstring) on the ungrouped operands, against
    the keys [lo, hi) = ``keys`` that every row sees; False (nothing written)
    when the strides of the queries or masks do not allow it."""
    S = k.shape[-2]
    lo, hi = keys
    full = batch + (q.shape[-2], S)
    bm, am, pad = plan[4:]
    if pad is not None:
        pad = np.broadcast_to(pad, batch + (1, S))
        if pad.strides[-3] != 0:  # a padding that differs between the heads
            return False
        pad = pad[..., ::pad.shape[-3] // hk, :, lo:hi]  # one row per group
    ops = (q, None if bm is None else np.broadcast_to(bm, full)[..., lo:hi],
           None if am is None else np.broadcast_to(am, full)[..., lo:hi],
           None if lse is None else lse[..., None])
    merged = [None if x is None else _merge_rows(x, hk) for x in ops]
    if any(m is None and x is not None for m, x in zip(merged, ops)):
        return False
    qf, bmf, amf, lsef = merged
    tf, dest = _merge_rows(target, hk), None
    if tf is None:  # a target whose rows do not join: the result in a new array, then copied
        dest = np.empty(target.shape, target.dtype)
        tf = _merge_rows(dest, hk)
    # the key range [lo, hi) already holds every bound: no causal limit, no window
    _core.attention(qf, k[..., lo:hi, :], v[..., lo:hi, :], tf, batch=batch[:-1] + (hk,),
                    scale=sc, bool_mask=bmf, add_mask=amf, pad=pad, num_threads=nt,
                    softcap=cap, lse=lsef)
    if dest is not None:
        target[...] = dest
    return True


def run_grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray, target: np.ndarray,
                batch: tuple, gqa: tuple[int, int], sc: float, plan: MaskPlan, weights,
                nt: int, opts: _scores.ScoreOptions | None = None,
                lse: np.ndarray | None = None) -> None:
    """attention of q (batch + (L, E)) against k, v (batch[:-1] + (hkv, S, .))
    into target (batch + (L, Ev)); lse (batch + (L,)) filled when given."""
    hk, g = gqa
    if g == 0:  # no query heads: nothing to write
        return
    L, E = q.shape[-2:]
    S = k.shape[-2]
    cap, al, sk = opts if opts is not None else (0.0, None, None)
    if q.shape[:-2] != batch:
        q = np.broadcast_to(q, batch + (L, E))
    keys = _key_range(plan, L, S) if weights is None and al is None and sk is None else None
    if keys is not None and _run_folded(q, k, v, target, batch, hk, sc, plan, keys, nt, cap, lse):
        return
    causal, offset, wl, wr, bm, am, pad = plan
    full = batch + (L, S)
    bm = None if bm is None else group_heads(np.broadcast_to(bm, full), hk, g)
    am = None if am is None else group_heads(np.broadcast_to(am, full), hk, g)
    pad = None if pad is None else group_heads(np.broadcast_to(pad, batch + (1, S)), hk, g)
    lk = None if lse is None else group_heads(lse[..., None], hk, g)
    wk = None if weights is None else group_heads(weights, hk, g)
    one = batch + (1, 1)
    al = None if al is None else group_heads(np.broadcast_to(al, one), hk, g)
    sk = None if sk is None else group_heads(np.broadcast_to(sk, one), hk, g)
    _core.attention(group_heads(q, hk, g), k[..., None, :, :], v[..., None, :, :],
                    group_heads(target, hk, g), batch=batch[:-1] + (hk, g), scale=sc,
                    causal=causal, causal_offset=offset, win_left=wl, win_right=wr,
                    bool_mask=bm, add_mask=am, pad=pad, weights=wk, num_threads=nt,
                    softcap=cap, alibi=al, sinks=sk, lse=lk)
