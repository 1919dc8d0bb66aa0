"""Attention over paged KV caches: :func:`attention_paged` and :func:`paged_append`.

A paged cache keeps the keys and values of many sequences in two pools of
fixed-size blocks, ``layout="NHD"`` ``(num_blocks, block_size, Hkv, E)``
(flash-attn's) or ``layout="HND"`` ``(num_blocks, Hkv, block_size, E)``
(vLLM's and FlashInfer's); a block table maps each sequence's positions to
blocks, so sequences grow without copying and may share blocks (a common
prefix).  One C call computes a whole batch: decoding steps and prefill
chunks mixed, every score option of :func:`fastattn.attention`, float32,
float64, float16, bfloat16 and int8 pools read where they lie; one C call
writes a batch of new rows into the pools.  Every check happens before
anything is written: types and shapes here, the values of block tables,
lengths, slots and int8 rows also in C, whose refusal is explained here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from . import _core, _half
from ._kvcache_q8 import check_finite_rows, quantize_rows
from ._masks import UNBOUNDED, check_window
from ._scores import check_softcap, per_head
from ._validate import (addressable, as_array, check_out, check_scale, overlapping, thread_count,
                        whole_elements)
from ._varlen_checks import check_cu_seqlens

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["attention_paged", "paged_append"]

_F32, _F64, _I8 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int8)
_LAYOUTS = ("NHD", "HND")


def _pool(name: str, cache: Any, layout: str) -> np.ndarray:
    """A block pool as its (num_blocks, block_size, Hkv, E) view (HND's axes
    swapped, never a copy), after checking its rank and dtype."""
    if not isinstance(cache, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(cache).__name__}")
    if cache.ndim != 4:
        axes = "block_size, Hkv" if layout == "NHD" else "Hkv, block_size"
        raise ValueError(f"{name} must be 4-D (num_blocks, {axes}, E) for layout={layout!r}, "
                         f"got shape {cache.shape}")
    dt = cache.dtype
    if dt not in (_F32, _F64, _I8) and not _half.is_half(dt):
        raise TypeError(f"{name} has dtype {dt}: a paged cache holds float32, float64, float16, "
                        f"bfloat16 or int8")
    return cache if layout == "NHD" else cache.swapaxes(1, 2)


def _pools(key_cache: Any, value_cache: Any, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Both pools as (num_blocks, block_size, Hkv, E / Ev) views that fit."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'NHD' or 'HND', got {layout!r}")
    k = _pool("key_cache", key_cache, layout)
    v = _pool("value_cache", value_cache, layout)
    if k.dtype != v.dtype:
        raise TypeError(f"key_cache and value_cache must have one dtype, got {k.dtype} and "
                        f"{v.dtype}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"key_cache {key_cache.shape} and value_cache {value_cache.shape} must "
                         f"agree on num_blocks, block_size and Hkv (layout={layout!r})")
    if k.shape[1] == 0 or k.shape[2] == 0 or k.shape[3] == 0 or v.shape[3] == 0:
        raise ValueError(f"block_size, Hkv, E and Ev must be >= 1, got key_cache "
                         f"{key_cache.shape}, value_cache {value_cache.shape}")
    return k, v


def _scales(name: str, scales: Any, k: np.ndarray) -> np.ndarray | None:
    """An int8 pool's float32 scales (num_blocks, block_size, Hkv); None for a
    float pool (and refused there)."""
    if k.dtype != _I8:
        if scales is not None:
            raise ValueError(f"{name} is for int8 caches; the caches are {k.dtype}")
        return None
    if scales is None:
        raise ValueError(f"{name} is required with int8 caches: one float32 scale per "
                         f"(block, position, kv head), shape {k.shape[:3]}")
    s = as_array(scales, name)
    if s.shape != k.shape[:3] or s.dtype != _F32:
        raise ValueError(f"{name} must be float32 of shape (num_blocks, block_size, Hkv) = "
                         f"{k.shape[:3]}, got {s.dtype} {s.shape}")
    return s


def _index_array(name: str, a: Any, ndim: int) -> np.ndarray:
    """An int32 / int64 array of rank ndim, as int64 C-ordered."""
    x = as_array(a, name)
    if x.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{name} must be int32 or int64, got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.int64)


def _sequences(block_table: Any, seq_lens: Any, cu_seqlens_q: Any, total_q: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block_table, seq_lens, cu_seqlens_q) as C-ordered int64 after checking
    their dtypes and shapes; their values are checked by the kernel, before
    it writes anything, and explained by :func:`_explain_sequences`."""
    table = _index_array("block_table", block_table, 2)
    lens = _index_array("seq_lens", seq_lens, 1)
    B = table.shape[0]
    if lens.shape != (B,):
        raise ValueError(f"seq_lens must have shape (B,) = ({B},) (block_table {table.shape}), "
                         f"got {lens.shape}")
    if cu_seqlens_q is None:
        if total_q != B:
            raise ValueError(f"with cu_seqlens_q=None each sequence has one query: query has "
                             f"{total_q} rows, there are {B} sequences")
        return table, lens, np.arange(B + 1, dtype=np.int64)
    cu = _index_array("cu_seqlens_q", cu_seqlens_q, 1)
    if cu.shape != (B + 1,):
        raise ValueError(f"cu_seqlens_q must have B + 1 = {B + 1} entries, got {cu.shape}")
    return table, lens, cu


