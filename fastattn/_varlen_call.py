"""The kernel's operands of a packed call (:func:`fastattn.attention_varlen`
and its backward): the options checked once, and the packed arrays viewed
heads first (a stride swap, never a copy), the grouped-query heads of a key
head as a second batch axis.  The C driver cuts each sequence out of these
views at ``cu_seqlens`` and runs all of them in one call (fastattn.h:
``fa_varlen_args``)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import _scores
from ._gqa import group_heads
from ._masks import resolve
from ._validate import check_scale, thread_count

__all__ = ["PackedCall", "packed_call"]


class PackedCall(NamedTuple):
    """One packed call's checked options, as the kernel takes them."""
    batch: tuple               # (H,), or (H_kv, g) for grouped-query heads
    scale: float
    causal: bool
    win_left: int
    win_right: int
    softcap: float             # 0: none
    alibi: np.ndarray | None   # float64 (n, *batch, 1, 1)
    sinks: np.ndarray | None   # float64 (n, *batch, 1, 1)
    num_threads: int           # 0: the OpenMP default
    seqs: tuple                # (cu_q, cu_k, lower_right): _core's seqs=

    def rows(self, a: np.ndarray) -> np.ndarray:
        """A packed (total_q, H, C) array viewed as batch + (total_q, C)."""
        h = np.moveaxis(a, 1, 0)
        return h if len(self.batch) == 1 else group_heads(h, *self.batch)

    def keys(self, a: np.ndarray) -> np.ndarray:
        """A packed (total_k, H_kv, C) array viewed as batch + (total_k, C)
        (the grouped heads' axis broadcast)."""
        h = np.moveaxis(a, 1, 0)
        return h if len(self.batch) == 1 else h[:, None]

    def lse_rows(self, lse: np.ndarray | None) -> np.ndarray | None:
        """An (H, total_q) lse (or its gradient) as batch + (total_q, 1)."""
        if lse is None:
            return None
        x = lse[..., None]
        return x if len(self.batch) == 1 else group_heads(x, *self.batch)

    def per_sequence(self, a: np.ndarray) -> np.ndarray:
        """An (n, H) array of float64 (sinks' gradient) as (n, *batch, 1, 1)."""
        x = a[..., None, None]
        return x if len(self.batch) == 1 else group_heads(x, *self.batch)


def packed_call(H: int, H_kv: int, E: int, cq: np.ndarray, ck: np.ndarray, kdt: np.dtype,
                adt: np.dtype, is_causal: Any, scale: Any, window: Any, alibi_slopes: Any,
                softcap: Any, sinks: Any, num_threads: Any) -> PackedCall:
    """The options of a packed call of H query heads over H_kv key heads of
    E features, sequences at cq, ck (int64), checked as
    :func:`fastattn.attention` checks them (kdt: the kernel's element type,
    adt: its arithmetic)."""
    sc = check_scale(scale, adt) if scale is not None else 1.0 / math.sqrt(E) if E > 0 else 1.0
    causal, _, wl, wr = resolve(None, is_causal, None, (H,), 0, 0, kdt, 3, window)[:4]
    lower_right = isinstance(is_causal, str) and is_causal == "lower_right"
    cap = _scores.resolve(None, softcap, None, (H,), adt).softcap
    n = cq.size - 1
    batch = (H,) if H == H_kv else (H_kv, H // H_kv)

    def operand(name: str, values: Any, neg_inf_ok: bool) -> np.ndarray | None:
        x = _scores.per_head(name, values, (n, H), adt, neg_inf_ok=neg_inf_ok, in_range=True)
        if x is None:
            return None
        x = x.astype(np.float64)[..., None, None]
        return x if len(batch) == 1 else group_heads(x, *batch)

    return PackedCall(batch, sc, causal, wl, wr, cap,
                      operand("alibi_slopes", alibi_slopes, False),
                      operand("sinks", sinks, True),
                      0 if num_threads is None else thread_count(num_threads),
                      (cq, ck, lower_right))
