"""Argument checks shared by :func:`fastattn.attention_varlen` and its
reference, :func:`fastattn.reference.attention_varlen` (plain NumPy only, so
that the reference needs nothing compiled)."""

from __future__ import annotations

import numpy as np

from ._validate import as_array

__all__ = ["check_cu_seqlens", "check_packed"]


def check_cu_seqlens(name: str, cu_seqlens, total: int, what: str) -> np.ndarray:
    """``cu_seqlens`` as int64, after checking flash-attn's conventions."""
    a = as_array(cu_seqlens, name)
    if a.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"{name} must be int32 or int64, got dtype {a.dtype}")
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be 1-D with n + 1 >= 1 entries, got shape {a.shape}")
    if a[0] != 0 or a[-1] != total:
        raise ValueError(f"{name} must start at 0 and end at {total} (the rows of {what}), "
                         f"got {a[0]} ... {a[-1]}")
    if np.any(np.diff(a) < 0):
        raise ValueError(f"{name} must be non-decreasing, got {a}")
    return a.astype(np.int64)


def check_packed(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens_q, cu_seqlens_k
                 ) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(H, H_kv, cu_seqlens_q, cu_seqlens_k as int64) of a packed batch:
    query (total_q, H, D), key (total_k, H_kv, D), value (total_k, H_kv, Dv),
    after checking that the shapes and both cu_seqlens fit."""
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim != 3:
            raise ValueError(f"{name} must have shape (total, heads, dim), got shape {a.shape}")
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(f"shapes do not fit (total_q, H, D), (total_k, H_kv, D), "
                         f"(total_k, H_kv, Dv): query {q.shape}, key {k.shape}, value {v.shape}")
    H, H_kv = q.shape[1], k.shape[1]
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_kv}): "
                         f"query {q.shape}, key {k.shape}")
    cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "query")
    ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], "key")
    if cq.shape != ck.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length, "
                         f"got {cq.shape} and {ck.shape}")
    return H, H_kv, cq, ck