def _explain_sequences(table: np.ndarray, lens: np.ndarray, cu: np.ndarray, total_q: int,
                       num_blocks: int, block_size: int) -> None:
    """Raise the ValueError that says which sequence the kernel refused:
    its keys beyond its row of blocks, a block id outside the pool,
    cu_seqlens_q not running from 0 to total_q without going back, or more
    queries than keys."""
    max_blocks = table.shape[1]
    if (lens < 0).any() or (lens > max_blocks * block_size).any():
        raise ValueError(f"seq_lens must be in 0 .. max_blocks * block_size = "
                         f"{max_blocks * block_size} (block_table {table.shape}), got {lens}")
    used = np.arange(max_blocks) < -(-lens // block_size)[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        b, j = np.argwhere(bad)[0]
        raise ValueError(f"block_table[{b}, {j}] = {table[b, j]} is outside the pool of "
                         f"{num_blocks} blocks")
    check_cu_seqlens("cu_seqlens_q", cu, total_q, "query")
    nq = np.diff(cu)
    if (nq > lens).any():
        b = int(np.argmax(nq > lens))
        raise ValueError(f"sequence {b} has {nq[b]} queries but seq_lens[{b}] = {lens[b]} keys: "
                         f"its queries are its last positions (cu_seqlens_q and seq_lens "
                         f"disagree)")


def _query(query: Any, k: np.ndarray, v: np.ndarray, layout: str
           ) -> tuple[np.ndarray, np.dtype]:
    """query (total_q, Hq, E) checked against the pools (k, v: NHD views of
    caches in ``layout``, named in the errors: a pool passed in the other
    layout shows as wrong head counts); its dtype is the result's."""
    if not isinstance(query, np.ndarray):
        query = as_array(query, "query")
    if query.ndim != 3 or query.shape[2] != k.shape[3]:
        raise ValueError(f"query must have shape (total_q, Hq, E) with E = {k.shape[3]} (the "
                         f"key cache's), got {query.shape}")
    hq, hkv = query.shape[1], k.shape[2]
    if hq == 0 or hq % hkv:
        axes = "block_size, Hkv" if layout == "NHD" else "Hkv, block_size"
        raise ValueError(f"query heads ({hq}) must be a positive multiple of the caches' kv "
                         f"heads ({hkv}: key_cache read as layout={layout!r}, (num_blocks, "
                         f"{axes}, E))")
    qdt, kdt = query.dtype, k.dtype
    ok = qdt == kdt if kdt == _F64 else (qdt == _F32 or (qdt == kdt and _half.is_half(qdt)))
    if not ok:
        half = f" or {kdt}" if _half.is_half(kdt) else ""
        want = "float64" if kdt == _F64 else "float32" + half
        raise TypeError(f"query has dtype {qdt}; with {kdt} caches it must be {want}")
    return query, qdt


def _window(window: Any, is_causal: Any) -> tuple[int, int]:
    """The window as the kernel's (left, right) sizes."""
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    left, right = check_window(window)
    return (UNBOUNDED if left is None else min(left, UNBOUNDED),
            UNBOUNDED if right is None else min(right, UNBOUNDED))


def _options(alibi_slopes: Any, softcap: Any, sinks: Any, hq: int, cdt: np.dtype
             ) -> tuple[float, np.ndarray | None, np.ndarray | None]:
    """(softcap, slopes, sinks) as the kernel takes them: a float, and None or
    (Hq,) float64 C-ordered arrays of values finite in cdt."""
    cap = check_softcap(softcap, cdt)
    slopes = per_head("alibi_slopes", alibi_slopes, (hq,), cdt, in_range=True)
    sink = per_head("sinks", sinks, (hq,), cdt, neg_inf_ok=True, in_range=True)
    def as64(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.ascontiguousarray(a, dtype=np.float64)
    return 0.0 if cap is None else cap, as64(slopes), as64(sink)


@overload
def attention_paged(query: ArrayLike, key_cache: np.ndarray, value_cache: np.ndarray,
                    block_table: ArrayLike, seq_lens: ArrayLike, *,
                    cu_seqlens_q: ArrayLike | None = None, layout: str = "NHD",
                    scale: float | None = None, is_causal: bool = True,
                    window: int | tuple[int | None, int | None] | None = None,
                    alibi_slopes: ArrayLike | None = None, softcap: float | None = None,
                    sinks: ArrayLike | None = None, key_scales: ArrayLike | None = None,
                    value_scales: ArrayLike | None = None, return_lse: Literal[False] = False,
                    out: np.ndarray | None = None, num_threads: int | None = None,
                    ) -> NDArray[Any]: ...


@overload
def attention_paged(query: ArrayLike, key_cache: np.ndarray, value_cache: np.ndarray,
                    block_table: ArrayLike, seq_lens: ArrayLike, *,
                    cu_seqlens_q: ArrayLike | None = None, layout: str = "NHD",
                    scale: float | None = None, is_causal: bool = True,
                    window: int | tuple[int | None, int | None] | None = None,
                    alibi_slopes: ArrayLike | None = None, softcap: float | None = None,
                    sinks: ArrayLike | None = None, key_scales: ArrayLike | None = None,
                    value_scales: ArrayLike | None = None, return_lse: Literal[True],
                    out: np.ndarray | None = None, num_threads: int | None = None,
                    ) -> tuple[NDArray[Any], NDArray[Any]]: ...


def attention_paged(query: ArrayLike, key_cache: np.ndarray, value_cache: np.ndarray,
                    block_table: ArrayLike, seq_lens: ArrayLike, *,
                    cu_seqlens_q: ArrayLike | None = None, layout: str = "NHD",
                    scale: float | None = None, is_causal: bool = True,
                    window: int | tuple[int | None, int | None] | None = None,
                    alibi_slopes: ArrayLike | None = None, softcap: float | None = None,
                    sinks: ArrayLike | None = None, key_scales: ArrayLike | None = None,
                    value_scales: ArrayLike | None = None, return_lse: bool = False,
                    out: np.ndarray | None = None, num_threads: int | None = None,
                    ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[Any]]:
    """Attention of a batch of sequences over paged key/value caches.

    Sequence ``b`` has ``seq_lens[b]`` keys: position ``p`` is in block
    ``block_table[b, p // block_size]`` at offset ``p % block_size``.  Its
    queries are ``query[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]``, its last
    positions (causal alignment to the end, lower-right), so decoding steps
    and prefill chunks mix in one call.  The caches are read in place.

    Parameters
    ----------
    query : ndarray, shape (total_q, Hq, E)
        float32 (any cache), float64 (float64 caches) or the caches' own
        16-bit dtype; the result has its dtype.
    key_cache, value_cache : ndarray
        Block pools, ``(num_blocks, block_size, Hkv, E)`` / ``Ev`` for
        ``layout="NHD"``, ``(num_blocks, Hkv, block_size, E)`` for
        ``"HND"``, any strides; float32, float64, float16, bfloat16, or int8
        with ``key_scales`` / ``value_scales``.  ``Hq`` is a multiple of
        ``Hkv`` (grouped-query attention).
    block_table : array_like of int32 or int64, shape (B, max_blocks)
        Each sequence's blocks; entries past its last block are not read.
        Blocks may be shared between sequences.
    seq_lens : array_like of int32 or int64, shape (B,)
    cu_seqlens_q : array_like of int32 or int64, shape (B + 1,), optional
        Query offsets; None means one query per sequence (a decoding step).
    layout : {'NHD', 'HND'}, optional
    scale : float, optional
        Default ``1 / sqrt(E)``.
    is_causal : bool, optional
        Default True: query ``i`` of a sequence's ``nq`` sits at position
        ``p = seq_lens[b] - nq + i`` and sees the keys up to ``p``; False:
        all of its sequence's keys.
    window, alibi_slopes, softcap, sinks : optional
        As in :func:`fastattn.attention`, per query head (``(Hq,)``); the
        window and ALiBi's distances are taken from the position ``p``
        causal or not.
    key_scales, value_scales : ndarray of float32, shape (num_blocks, block_size, Hkv)
        Required with int8 caches: row ``r`` is ``scale * level``, as
        :func:`paged_append` and :class:`fastattn.KVCache` quantise.
    return_lse : bool, optional
        Also return each row's natural-log log-sum-exp, ``(Hq, total_q)``.
    out : ndarray, shape (total_q, Hq, Ev), optional
        Written in place and returned.
    num_threads : int, optional
        The result is bitwise the same for any thread count.

    Returns
    -------
    out : ndarray, shape (total_q, Hq, Ev)
    lse : ndarray, shape (Hq, total_q), if ``return_lse``

    Examples
    --------
    >>> import numpy as np, fastattn, fastattn.reference
    >>> rng = np.random.default_rng(0)
    >>> kc = rng.standard_normal((4, 16, 1, 8), dtype=np.float32)
    >>> vc = rng.standard_normal((4, 16, 1, 8), dtype=np.float32)
    >>> table = np.array([[2, 0], [1, 3]], dtype=np.int32)
    >>> q = rng.standard_normal((2, 2, 8), dtype=np.float32)
    >>> out = fastattn.attention_paged(q, kc, vc, table, np.array([20, 5]))
    >>> keys = np.concatenate([kc[2], kc[0]])[:20, 0]   # sequence 0's keys, its blocks 2, 0
    >>> values = np.concatenate([vc[2], vc[0]])[:20, 0]
    >>> ref = fastattn.reference.attention(q[0], keys, values)  # its two heads as rows
    >>> bool(np.allclose(out[0], ref, atol=1e-5))
    True
    """
    k, v = _pools(key_cache, value_cache, layout)
    ks, vs = _scales("key_scales", key_scales, k), _scales("value_scales", value_scales, v)
    q, qdt = _query(query, k, v, layout)
    table, lens, cu = _sequences(block_table, seq_lens, cu_seqlens_q, q.shape[0])
    cdt = _half.arith(qdt)
    sc = 1.0 / math.sqrt(q.shape[2]) if scale is None else check_scale(scale, cdt)
    wl, wr = _window(window, is_causal)
    cap, slopes, sink = _options(alibi_slopes, softcap, sinks, q.shape[1], cdt)
    nt = thread_count(num_threads)
    shape = (q.shape[0], q.shape[1], v.shape[3])
    q, k, v, ks, vs = (addressable(a) for a in (q, k, v, ks, vs))
    if out is not None:
        check_out(out, shape, qdt, [("query", q), ("key_cache", k), ("value_cache", v),
                                    ("key_scales", ks), ("value_scales", vs),
                                    ("block_table", table), ("seq_lens", lens),
                                    ("cu_seqlens_q", cu), ("alibi_slopes", slopes),
                                    ("sinks", sink)])
    target = out if out is not None and addressable(out) is out else np.empty(shape, qdt)
    lse = np.empty((q.shape[1], q.shape[0]), cdt) if return_lse else None
    try:
        _core.attention_paged(q, k, v, ks, vs, table, lens, cu, target, lse, scale=sc,
                              causal=bool(is_causal), win_left=wl, win_right=wr, softcap=cap,
                              alibi=slopes, sinks=sink, num_threads=nt)
    except ValueError as refused:  # refused before anything was written
        error = refused
    else:
        if out is not None and target is not out:
            out[...] = target
        res = out if out is not None else target
        return res if lse is None else (res, lse)
    _explain_sequences(table, lens, cu, q.shape[0], k.shape[0], k.shape[1])  # which sequence
    raise error


def _slots(slot_mapping: Any, n_tokens: int, capacity: int) -> np.ndarray:
    """slot_mapping as int64 after checking it: one slot per token, each < the
    pool's capacity, no slot twice (negative: skipped)."""
    s = _index_array("slot_mapping", slot_mapping, 1)
    if s.shape != (n_tokens,):
        raise ValueError(f"slot_mapping must have one entry per token ({n_tokens}), got "
                         f"shape {s.shape}")
    if (s >= capacity).any():
        raise ValueError(f"slot_mapping has slots >= num_blocks * block_size = {capacity}: "
                         f"{s[s >= capacity][:4]}")
    kept = s[s >= 0]
    if np.unique(kept).size != kept.size:
        raise ValueError("slot_mapping names a slot twice: which token it would hold is "
                         "ambiguous")
    return s


def _distinct_slots(name: str, a: np.ndarray) -> None:
    """The ValueError for a pool or scales that paged_append writes whose
    strides give two elements one address (an expanded tensor, a writeable
    ``as_strided`` view): two slots would be one, the last write winning."""
    if not a.flags.forc and overlapping(a.shape, a.strides, a.itemsize):  # contiguous: never
        raise ValueError(f"{name}'s strides {a.strides} (shape {a.shape}) give two elements the "
                         f"same memory (a broadcast or expanded view?): paged_append would "
                         f"write several slots to one place")


def _distinct_targets(named: tuple[tuple[str, np.ndarray | None], ...]) -> None:
    """No two of the arrays paged_append writes share an element: the
    second write would replace the first (a key pool passed as the value
    pool too, overlapping views of one buffer, one array for both scales).
    Views that interleave without touching (K and V halves of one
    ``(num_blocks, 2, ...)`` buffer) are accepted."""
    for i, (na, a) in enumerate(named):
        for nb, b in named[i + 1:]:
            if a is None or b is None:
                continue
            try:
                shared = np.shares_memory(a, b, max_work=1 << 20)
            except np.exceptions.TooHardError:  # strides too tangled to tell: assume they do
                shared = True
            if shared:
                raise ValueError(f"{na} {a.dtype} {a.shape} and {nb} {b.dtype} {b.shape} share "
                                 f"memory: paged_append writes both, and the second write "
                                 f"would replace the first")


def _rows(name: str, x: Any, hkv: int, width: int) -> np.ndarray:
    """key or value rows (T, Hkv, width) of real numbers."""
    a = as_array(x, name)
    if a.ndim != 3 or a.shape[1:] != (hkv, width):
        raise ValueError(f"{name} must have shape (tokens, {hkv}, {width}), got {a.shape}")
    if a.dtype.kind not in "fiu" and not _half.is_bfloat16(a.dtype):
        raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype}")
    if a.dtype == bool:
        raise TypeError(f"{name} must hold real numbers, got dtype bool")
    return a


def _writable_in_place(a: np.ndarray) -> bool:
    """Can the C writer address ``a`` (a pool or scales): aligned, every
    stride a whole number of elements, the last one unit?"""
    return whole_elements(a) and a.strides[-1] == a.itemsize


def _rows_for_c(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Rows (T, Hkv, width) of dtype ``dt`` with unit column stride, aligned
    (converted, rounding once, only if they are not)."""
    if x.dtype != dt:
        with np.errstate(over="ignore", invalid="ignore"):
            x = x.astype(dt)
    if x.strides[2] != x.itemsize or not whole_elements(x):
        x = np.ascontiguousarray(x)
    return x


def _append_in_c(k: np.ndarray, v: np.ndarray, ks: np.ndarray | None, vs: np.ndarray | None,
                 slots: np.ndarray, kx: np.ndarray, vx: np.ndarray) -> None:
    """paged_append's writes, checked, by one C call: the rows as float32
    (int8 pools, quantised there; 16-bit pools, rounded there once) or in
    the pools' own type."""
    if ks is not None:
        src = _F32
    elif kx.dtype == vx.dtype and (kx.dtype == k.dtype or
                                   (kx.dtype == _F32 and _half.is_half(k.dtype))):
        src = kx.dtype
    else:
        src = k.dtype
    kr, vr = _rows_for_c(kx, src), _rows_for_c(vx, src)
    try:
        _core.paged_append(k, v, ks, vs, slots, kr, vr)
    except ValueError as refused:  # an int8 pool's row not finite: nothing was written
        error = refused
    else:
        return
    keep = slots >= 0
    for name, x in (("key", kr), ("value", vr)):
        rows = x[keep]
        check_finite_rows(rows, name, rows.shape)
    raise error


def paged_append(key_cache: np.ndarray, value_cache: np.ndarray, slot_mapping: ArrayLike,
                 key: ArrayLike, value: ArrayLike, *, layout: str = "NHD",
                 key_scales: np.ndarray | None = None,
                 value_scales: np.ndarray | None = None) -> None:
    """Write token ``t``'s key and value rows into slot ``slot_mapping[t]``.

    A slot is ``block * block_size + offset``; a negative slot skips its
    token.  The rows are rounded once to the caches' dtype; for int8 caches
    they are quantised as :class:`fastattn.KVCache` does (symmetric, one
    float32 scale per row, written to ``key_scales`` / ``value_scales``).
    Every check happens before anything is written.

    Parameters
    ----------
    key_cache, value_cache : ndarray
        The pools, as in :func:`attention_paged`; written in place.
    slot_mapping : array_like of int32 or int64, shape (T,)
    key : array_like, shape (T, Hkv, E)
    value : array_like, shape (T, Hkv, Ev)
    layout : {'NHD', 'HND'}, optional
    key_scales, value_scales : ndarray of float32, optional
        Required with int8 caches, shape (num_blocks, block_size, Hkv).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> kc = np.zeros((2, 4, 1, 2), np.float32); vc = np.zeros_like(kc)
    >>> kv = np.ones((2, 1, 2), np.float32)
    >>> fastattn.paged_append(kc, vc, np.array([5, -1]), kv, 2 * kv)
    >>> vc[1, 1, 0].tolist(), float(vc.sum())
    ([2.0, 2.0], 4.0)
    """
    k, v = _pools(key_cache, value_cache, layout)
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not c.flags.writeable:
            raise ValueError(f"{name} is read-only")
        _distinct_slots(name, c)
    ks, vs = _scales("key_scales", key_scales, k), _scales("value_scales", value_scales, v)
    for name, given in (("key_scales", key_scales), ("value_scales", value_scales)):
        if ks is not None and not (isinstance(given, np.ndarray) and given.flags.writeable):
            raise ValueError(f"{name} must be a writeable numpy.ndarray: the scales are "
                             f"written there")
        if ks is not None:
            _distinct_slots(name, given)
    _distinct_targets((("key_cache", key_cache), ("value_cache", value_cache),
                       ("key_scales", ks), ("value_scales", vs)))
    kx = _rows("key", key, k.shape[2], k.shape[3])
    vx = _rows("value", value, v.shape[2], v.shape[3])
    if kx.shape[0] != vx.shape[0]:
        raise ValueError(f"key and value must have one row per token: {kx.shape} and {vx.shape}")
    s = _slots(slot_mapping, kx.shape[0], k.shape[0] * k.shape[1])
    # rows read from the pools themselves: as if copied before any is written
    kx, vx = (x.copy() if any(p is not None and np.may_share_memory(x, p)
                              for p in (k, v, ks, vs)) else x for x in (kx, vx))
    if all(_writable_in_place(a) for a in (k, v, ks, vs) if a is not None):
        _append_in_c(k, v, ks, vs, s, kx, vx)
        return
    keep = s >= 0
    blk, off = s[keep] // k.shape[1], s[keep] % k.shape[1]
    if ks is not None and vs is not None:                  # int8 caches
        k8, kscale = quantize_rows(kx[keep], "key")      # both before anything is written
        v8, vscale = quantize_rows(vx[keep], "value")
        for pool, rows, sp, sr in ((k, k8, ks, kscale), (v, v8, vs, vscale)):
            pool[blk, off] = rows
            sp[blk, off] = sr
        return
    with np.errstate(over="ignore"):
        krows, vrows = kx[keep].astype(k.dtype), vx[keep].astype(v.dtype)
    k[blk, off] = krows
    v[blk, off] = vrows
