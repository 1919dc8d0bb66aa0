"""The int8 KV cache's two operations, for :class:`fastattn.kvcache.KVCache`:
quantising appended rows (:func:`quantize_rows`) and attention of float32
queries over the cache (:func:`attend`), both in C (``fa_quantize_q8``,
``fa_decode_q8``).  Validation lives here; the bridge only passes pointers."""

from __future__ import annotations

import math

import numpy as np

from . import _core
from ._masks import UNBOUNDED, check_window
from ._scores import check_softcap, per_head
from ._validate import as_array, check_scale, thread_count

__all__ = ["attend", "check_finite_rows", "quantize_rows"]


def check_finite_rows(x32: np.ndarray, name: str, shape: tuple) -> None:
    """ValueError naming ``name`` (of shape ``shape``) if the float32 rows
    ``x32`` hold a NaN or an infinity (a NaN or infinity given, or a finite
    value beyond float32's range, as its scales are), which an int8 cache
    cannot store."""
    if x32.size and not np.isfinite(x32).all():
        bad = x32[~np.isfinite(x32)][:4]
        raise ValueError(f"{name} of shape {shape} has entries that are not finite in float32 "
                         f"{bad}: an int8 cache (its scales float32) cannot store NaN, +-inf or "
                         f"values beyond +-3.4e38 (the cache was left unchanged)")


def quantize_rows(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x[..., :]`` as ``(levels int8, scales float32)``, symmetric:
    scale = max|row| / 127, levels = round-half-even(row / scale).  A
    non-finite entry cannot be represented: ValueError naming ``name``."""
    with np.errstate(over="ignore"):  # beyond float32's range: refused just below
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    check_finite_rows(x32, name, x.shape)
    rows = x32.reshape(-1, x32.shape[-1])
    levels = np.empty(rows.shape, np.int8)
    scales = np.empty(rows.shape[0], np.float32)
    if rows.size:
        _core.quantize_q8(rows, levels, scales)
    else:
        scales[:] = 0
    return levels.reshape(x32.shape), scales.reshape(x32.shape[:-1])


def check_query_shape(q: np.ndarray, batch_size: int, num_kv_heads: int, head_dim: int) -> None:
    """The ValueError for a cache's query not of shape (batch_size, Hq, L,
    head_dim) with Hq a multiple of num_kv_heads."""
    if (q.ndim != 4 or q.shape[0] != batch_size or q.shape[3] != head_dim
            or q.shape[1] % num_kv_heads != 0 or q.shape[1] == 0):
        raise ValueError(f"query must have shape (batch_size={batch_size}, Hq, L, "
                         f"head_dim={head_dim}) with Hq a multiple of num_kv_heads="
                         f"{num_kv_heads}, got {q.shape}")


def _query(query, batch_size: int, num_kv_heads: int, head_dim: int) -> np.ndarray:
    """``query`` as a float32 (B, Hq, L, E) array with unit column stride."""
    q = as_array(query, "query")
    if q.dtype.kind not in "f" or q.dtype == np.float64:
        raise TypeError(f"query must be float32 or float16 for an int8 cache (it serves "
                        f"float32 work), got dtype {q.dtype}")
    check_query_shape(q, batch_size, num_kv_heads, head_dim)
    q = q.astype(np.float32, copy=False)
    if q.strides[3] != 4 or not q.flags.aligned:
        q = np.ascontiguousarray(q)
    return q


def _padding(key_padding_mask, B: int, S: int) -> np.ndarray | None:
    """``key_padding_mask`` (bool, True = padding, shape (S,) or (B, S)) as
    C-ordered uint8 (B, S), or None."""
    if key_padding_mask is None:
        return None
    m = as_array(key_padding_mask, "key_padding_mask")
    if m.dtype != bool:
        raise TypeError(f"key_padding_mask must be boolean (True = padding), got dtype "
                        f"{m.dtype}")
    if m.shape not in ((S,), (B, S)):
        raise ValueError(f"key_padding_mask has shape {m.shape}; expected ({S},) or "
                         f"({B}, {S}) (S={S} cached keys)")
    return np.ascontiguousarray(np.broadcast_to(m, (B, S)), dtype=np.uint8)


def attend(k8, ks, v8, vs, num_kv_heads, head_dim, query, *, scale, key_padding_mask,
           window, softcap, alibi_slopes, sinks, return_lse, num_threads):
    """Attention of ``query`` (B, Hq, L, E) over the filled int8 cache
    ``k8``, ``v8`` (B, Hkv, S, d) with scales ``ks``, ``vs`` (B, Hkv, S),
    causal, lower-right aligned -> out float32 (B, Hq, L, Ev) [, lse]."""
    B, _, S, _ = k8.shape
    q = _query(query, B, num_kv_heads, head_dim)
    Hq, L = q.shape[1], q.shape[2]
    sc = 1.0 / math.sqrt(head_dim) if scale is None else check_scale(scale, np.dtype(np.float32))
    left, right = check_window(window)
    cap = check_softcap(softcap, np.float32)
    # checked as float32, the kernel's arithmetic; passed as float64
    alibi = per_head("alibi_slopes", alibi_slopes, (B, Hq), np.float32, in_range=True,
                     contiguous=True)
    sink = per_head("sinks", sinks, (B, Hq), np.float32, neg_inf_ok=True, in_range=True,
                    contiguous=True)
    alibi, sink = (None if x is None else x.astype(np.float64) for x in (alibi, sink))
    pad = _padding(key_padding_mask, B, S)
    nt = thread_count(num_threads)
    out = np.empty((B, Hq, L, v8.shape[3]), np.float32)
    lse = np.empty((B, Hq, L), np.float32) if return_lse else None
    _core.decode_q8(q, k8, ks, v8, vs, out, lse=lse, scale=sc, causal=True,
                    causal_offset=S - L,
                    win_left=UNBOUNDED if left is None else min(left, UNBOUNDED),
                    win_right=UNBOUNDED if right is None else min(right, UNBOUNDED), pad=pad,
                    softcap=0.0 if cap is None else cap, alibi=alibi, sinks=sink,
                    num_threads=nt)
    return (out, lse) if return_lse else out
