"""A key/value cache for decoding: preallocated once, appended token by token.

:class:`KVCache` holds the keys and values of the tokens seen so far;
:func:`fastattn.multi_head_attention` (``kv_cache=``) appends the new ones and
attends over the filled part, a strided view of the storage, never a copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

import numpy as np

from . import _api
from . import _half
from . import _kvcache_q8
from ._validate import as_array, positive_int

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike, NDArray

__all__ = ["KVCache"]


def _storage(dtype) -> tuple[str, np.dtype[Any]]:
    """The cache's kind and storage dtype for the ``dtype`` argument:
    ("float", float16/bfloat16/float32/float64) or ("int8", int8).  The one place a
    cache dtype is parsed."""
    if isinstance(dtype, str) and dtype == "int8":
        return "int8", np.dtype(np.int8)
    try:
        dt = _half.as_storage_dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype: {exc}") from None
    if dt == np.int8:
        return "int8", dt
    if dt not in (np.float16, np.float32, np.float64) and not _half.is_bfloat16(dt):
        raise TypeError(f"dtype must be float16, bfloat16, float32, float64 or 'int8', "
                        f"got {dt}")
    return "float", dt


class KVCache:
    """Preallocated keys and values of the tokens seen so far, for decoding.

    Parameters
    ----------
    batch_size : int
        Number of sequences decoded together (``N``).
    num_kv_heads : int
        Number of key/value heads (``num_kv_heads`` of
        :func:`multi_head_attention`).
    head_dim : int
        Size ``d_k`` of one key head.
    max_len : int
        Number of positions the cache can hold.  Storage for all of them is
        allocated once, here.
    dtype : dtype or str, optional
        ``float16``, ``bfloat16`` (``ml_dtypes.bfloat16``, or the string
        ``"bfloat16"``), ``float32`` (default) or ``float64``.  Must be the
        dtype of the calls that use the cache (float16 and bfloat16 calls may
        also use float32).  A 16-bit cache halves the memory and the bytes a
        decoding step reads: the kernels read it in place, in float32
        arithmetic; keys and values appended in float32 are rounded to nearest
        even when stored.  ``"int8"`` (or ``np.int8``): an int8 cache for
        float32 (and float16) calls, a quarter of float32's memory and reads;
        see Notes.
    value_dim : int, optional
        Size ``d_v`` of one value head (default ``head_dim``).

    Notes
    -----
    The storage is laid out as ``(batch, num_kv_heads, max_len, dim)``; the
    filled part ``[:, :, :len(cache)]`` is a strided view of it that is passed
    to :func:`fastattn.attention` as is, so a decoding step never copies the
    cache.  :attr:`keys` and :attr:`values` are read-only views of that filled
    part; they share memory with the cache, so a view taken before
    :meth:`reset` sees whatever is written into those positions later.

    **int8 cache.**  Each appended (token, kv head) row ``x`` of the keys and
    of the values is stored as int8 levels with one float32 scale
    (symmetric): ``scale = max|x| / 127`` and ``level = x / scale`` rounded
    to nearest (ties to even), so the row reads back as ``scale * level``
    with ``|x - scale * level| <= scale / 2`` for every entry; a row of
    zeros is stored as zeros with scale 0.  (When ``max|x| / 127`` is
    subnormal, below 1.2e-38, the scale is rounded up by a few ulps so that
    no level passes 127.)  NaN and infinities cannot be represented: an
    append holding any raises ValueError and leaves the cache unchanged.
    :attr:`keys` and :attr:`values` are then the int8 levels and
    :attr:`key_scales`, :attr:`value_scales` the scales.  :meth:`attend`
    and :func:`fastattn.multi_head_attention` read the levels directly,
    nothing is dequantised to memory.  On the avx2, avx512_bf16 and amx
    paths the dot products are integer (VPMADDWD; AVX512-VNNI), with exact
    int32 sums: each query row is quantised to
    int16 (``round(q / max|q| * 32767)``, within ``2**-16 max|q|``), and per
    block of 128 keys each row's weights ``p_j * value_scales[j]`` to int16
    against the block's largest (within ``2**-16`` of it); on the other
    paths the queries and weights stay float32 and each level is converted
    to float32 in registers.  The scores, the softmax and the running sums
    are float32.  The result matches :func:`fastattn.reference.attention`
    over the dequantised cache (``scale * level`` in float64) within float32
    rounding (on the integer paths: over the int16 queries, plus at most
    ``min(len, 128) * 0.504 / 32767 * max|v|`` for the weights), and over
    the original float keys and values within

    ``(exp(2 d) - 1) max|v| + max(value_scales) / 2``,  with
    ``d = max_j |softmax scale| * key_scales[j] / 2 * sum_c |q_c|``

    per query row (plus the same roundings; on the integer paths ``d`` also
    holds the int16 queries' ``0.504 |softmax scale| max|q| / 32767 *
    max_j key_scales[j] sum_c |keys[j, c]|``): ``d`` bounds the change of
    any logit, ``max(value_scales) / 2`` the change of any value entry.
    With a float64 call the int8 cache is a TypeError; ``attn_mask`` and
    ``return_weights`` are not supported with it (ValueError).

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.mha import KVCache
    >>> cache = KVCache(1, 2, 4, max_len=8)
    >>> len(cache), cache.keys.shape
    (0, (1, 2, 0, 4))
    >>> cache.append(np.ones((1, 2, 3, 4), np.float32), np.ones((1, 2, 3, 4), np.float32))
    >>> len(cache), cache.keys.shape, cache.keys.flags.writeable
    (3, (1, 2, 3, 4), False)
    >>> cache.reset()
    >>> len(cache)
    0

    An int8 cache: decode one query per head against it.

    >>> rng = np.random.default_rng(0)
    >>> c8 = KVCache(1, 2, 4, max_len=8, dtype="int8")
    >>> c8.append(rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4)))
    >>> c8.keys.dtype, c8.key_scales.shape
    (dtype('int8'), (1, 2, 5))
    >>> out = c8.attend(rng.standard_normal((1, 2, 1, 4)).astype(np.float32))
    >>> out.shape, out.dtype
    ((1, 2, 1, 4), dtype('float32'))
    """

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: DTypeLike | str = np.float32, value_dim: int | None = None) -> None:
        batch_size = positive_int(batch_size, "batch_size")
        num_kv_heads = positive_int(num_kv_heads, "num_kv_heads")
        head_dim = positive_int(head_dim, "head_dim")
        max_len = positive_int(max_len, "max_len")
        value_dim = head_dim if value_dim is None else positive_int(value_dim, "value_dim")
        self._kind, dtype = _storage(dtype)
        self._keys = np.zeros((batch_size, num_kv_heads, max_len, head_dim), dtype)
        self._values = np.zeros((batch_size, num_kv_heads, max_len, value_dim), dtype)
        if self._kind == "int8":  # one float32 scale per (token, kv head) row
            self._k_scale = np.zeros((batch_size, num_kv_heads, max_len), np.float32)
            self._v_scale = np.zeros((batch_size, num_kv_heads, max_len), np.float32)
        self._len = 0

    # -- shape information -------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Number of sequences (first dimension)."""
        return self._keys.shape[0]

    @property
    def num_kv_heads(self) -> int:
        """Number of key/value heads."""
        return self._keys.shape[1]

    @property
    def max_len(self) -> int:
        """Number of positions the cache can hold."""
        return self._keys.shape[2]

    @property
    def head_dim(self) -> int:
        """Size of one key head (``d_k``)."""
        return self._keys.shape[3]

    @property
    def value_dim(self) -> int:
        """Size of one value head (``d_v``)."""
        return self._values.shape[3]

    @property
    def dtype(self) -> np.dtype[Any]:
        """dtype of the stored keys and values (int8 for an int8 cache)."""
        return self._keys.dtype

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"KVCache(batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, max_len={self.max_len}, dtype={self.dtype.name}, "
                f"value_dim={self.value_dim}; len={self._len})")

    # -- contents ------------------------------------------------------------
    @property
    def keys(self) -> NDArray[Any]:
        """Read-only view ``(batch, num_kv_heads, len, head_dim)`` of the cached keys
        (the int8 levels for an int8 cache: see :attr:`key_scales`)."""
        view = self._keys[:, :, :self._len]
        view.flags.writeable = False
        return view

    @property
    def values(self) -> NDArray[Any]:
        """Read-only view ``(batch, num_kv_heads, len, value_dim)`` of the cached values
        (the int8 levels for an int8 cache: see :attr:`value_scales`)."""
        view = self._values[:, :, :self._len]
        view.flags.writeable = False
        return view

    @property
    def key_scales(self) -> NDArray[np.float32]:
        """int8 cache only: read-only view ``(batch, num_kv_heads, len)`` of
        the keys' row scales (key = scale * level)."""
        return self._scales("_k_scale")

    @property
    def value_scales(self) -> NDArray[np.float32]:
        """int8 cache only: read-only view ``(batch, num_kv_heads, len)`` of
        the values' row scales."""
        return self._scales("_v_scale")

    def _scales(self, name):
        if self._kind != "int8":
            raise AttributeError(f"a {self.dtype} cache has no scales (only an int8 one)")
        view = getattr(self, name)[:, :, :self._len]
        view.flags.writeable = False
        return view

    def reset(self) -> None:
        """Forget every cached position (the storage is kept for reuse)."""
        self._len = 0

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions and forget the rest
        (``truncate(0)`` is :meth:`reset`): how a step that failed after
        appending puts the cache back as it was.

        Raises
        ------
        TypeError
            If ``length`` is not an integer (a bool is not one here).
        ValueError
            If ``length`` is negative or more than ``len(self)``.

        Examples
        --------
        >>> import numpy as np
        >>> from fastattn.mha import KVCache
        >>> cache = KVCache(1, 1, 2, max_len=4)
        >>> cache.append(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)))
        >>> cache.truncate(1)
        >>> len(cache), cache.keys.shape
        (1, (1, 1, 1, 2))
        """
        length = positive_int(length, "length", minimum=0)
        if length > self._len:
            raise ValueError(f"truncate: length {length} is more than the {self._len} "
                             f"cached positions")
        self._len = length

    def check_room(self, n_new: int) -> None:
        """Raise ValueError if ``n_new`` more positions do not fit in the
        cache (before anything else of a step is done).

        Examples
        --------
        >>> from fastattn.mha import KVCache
        >>> KVCache(1, 1, 2, max_len=4).check_room(5)
        Traceback (most recent call last):
            ...
        ValueError: kv_cache overflow: the cache holds 0 of max_len=4 positions and cannot take 5 more; the cache was left unchanged
        """
        n_new = positive_int(n_new, "n_new", minimum=0)
        if self._len + n_new > self.max_len:
            raise ValueError(
                f"kv_cache overflow: the cache holds {self._len} of max_len={self.max_len} "
                f"positions and cannot take {n_new} more; the cache was left unchanged")

    def append(self, keys: ArrayLike, values: ArrayLike) -> None:
        """Append the keys and values of new positions.

        Parameters
        ----------
        keys : array_like, shape (batch, num_kv_heads, T, head_dim)
        values : array_like, shape (batch, num_kv_heads, T, value_dim)
            Cast to the cache's dtype (same-kind casting): into a float16 or
            bfloat16 cache rounded to nearest even, values beyond its range
            becoming ``+-inf``; an int8 cache takes real numbers and quantises
            each row (see the class Notes).

        Raises
        ------
        ValueError
            If the shapes do not match the cache, if ``len(self) + T``
            exceeds :attr:`max_len`, or (int8 cache) if an entry is NaN or
            infinite.  The cache is unchanged then.
        """
        k = as_array(keys, "keys")
        v = as_array(values, "values")
        b, h = self.batch_size, self.num_kv_heads
        if k.ndim != 4 or k.shape[:2] != (b, h) or k.shape[3] != self.head_dim:
            raise ValueError(
                f"keys must have shape (batch_size={b}, num_kv_heads={h}, T, "
                f"head_dim={self.head_dim}), got {k.shape}")
        if v.ndim != 4 or v.shape[:3] != k.shape[:3] or v.shape[3] != self.value_dim:
            raise ValueError(
                f"values must have shape (batch_size={b}, num_kv_heads={h}, T={k.shape[2]}, "
                f"value_dim={self.value_dim}), got {v.shape}")
        if self._kind == "int8":
            self._append_q8(k, v)
            return
        for arr, what in ((k, "keys"), (v, "values")):
            if not np.can_cast(arr.dtype, self.dtype, casting="same_kind"):
                raise TypeError(f"{what} of dtype {arr.dtype} cannot be stored in a "
                                f"{self.dtype} cache")
        n_new = k.shape[2]
        self.check_room(n_new)
        start = self._len
        with np.errstate(over="ignore"):  # beyond a 16-bit range: +-inf, documented
            self._keys[:, :, start:start + n_new] = k
            self._values[:, :, start:start + n_new] = v
        self._len = start + n_new

    def _append_q8(self, k, v):
        for arr, what in ((k, "keys"), (v, "values")):
            if arr.dtype.kind not in "biuf" and not _half.is_bfloat16(arr.dtype):
                raise TypeError(f"{what} of dtype {arr.dtype} cannot be stored in an int8 "
                                "cache (real numbers only)")
        n_new = k.shape[2]
        self.check_room(n_new)
        k8, ks = _kvcache_q8.quantize_rows(k, "keys")
        v8, vs = _kvcache_q8.quantize_rows(v, "values")
        start, stop = self._len, self._len + n_new
        self._keys[:, :, start:stop] = k8
        self._values[:, :, start:stop] = v8
        self._k_scale[:, :, start:stop] = ks
        self._v_scale[:, :, start:stop] = vs
        self._len = stop

    def attend(self, query: ArrayLike, *, scale: SupportsFloat | None = None,
               key_padding_mask: ArrayLike | None = None,
               window: int | tuple[int | None, int | None] | None = None,
               softcap: SupportsFloat | None = None, alibi_slopes: ArrayLike | None = None,
               sinks: ArrayLike | None = None, return_lse: bool = False,
               num_threads: SupportsIndex | None = None) -> Any:
        """Attention of ``query`` over the cached positions, causal, lower-right
        aligned (query ``i`` of ``L`` sits at position ``len(self) - L + i``).

        Parameters
        ----------
        query : array_like, shape (batch, Hq, L, head_dim)
            ``Hq`` a multiple of :attr:`num_kv_heads` (query head ``h`` reads
            kv head ``h // (Hq // num_kv_heads)``).  For an int8 cache,
            float32 or float16 (computed in float32; int16 on the integer
            paths, see the class docstring).
        scale, key_padding_mask, window, softcap, alibi_slopes, sinks, return_lse, num_threads
            As in :func:`fastattn.attention` (``key_padding_mask``: bool,
            shape ``(len(self),)`` or ``(batch, len(self))``).

        Returns
        -------
        out : ndarray, shape (batch, Hq, L, value_dim)
            float32 for an int8 cache; else :func:`fastattn.attention`'s.
        lse : ndarray, shape (batch, Hq, L)
            Only with ``return_lse=True``.
        """
        opts = dict(scale=scale, key_padding_mask=key_padding_mask, window=window,
                    softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                    return_lse=return_lse, num_threads=num_threads)
        k, v = self._filled()
        if self._kind == "int8":
            return _kvcache_q8.attend(k, self._k_scale[:, :, :self._len], v,
                                      self._v_scale[:, :, :self._len], self.num_kv_heads,
                                      self.head_dim, query, **opts)
        q = as_array(query, "query")
        _kvcache_q8.check_query_shape(q, self.batch_size, self.num_kv_heads, self.head_dim)
        return _api.attention(q, k, v, is_causal="lower_right",
                              enable_gqa=q.shape[1] != self.num_kv_heads, **opts)

    def _filled(self):
        # Internal, writable views of the filled part (no copies).
        return self._keys[:, :, :self._len], self._values[:, :, :self._len]
