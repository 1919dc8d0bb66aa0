"""PagedKVCache: paged key/value pools and the bookkeeping of their sequences.

For users without a serving engine: the pools (one pair per layer), a free
list of blocks shared by every layer, each sequence's blocks and length per
layer, reference counts so that a forked sequence shares its parent's full
blocks.  Attention goes through :func:`fastattn.attention_paged`, writing
through :func:`fastattn.paged_append`.  An operation that cannot be done
(out of blocks, a bad argument) raises before it changes anything.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _half
from .paged import attention_paged, paged_append
from ._validate import as_array, physical_memory, positive_int

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["PagedKVCache"]


class _Sequence:
    """One sequence: its blocks (shared by every layer) and its length per layer."""

    __slots__ = ("blocks", "lengths")

    def __init__(self, blocks: list[int], lengths: list[int]):
        self.blocks = blocks
        self.lengths = lengths


class PagedKVCache:
    """Paged key/value caches for many sequences at once.

    Parameters
    ----------
    num_blocks, block_size, num_kv_heads, head_dim : int
        The pools: ``num_blocks`` blocks of ``block_size`` positions, each
        ``num_kv_heads`` rows of ``head_dim`` (``value_dim`` for values).
    num_layers : int, optional
        One pair of pools per layer; a sequence holds the same blocks in each.
    dtype : dtype or str, optional
        float32 (default), float64, float16, ``"bfloat16"`` or ``"int8"``
        (rows quantised as :class:`fastattn.KVCache` does, with float32 scales).
    value_dim : int, optional
        Default ``head_dim``.
    layout : {'NHD', 'HND'}, optional
        The pools' layout (see :func:`fastattn.attention_paged`).

    Raises
    ------
    KeyError
        From any method given a sequence id the cache does not hold.
    MemoryError
        From :meth:`append` and :meth:`fork` when too few blocks are free;
        every sequence is left as it was.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> cache = fastattn.PagedKVCache(8, 4, 1, 8)
    >>> rng = np.random.default_rng(0)
    >>> a = cache.add()
    >>> k, v = rng.standard_normal((2, 6, 1, 8), dtype=np.float32)
    >>> cache.append(a, k, v)
    >>> b = cache.fork(a)                      # shares a's full block
    >>> cache.num_free_blocks
    5
    >>> q = np.repeat(rng.standard_normal((1, 2, 8), dtype=np.float32), 2, axis=0)
    >>> out = cache.attend(q, [a, b])          # one decoding query each
    >>> bool(np.array_equal(out[0], out[1]))  # the same keys and values
    True
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *,
                 num_layers: int = 1, dtype: Any = np.float32, value_dim: int | None = None,
                 layout: str = "NHD"):
        n = positive_int(num_blocks, "num_blocks", minimum=0)
        bs = positive_int(block_size, "block_size")
        h = positive_int(num_kv_heads, "num_kv_heads")
        e = positive_int(head_dim, "head_dim")
        ev = e if value_dim is None else positive_int(value_dim, "value_dim")
        nl = positive_int(num_layers, "num_layers")
        if layout not in ("NHD", "HND"):
            raise ValueError(f"layout must be 'NHD' or 'HND', got {layout!r}")
        dt = np.dtype(np.int8) if isinstance(dtype, str) and dtype == "int8" else \
            _half.as_storage_dtype(dtype)
        if dt not in (np.float32, np.float64, np.int8) and not _half.is_half(dt):
            raise TypeError(f"dtype must be float32, float64, float16, bfloat16 or int8, got {dt}")
        kshape, vshape = ((n, bs, h, e), (n, bs, h, ev)) if layout == "NHD" else \
            ((n, h, bs, e), (n, h, bs, ev))
        q8 = dt == np.int8
        need = nl * n * bs * h * ((e + ev) * dt.itemsize + (8 if q8 else 0))
        what = (f"PagedKVCache(num_blocks={n}, block_size={bs}, num_kv_heads={h}, head_dim={e}, "
                f"value_dim={ev}, num_layers={nl}, dtype={dt}) needs {need} bytes of pools "
                f"({kshape} and {vshape} a layer)")
        if need > physical_memory():
            raise MemoryError(f"{what}, more than this machine's {physical_memory()}")
        try:
            self._k = [np.zeros(kshape, dt) for _ in range(nl)]
            self._v = [np.zeros(vshape, dt) for _ in range(nl)]
            self._ks = [np.zeros((n, bs, h), np.float32) for _ in range(nl)] if q8 else None
            self._vs = [np.zeros((n, bs, h), np.float32) for _ in range(nl)] if q8 else None
        except (MemoryError, ValueError) as err:  # NumPy's ValueError: more bytes than an index holds
            raise MemoryError(f"{what}: {err}") from None
        self._layout, self._bs, self._nl, self._dims = layout, bs, nl, (h, e, ev)
        self._free = list(range(n))          # a heap: the lowest free id first
        self._refs = np.zeros(n, np.int64)
        self._seqs: dict[int, _Sequence] = {}
        self._next_id = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return len(self._free)

    @property
    def block_size(self) -> int:
        """Positions per block."""
        return self._bs

    @property
    def layout(self) -> str:
        """'NHD' or 'HND'."""
        return self._layout

    def key_cache(self, layer: int = 0) -> NDArray[Any]:
        """Layer ``layer``'s key pool (the array itself, not a copy)."""
        return self._k[self._layer(layer)]

    def value_cache(self, layer: int = 0) -> NDArray[Any]:
        """Layer ``layer``'s value pool (the array itself, not a copy)."""
        return self._v[self._layer(layer)]

    def scales(self, layer: int = 0) -> tuple[NDArray[np.float32], NDArray[np.float32]] | None:
        """An int8 cache's (key_scales, value_scales) of ``layer``; None otherwise."""
        i = self._layer(layer)
        return None if self._ks is None or self._vs is None else (self._ks[i], self._vs[i])

    def _layer(self, layer: int) -> int:
        i = positive_int(layer, "layer", minimum=0)
        if i >= self._nl:
            raise ValueError(f"layer must be < num_layers = {self._nl}, got {i}")
        return i

    def _seq(self, seq_id: int) -> _Sequence:
        s = self._seqs.get(seq_id) if isinstance(seq_id, (int, np.integer)) and \
            not isinstance(seq_id, bool) else None
        if s is None:
            raise KeyError(f"no sequence {seq_id!r} in this cache")
        return s

    def _take(self, n: int, what: str) -> list[int]:
        """n free blocks (lowest ids first), or MemoryError changing nothing."""
        if n > len(self._free):
            raise MemoryError(f"PagedKVCache is out of blocks: {what} needs {n}, "
                              f"{len(self._free)} are free (nothing was changed)")
        got = [heapq.heappop(self._free) for _ in range(n)]
        self._refs[got] = 1
        return got

    def add(self) -> int:
        """A new, empty sequence; returns its id."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = _Sequence([], [0] * self._nl)
        return sid

    def length(self, seq_id: int, layer: int = 0) -> int:
        """Positions sequence ``seq_id`` holds in ``layer``."""
        return self._seq(seq_id).lengths[self._layer(layer)]

    def append(self, seq_id: int, key: ArrayLike, value: ArrayLike, *, layer: int = 0) -> None:
        """Append rows ``key`` (n, num_kv_heads, head_dim) and ``value`` (n,
        num_kv_heads, value_dim) to sequence ``seq_id`` in ``layer``,
        taking new blocks as needed (MemoryError, nothing changed, if too few
        are free; ValueError first for rows of another shape)."""
        s, i = self._seq(seq_id), self._layer(layer)
        k, v = as_array(key, "key"), as_array(value, "value")
        # Before any block is taken: rows of the wrong shape are a ValueError
        # whatever the free list holds, never an out-of-blocks MemoryError.
        h, e, ev = self._dims
        if k.ndim != 3 or k.shape[1:] != (h, e):
            raise ValueError(f"key must have shape (tokens, num_kv_heads={h}, head_dim={e}), "
                             f"got {k.shape}")
        if v.shape != (k.shape[0], h, ev):
            raise ValueError(f"value must have shape (tokens={k.shape[0]}, num_kv_heads={h}, "
                             f"value_dim={ev}) as key {k.shape}, got {v.shape}")
        n0, n = s.lengths[i], k.shape[0]
        need = max(0, -(-(n0 + n) // self._bs) - len(s.blocks))
        taken = self._take(need, f"appending {n} tokens")
        blocks = np.array(s.blocks + taken, np.int64)
        pos = np.arange(n0, n0 + n)
        slots = blocks[pos // self._bs] * self._bs + pos % self._bs
        try:
            paged_append(self._k[i], self._v[i], slots, k, v, layout=self._layout,
                         key_scales=None if self._ks is None else self._ks[i],
                         value_scales=None if self._vs is None else self._vs[i])
        except BaseException:
            self._release(taken)
            raise
        s.blocks.extend(taken)
        s.lengths[i] = n0 + n

    def _release(self, blocks: list[int]) -> None:
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                heapq.heappush(self._free, b)

    def free(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``; blocks no other sequence shares become free."""
        s = self._seq(seq_id)
        del self._seqs[seq_id]
        self._release(s.blocks)

    def fork(self, seq_id: int) -> int:
        """A new sequence with the contents of ``seq_id``: its full blocks
        shared, a partly filled last block copied into a new one (every
        layer's lengths must agree).  Returns the new id."""
        s = self._seq(seq_id)
        if len(set(s.lengths)) != 1:
            raise ValueError(f"sequence {seq_id} has different lengths per layer {s.lengths}: "
                             "fork it when every layer holds the same positions")
        n = s.lengths[0]
        full = n // self._bs
        partial = len(s.blocks) > full
        copy = self._take(1, "forking a partly filled block") if partial else []
        for i in range(self._nl):
            for pool in self._pools(i):
                if partial:
                    pool[copy[0]] = pool[s.blocks[full]]
        shared = s.blocks[:full]
        self._refs[shared] += 1
        sid = self.add()
        self._seqs[sid] = _Sequence(shared + copy, list(s.lengths))
        return sid

    def _pools(self, i: int) -> list[np.ndarray]:
        extra = [] if self._ks is None or self._vs is None else [self._ks[i], self._vs[i]]
        return [self._k[i], self._v[i]] + extra

    def block_table(self, seq_ids: list[int]) -> NDArray[np.int32]:
        """(len(seq_ids), max blocks) int32: each sequence's blocks, padded with 0."""
        seqs = [self._seq(i) for i in seq_ids]
        width = max([len(s.blocks) for s in seqs], default=0)
        t = np.zeros((len(seqs), max(width, 1)), np.int32)
        for r, s in enumerate(seqs):
            t[r, :len(s.blocks)] = s.blocks
        return t

    def seq_lens(self, seq_ids: list[int], layer: int = 0) -> NDArray[np.int64]:
        """(len(seq_ids),) int64: each sequence's length in ``layer``."""
        i = self._layer(layer)
        return np.array([self._seq(s).lengths[i] for s in seq_ids], np.int64)

    def attend(self, query: ArrayLike, seq_ids: list[int], *, layer: int = 0,
               cu_seqlens_q: ArrayLike | None = None, **options: Any) -> Any:
        """:func:`fastattn.attention_paged` of ``query`` over sequences
        ``seq_ids`` in ``layer``; ``options`` are its keyword options."""
        i = self._layer(layer)
        extra: dict[str, Any] = {} if self._ks is None or self._vs is None else \
            {"key_scales": self._ks[i], "value_scales": self._vs[i]}
        return attention_paged(query, self._k[i], self._v[i], self.block_table(seq_ids),
                               self.seq_lens(seq_ids, i), cu_seqlens_q=cu_seqlens_q,
                               layout=self._layout, **extra, **options)
