"""A key/value cache for decoding: preallocated once, appended token by token.

:class:`KVCache` holds the keys and values of the tokens seen so far;
:func:`fastattn.multi_head_attention` (``kv_cache=``) appends the new ones and
attends over the filled part, a strided view of the storage, never a copy.
"""

from __future__ import annotations

import numbers
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _half

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike, NDArray

    _Float = NDArray[np.floating[Any]]

__all__ = ["KVCache"]


def _positive_int(value, name, *, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _as_float_array(a, name):
    arr = np.asarray(a)
    if arr.dtype.kind in "biu":
        return arr
    if arr.dtype.kind != "f" and not _half.is_bfloat16(arr.dtype):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr


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
        even when stored.
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
    """

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: DTypeLike = np.float32, value_dim: int | None = None) -> None:
        batch_size = _positive_int(batch_size, "batch_size")
        num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
        head_dim = _positive_int(head_dim, "head_dim")
        max_len = _positive_int(max_len, "max_len")
        value_dim = head_dim if value_dim is None else _positive_int(value_dim, "value_dim")
        try:
            dtype = _half.as_storage_dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dtype: {exc}") from None
        if dtype not in (np.float16, np.float32, np.float64) and not _half.is_bfloat16(dtype):
            raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {dtype}")
        self._keys = np.zeros((batch_size, num_kv_heads, max_len, head_dim), dtype)
        self._values = np.zeros((batch_size, num_kv_heads, max_len, value_dim), dtype)
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
        """dtype of the stored keys and values."""
        return self._keys.dtype

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"KVCache(batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, max_len={self.max_len}, dtype={self.dtype.name}, "
                f"value_dim={self.value_dim}; len={self._len})")

    # -- contents ------------------------------------------------------------
    @property
    def keys(self) -> _Float:
        """Read-only view ``(batch, num_kv_heads, len, head_dim)`` of the cached keys."""
        view = self._keys[:, :, :self._len]
        view.flags.writeable = False
        return view

    @property
    def values(self) -> _Float:
        """Read-only view ``(batch, num_kv_heads, len, value_dim)`` of the cached values."""
        view = self._values[:, :, :self._len]
        view.flags.writeable = False
        return view

    def reset(self) -> None:
        """Forget every cached position (the storage is kept for reuse)."""
        self._len = 0

    def _check_room(self, n_new):
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
            becoming ``+-inf``.

        Raises
        ------
        ValueError
            If the shapes do not match the cache, or if ``len(self) + T``
            exceeds :attr:`max_len`.  The cache is unchanged then.
        """
        k = np.asarray(keys)
        v = np.asarray(values)
        b, h = self.batch_size, self.num_kv_heads
        if k.ndim != 4 or k.shape[:2] != (b, h) or k.shape[3] != self.head_dim:
            raise ValueError(
                f"keys must have shape (batch_size={b}, num_kv_heads={h}, T, "
                f"head_dim={self.head_dim}), got {k.shape}")
        if v.ndim != 4 or v.shape[:3] != k.shape[:3] or v.shape[3] != self.value_dim:
            raise ValueError(
                f"values must have shape (batch_size={b}, num_kv_heads={h}, T={k.shape[2]}, "
                f"value_dim={self.value_dim}), got {v.shape}")
        for arr, what in ((k, "keys"), (v, "values")):
            if not np.can_cast(arr.dtype, self.dtype, casting="same_kind"):
                raise TypeError(f"{what} of dtype {arr.dtype} cannot be stored in a "
                                f"{self.dtype} cache")
        n_new = k.shape[2]
        self._check_room(n_new)
        start = self._len
        with np.errstate(over="ignore"):  # beyond a 16-bit range: +-inf, documented
            self._keys[:, :, start:start + n_new] = k
            self._values[:, :, start:start + n_new] = v
        self._len = start + n_new

    def _filled(self):
        # Internal, writable views of the filled part (no copies).
        return self._keys[:, :, :self._len], self._values[:, :, :self._len]


# ---------------------------------------------------------------------------
# multi_head_attention
# ---------------------------------------------------------------------------
