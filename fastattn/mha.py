"""Multi-head attention, with a key/value cache for decoding (fastattn.kvcache).

Everything here is bookkeeping around :func:`fastattn.attention`: the input
projections and the output projection are plain :func:`numpy.matmul` calls,
the heads are *views* of the projected arrays (``reshape`` + ``transpose``,
no copies), and the attention itself -- masks, grouped-query heads, causal
alignment -- is done by the library's kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, overload

import numpy as np

from . import _api
from . import _half
from ._masks import check_cache_causal, check_head_masks, check_window
from ._validate import kernel_dtypes, positive_int, real_array
from .kvcache import KVCache

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Window: TypeAlias = SupportsIndex | tuple[SupportsIndex | None, SupportsIndex | None] | None

__all__ = ["multi_head_attention", "KVCache"]


# ---------------------------------------------------------------------------
# small validation helpers
# ---------------------------------------------------------------------------

def _check_weight(w, name, rows, rows_what, cols_multiple_of, cols_what, expected_cols=None):
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D ({rows_what}, {cols_what}), got shape {w.shape}")
    if w.shape[0] != rows:
        raise ValueError(
            f"{name} has shape {w.shape}: its first dimension must be {rows_what}={rows}")
    if expected_cols is not None:
        if w.shape[1] != expected_cols:
            raise ValueError(
                f"{name} has shape {w.shape}: its second dimension must be "
                f"{cols_what}={expected_cols}")
    elif w.shape[1] % cols_multiple_of != 0 or w.shape[1] == 0:
        raise ValueError(
            f"{name} has shape {w.shape}: its second dimension ({w.shape[1]}) must be a "
            f"positive multiple of {cols_what.split('*')[0]}={cols_multiple_of}")


def _head_major_view(a, n, seq, heads, d):
    """View the projection (n, seq, heads * d) as (n, heads, seq, d) (no copy)."""
    return a.reshape(n, seq, heads, d).transpose(0, 2, 1, 3)


@overload
def multi_head_attention(x: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
                         w_o: ArrayLike, num_heads: SupportsIndex, *,
                         num_kv_heads: SupportsIndex | None = None,
                         context: ArrayLike | None = None,
                         is_causal: bool | Literal["upper_left", "lower_right"] = False,
                         attn_mask: ArrayLike | None = None,
                         key_padding_mask: ArrayLike | None = None,
                         kv_cache: KVCache | None = None, return_weights: Literal[False] = False,
                         num_threads: SupportsIndex | None = None,
                         window: _Window = None,
                         alibi_slopes: ArrayLike | None = None,
                         softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                         return_lse: Literal[False] = False) -> _Float: ...
@overload
def multi_head_attention(x: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
                         w_o: ArrayLike, num_heads: SupportsIndex, *,
                         num_kv_heads: SupportsIndex | None = None,
                         context: ArrayLike | None = None,
                         is_causal: bool | Literal["upper_left", "lower_right"] = False,
                         attn_mask: ArrayLike | None = None,
                         key_padding_mask: ArrayLike | None = None,
                         kv_cache: KVCache | None = None, return_weights: Literal[True],
                         num_threads: SupportsIndex | None = None,
                         window: _Window = None,
                         alibi_slopes: ArrayLike | None = None,
                         softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                         return_lse: Literal[False] = False) -> tuple[_Float, _Float]: ...
@overload
def multi_head_attention(x: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
                         w_o: ArrayLike, num_heads: SupportsIndex, *,
                         num_kv_heads: SupportsIndex | None = None,
                         context: ArrayLike | None = None,
                         is_causal: bool | Literal["upper_left", "lower_right"] = False,
                         attn_mask: ArrayLike | None = None,
                         key_padding_mask: ArrayLike | None = None,
                         kv_cache: KVCache | None = None, return_weights: Literal[False] = False,
                         num_threads: SupportsIndex | None = None,
                         window: _Window = None,
                         alibi_slopes: ArrayLike | None = None,
                         softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                         return_lse: Literal[True]) -> tuple[_Float, _Float]: ...
@overload
def multi_head_attention(x: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
                         w_o: ArrayLike, num_heads: SupportsIndex, *,
                         num_kv_heads: SupportsIndex | None = None,
                         context: ArrayLike | None = None,
                         is_causal: bool | Literal["upper_left", "lower_right"] = False,
                         attn_mask: ArrayLike | None = None,
                         key_padding_mask: ArrayLike | None = None,
                         kv_cache: KVCache | None = None, return_weights: bool = False,
                         num_threads: SupportsIndex | None = None,
                         window: _Window = None,
                         alibi_slopes: ArrayLike | None = None,
                         softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                         return_lse: bool = False) -> _Float | tuple[_Float, _Float] | tuple[_Float, _Float, _Float]: ...
def multi_head_attention(x: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
                         w_o: ArrayLike, num_heads: SupportsIndex, *,
                         num_kv_heads: SupportsIndex | None = None,
                         context: ArrayLike | None = None,
                         is_causal: bool | Literal["upper_left", "lower_right"] = False,
                         attn_mask: ArrayLike | None = None,
                         key_padding_mask: ArrayLike | None = None,
                         kv_cache: KVCache | None = None, return_weights: bool = False,
                         num_threads: SupportsIndex | None = None,
                         window: _Window = None,
                         alibi_slopes: ArrayLike | None = None,
                         softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                         return_lse: bool = False
                         ) -> _Float | tuple[_Float, _Float] | tuple[_Float, _Float, _Float]:
    """Multi-head (grouped-query, multi-query, cross-) attention without biases.

    Computes ``Q = x @ w_q``, ``K = s @ w_k``, ``V = s @ w_v`` (``s`` is
    ``context`` for cross-attention, else ``x``), splits them into heads
    (contiguous column slices), runs scaled dot-product attention per head with
    :func:`fastattn.attention`, concatenates the heads and returns
    ``concat @ w_o``.  This is ``torch.nn.MultiheadAttention(bias=False,
    batch_first=True)`` with ``in_proj_weight = concat(w_q.T, w_k.T, w_v.T)``
    and ``out_proj.weight = w_o.T``, except for the mask conventions below.

    Parameters
    ----------
    x : array_like, shape (N, L, d_model) or (L, d_model)
        Query tokens.
    w_q : array_like, shape (d_model, num_heads * d_k)
    w_k : array_like, shape (d_kv_in, num_kv_heads * d_k)
    w_v : array_like, shape (d_kv_in, num_kv_heads * d_v)
        Projections; ``d_kv_in`` is the last dimension of ``context`` (of ``x``
        without context).  Head ``h`` uses columns ``h*d_k:(h+1)*d_k``.
    w_o : array_like, shape (num_heads * d_v, d_out)
        Output projection.
    num_heads : int
        Number of query heads.
    num_kv_heads : int, optional
        Number of key/value heads (default ``num_heads``); must divide
        ``num_heads``.  Query head ``h`` uses key/value head
        ``h // (num_heads // num_kv_heads)`` (grouped-query attention; 1 is
        multi-query attention).  Keys and values are never copied per query
        head.
    context : array_like, shape (N, S, d_kv_in) or (S, d_kv_in), optional
        Cross-attention: keys and values are projected from ``context``
        (same number of dimensions and batch size as ``x``).
    is_causal : bool or {"upper_left", "lower_right"}, optional
        Causal mask as in :func:`fastattn.attention` (``True`` is
        ``"upper_left"``: query ``i`` sees keys ``j <= i``).  Ignored with
        ``kv_cache``, which is always causal, lower-right aligned
        (``"upper_left"`` is rejected there).
    attn_mask : array_like, optional
        Boolean (True = may attend, as in SDPA -- the opposite of
        ``torch.nn.MultiheadAttention``) or additive float mask, broadcastable
        to ``(N, num_heads, L, S)`` (``(num_heads, L, S)`` for 2-D ``x``).
        With ``kv_cache``, ``S`` is the cache length after appending.
    key_padding_mask : array_like of bool, shape (N, S) or (S,), optional
        True marks a padding key that no query may attend to.
    kv_cache : KVCache, optional
        Self-attention decoding: the keys and values of the new tokens ``x``
        are appended to the cache, and each new query attends to every cached
        position up to and including its own (lower-right causal alignment).
        Old tokens are not projected again and the cache is not copied, so a
        one-token step costs time proportional to the cached length.  The
        cache's batch size, head layout (``num_kv_heads``, ``d_k``, ``d_v``)
        and dtype must match the call (a float16 or bfloat16 call takes a
        cache of its own dtype or a float32 one, see Notes; an int8 cache
        serves float32 and float16 calls, without ``attn_mask`` or
        ``return_weights``: see :class:`KVCache`).  Not allowed with
        ``context``.
    return_weights : bool, optional
        Also return the attention weights of every head (not averaged over
        heads, unlike torch's default).
    num_threads : int, optional
        Passed to :func:`fastattn.attention`.
    window : int or (left, right), optional
        Sliding-window attention, passed to :func:`fastattn.attention`; with
        ``kv_cache`` the queries are lower-right aligned (the last query sits
        at the last cached key).  Checked before anything is cached.
    alibi_slopes, softcap, sinks, return_lse : optional
        Passed to :func:`fastattn.attention` (its docstring has the
        semantics): ``alibi_slopes`` and ``sinks`` broadcastable to
        ``(N, num_heads)``; with a cache, ALiBi positions count the cached
        tokens (the query sits at the end, lower-right).

    Returns
    -------
    out : ndarray, shape (N, L, d_out) or (L, d_out)
    weights : ndarray, shape (N, num_heads, L, S) or (num_heads, L, S)
        Only with ``return_weights=True``.
    lse : ndarray, shape (N, num_heads, L) or (num_heads, L)
        Only with ``return_lse=True`` (always last): each row's log-sum-exp,
        float32 for float16/bfloat16/float32 work, float64 for float64.

    Raises
    ------
    ValueError
        Wrong shapes of ``x``, ``context``, weights or masks; ``num_heads``
        not a multiple of ``num_kv_heads``; a cache whose batch size or head
        layout differs from the call; a cache without room for the new
        tokens.  Nothing is appended to the cache when an error is raised.
    TypeError
        Non-integer head counts, non-real dtypes, a cache of another dtype, a
        ``kv_cache`` that is not a :class:`KVCache`.

    Notes
    -----
    dtypes follow NumPy's promotion of ``x``, ``context`` and the weights
    (integers compute in float64).  float32 and float64 are kept.  When
    everything is float16, the inputs are converted exactly to float32, all
    the work (projections, attention, output projection) is done in float32,
    and only the result is rounded to float16: every element of the output
    is within half a float16 ulp (relative ``2**-11`` ~ 4.9e-4, or ``2**-25``
    absolute below the normal range) of the float32 computation on the same
    inputs; results beyond 65504 become ``inf``.  The weights are rounded the
    same way.  bfloat16 works the same way (relative ``2**-8``).  A float16
    or bfloat16 call may use a float32 ``kv_cache`` (same guarantee, no
    copies) or one of its own dtype (half the memory and half the bytes a
    decoding step reads: keys and values are rounded when stored, one more
    relative ``2**-11`` (``2**-8``) on K and V, and the kernels read the
    cache in place, against the float32 queries).

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.mha import multi_head_attention, KVCache
    >>> rng = np.random.default_rng(0)
    >>> d_model, heads, kv_heads, d_k = 16, 4, 2, 4
    >>> x = rng.standard_normal((2, 5, d_model))
    >>> w_q = rng.standard_normal((d_model, heads * d_k))
    >>> w_k = rng.standard_normal((d_model, kv_heads * d_k))
    >>> w_v = rng.standard_normal((d_model, kv_heads * d_k))
    >>> w_o = rng.standard_normal((heads * d_k, d_model))
    >>> out = multi_head_attention(x, w_q, w_k, w_v, w_o, heads,
    ...                            num_kv_heads=kv_heads, is_causal=True)
    >>> out.shape
    (2, 5, 16)

    Decoding with a cache: prefill 3 tokens, then one token at a time.

    >>> cache = KVCache(2, kv_heads, d_k, max_len=5, dtype=np.float64)
    >>> steps = [multi_head_attention(x[:, :3], w_q, w_k, w_v, w_o, heads,
    ...                               num_kv_heads=kv_heads, kv_cache=cache)]
    >>> for t in (3, 4):
    ...     steps.append(multi_head_attention(x[:, t:t + 1], w_q, w_k, w_v, w_o, heads,
    ...                                       num_kv_heads=kv_heads, kv_cache=cache))
    >>> len(cache), bool(np.allclose(np.concatenate(steps, axis=1), out))
    (5, True)
    """
    num_heads, num_kv_heads = _head_counts(num_heads, num_kv_heads)
    x, w_q, w_k, w_v, w_o, context, kdt, odt = _arrays(x, w_q, w_k, w_v, w_o, context,
                                                       kv_cache)
    cdt = _half.arith(kdt)  # every step in float32 for 16-bit inputs, rounded once at the end
    squeeze = x.ndim == 2
    xb = x[None] if squeeze else x
    src = xb if context is None else (context[None] if squeeze else context)
    n, L, _ = xb.shape
    S_new = src.shape[1]
    d_k, d_v = _head_dims(w_q, w_k, w_v, w_o, xb, src, context is None, num_heads,
                          num_kv_heads)
    S = S_new
    if kv_cache is not None:
        _check_cache(kv_cache, is_causal, (n, num_kv_heads, d_k, d_v), odt, cdt,
                     (x, w_q, w_k, w_v, w_o), num_kv_heads)
        kv_cache.check_room(S_new)
        S += len(kv_cache)
        if kv_cache.dtype == np.int8 and (attn_mask is not None or return_weights):
            raise ValueError("an int8 kv_cache supports neither attn_mask nor return_weights "
                             "(key_padding_mask, window and the score options work)")
    # masks and window: shapes only, before anything is cached
    check_window(window)
    attn_mask, key_padding_mask = check_head_masks(attn_mask, key_padding_mask, n, num_heads,
                                                   L, S, unbatched=squeeze)
    q, k_new, v_new = _project(xb, src if context is not None else None, w_q, w_k, w_v, cdt,
                               num_heads, num_kv_heads, d_k, d_v)
    res = _attend(q, k_new, v_new, kv_cache, cdt, is_causal, dict(
        attn_mask=attn_mask, enable_gqa=num_kv_heads != num_heads,
        key_padding_mask=key_padding_mask, return_weights=return_weights,
        num_threads=num_threads, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
        sinks=sinks, return_lse=return_lse))
    lse = None
    if return_lse:
        *res, lse = res
        res = tuple(res) if return_weights else res[0]
        lse = lse[0] if squeeze else lse
    heads, weights = res if return_weights else (res, None)
    out = _merge_heads(heads, w_o, cdt, odt)
    out = out[0] if squeeze else out
    if not return_weights:
        return (out, lse) if return_lse else out
    weights = weights.astype(odt, copy=False)
    weights = weights[0] if squeeze else weights
    return (out, weights, lse) if return_lse else (out, weights)


# ---------------------------------------------------------------------------
# the steps of multi_head_attention(), in order
# ---------------------------------------------------------------------------

def _head_counts(num_heads, num_kv_heads) -> tuple[int, int]:
    """num_heads and num_kv_heads as checked ints (num_kv_heads divides num_heads)."""
    num_heads = positive_int(num_heads, "num_heads")
    num_kv_heads = num_heads if num_kv_heads is None else positive_int(num_kv_heads,
                                                                         "num_kv_heads")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    return num_heads, num_kv_heads


def _arrays(x, w_q, w_k, w_v, w_o, context, kv_cache):
    """The inputs as arrays, and their (compute dtype, result dtype)."""
    x = real_array(x, "x")
    if x.ndim not in (2, 3):
        raise ValueError(f"x must have shape (N, L, d_model) or (L, d_model), got {x.shape}")
    w_q = real_array(w_q, "w_q")
    w_k = real_array(w_k, "w_k")
    w_v = real_array(w_v, "w_v")
    w_o = real_array(w_o, "w_o")
    arrays = [("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)]
    if context is not None:
        if kv_cache is not None:
            raise ValueError("context and kv_cache cannot be combined: the cache is for "
                             "causal self-attention decoding")
        context = real_array(context, "context")
        if context.ndim != x.ndim:
            raise ValueError(f"context must have as many dimensions as x ({x.ndim}): "
                             f"x has shape {x.shape}, context has shape {context.shape}")
        if x.ndim == 3 and context.shape[0] != x.shape[0]:
            raise ValueError(f"context and x must have the same batch size: x has shape "
                             f"{x.shape}, context has shape {context.shape}")
        arrays.append(("context", context))
    cdt, odt = kernel_dtypes(tuple((n, a.dtype) for n, a in arrays))
    return x, w_q, w_k, w_v, w_o, context, cdt, odt


def _head_dims(w_q, w_k, w_v, w_o, xb, src, self_attention: bool, num_heads: int,
               num_kv_heads: int) -> tuple[int, int]:
    """(d_k, d_v) from the weights, every weight's shape checked."""
    d_model, d_in = xb.shape[2], src.shape[2]
    _check_weight(w_q, "w_q", d_model, "d_model", num_heads, "num_heads*d_k")
    d_k = w_q.shape[1] // num_heads
    kv_in = "d_model" if self_attention else "context's last dimension"
    _check_weight(w_k, "w_k", d_in, kv_in, num_kv_heads, "num_kv_heads*d_k",
                  expected_cols=num_kv_heads * d_k)
    _check_weight(w_v, "w_v", d_in, kv_in, num_kv_heads, "num_kv_heads*d_v")
    d_v = w_v.shape[1] // num_kv_heads
    if w_o.ndim != 2 or w_o.shape[0] != num_heads * d_v:
        raise ValueError(f"w_o has shape {w_o.shape}: it must be 2-D with first dimension "
                         f"num_heads*d_v={num_heads}*{d_v}={num_heads * d_v} "
                         f"(w_v has shape {w_v.shape})")
    return d_k, d_v


def _check_cache(kv_cache, is_causal, want: tuple, odt, cdt, arrays, num_kv_heads) -> None:
    """kv_cache fits the call: its type, the causal alignment, its layout
    ``want`` = (batch_size, num_kv_heads, head_dim, value_dim) and dtype."""
    if not isinstance(kv_cache, KVCache):
        raise TypeError(f"kv_cache must be a KVCache, got {type(kv_cache).__name__}")
    check_cache_causal(is_causal)
    x, w_q, w_k, w_v, w_o = arrays
    have = (kv_cache.batch_size, kv_cache.num_kv_heads, kv_cache.head_dim, kv_cache.value_dim)
    if want != have:
        raise ValueError(
            "kv_cache layout (batch_size, num_kv_heads, head_dim, value_dim)="
            f"{have} does not match the call's {want} (x has shape {x.shape}, "
            f"w_k {w_k.shape}, w_v {w_v.shape}, num_kv_heads={num_kv_heads})")
    if kv_cache.dtype == np.int8:      # int8 cache: float32 work only (see KVCache)
        if cdt != np.float32:
            raise TypeError(f"an int8 kv_cache serves float32 (and float16) calls, not "
                            f"{cdt} ones (x {x.dtype}, weights {w_q.dtype}/{w_k.dtype}/"
                            f"{w_v.dtype}/{w_o.dtype})")
        return
    allowed = (odt, cdt) if _half.is_half(odt) else (odt,)
    if kv_cache.dtype not in allowed:
        raise TypeError(f"kv_cache has dtype {kv_cache.dtype} but this call needs "
                        + " or ".join(str(a) for a in allowed)
                        + f" (x {x.dtype}, weights {w_q.dtype}/{w_k.dtype}/"
                        f"{w_v.dtype}/{w_o.dtype})")


def _project(xb, context, w_q, w_k, w_v, cdt, num_heads, num_kv_heads, d_k, d_v):
    """Q, and the new tokens' K and V, as head-major views (no copies)."""
    n, L = xb.shape[:2]
    xq = xb.astype(cdt, copy=False)
    q = np.matmul(xq, w_q.astype(cdt, copy=False))
    s = xq if context is None else context.astype(cdt, copy=False)
    S_new = s.shape[1]
    k_new = np.matmul(s, w_k.astype(cdt, copy=False))
    v_new = np.matmul(s, w_v.astype(cdt, copy=False))
    return (_head_major_view(q, n, L, num_heads, d_k),
            _head_major_view(k_new, n, S_new, num_kv_heads, d_k),
            _head_major_view(v_new, n, S_new, num_kv_heads, d_v))


def _attend(q, k_new, v_new, kv_cache, cdt, is_causal, options: dict):
    """The attention call: over the new keys, or appended to the cache and over
    all of it (lower-right causal); an error leaves the cache as it was."""
    causal = is_causal
    old_len = None if kv_cache is None else len(kv_cache)
    try:
        if kv_cache is not None:
            kv_cache.append(k_new, v_new)
            if kv_cache.dtype == np.int8:   # read in place by its own kernel
                return _attend_int8(q, kv_cache, options)
            # the filled part, read in place (a 16-bit cache too, against float32 queries)
            k, v = kv_cache.keys, kv_cache.values
            causal = "lower_right"
        else:
            k, v = k_new, v_new
        # Looked up at call time, so that a replaced _api.attention is the one called.
        return _api.attention(q, k, v, is_causal=causal, **options)
    except BaseException:
        if kv_cache is not None:
            kv_cache.truncate(old_len)   # an error leaves the cache as it was
        raise


def _attend_int8(q, kv_cache, options: dict):
    """KVCache.attend for an int8 cache; attn_mask and return_weights are not
    supported there (checked before anything is appended, in _check_cache)."""
    opts = {n: options[n] for n in ("key_padding_mask", "num_threads", "window",
                                    "alibi_slopes", "softcap", "sinks", "return_lse")}
    return kv_cache.attend(q, **opts)


def _merge_heads(heads, w_o, cdt, odt):
    """concat(heads) @ w_o, rounded once to the result dtype."""
    n, num_heads, L, d_v = heads.shape
    merged = heads.transpose(0, 2, 1, 3).reshape(n, L, num_heads * d_v)
    out = np.matmul(merged.astype(cdt, copy=False), w_o.astype(cdt, copy=False))
    return out.astype(odt, copy=False)
