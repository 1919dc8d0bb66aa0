"""attention(): validation, dtype rules, broadcasting, ``out=``, the kernel
call; its steps (:func:`arrays_and_dtypes`, :func:`problem_shape`,
:func:`run_kernel`) are also those of the Dask tasks.  The checks shared with
the other public functions are :mod:`fastattn._validate`'s.

Everything here is plain Python and NumPy; the arithmetic happens in the C
kernels behind :mod:`fastattn._core`, called once per public call."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NoReturn, SupportsFloat, SupportsIndex, overload

import numpy as np

from . import _core
from . import _gqa
from . import _half
from . import _scores
from ._masks import MaskPlan, resolve
from ._validate import (as_array, check_out, check_scale, kernel_dtypes, physical_memory,
                        thread_count)

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Result: TypeAlias = (_Float | tuple[_Float, _Float] | tuple[_Float, _Float, _Float])
    _Window: TypeAlias = SupportsIndex | tuple[SupportsIndex | None, SupportsIndex | None] | None

__all__ = ["attention"]

_F16, _F32, _F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
_ndarray = np.ndarray
_MAX_BATCH_DIMS = _core.MAX_BATCH_DIMS


@overload
def attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
              attn_mask: ArrayLike | None = None, is_causal: _Causal = False,
              scale: SupportsFloat | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | None = None, return_weights: Literal[False] = False,
              out: NDArray[Any] | None = None,
              num_threads: SupportsIndex | None = None,
              window: _Window = None,
              alibi_slopes: ArrayLike | None = None, softcap: SupportsFloat | None = None,
              sinks: ArrayLike | None = None, return_lse: Literal[False] = False) -> _Float: ...
@overload
def attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
              attn_mask: ArrayLike | None = None, is_causal: _Causal = False,
              scale: SupportsFloat | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | None = None, return_weights: Literal[True],
              out: NDArray[Any] | None = None,
              num_threads: SupportsIndex | None = None,
              window: _Window = None,
              alibi_slopes: ArrayLike | None = None, softcap: SupportsFloat | None = None,
              sinks: ArrayLike | None = None, return_lse: Literal[False] = False) -> tuple[_Float, _Float]: ...
@overload
def attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
              attn_mask: ArrayLike | None = None, is_causal: _Causal = False,
              scale: SupportsFloat | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | None = None, return_weights: Literal[False] = False,
              out: NDArray[Any] | None = None,
              num_threads: SupportsIndex | None = None,
              window: _Window = None,
              alibi_slopes: ArrayLike | None = None, softcap: SupportsFloat | None = None,
              sinks: ArrayLike | None = None, return_lse: Literal[True]) -> tuple[_Float, _Float]: ...
@overload
def attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
              attn_mask: ArrayLike | None = None, is_causal: _Causal = False,
              scale: SupportsFloat | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | None = None, return_weights: bool = False,
              out: NDArray[Any] | None = None,
              num_threads: SupportsIndex | None = None,
              window: _Window = None,
              alibi_slopes: ArrayLike | None = None, softcap: SupportsFloat | None = None,
              sinks: ArrayLike | None = None, return_lse: bool = False) -> _Result: ...
def attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
              attn_mask: ArrayLike | None = None, is_causal: _Causal = False,
              scale: SupportsFloat | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | None = None, return_weights: bool = False,
              out: NDArray[Any] | None = None,
              num_threads: SupportsIndex | None = None,
              window: _Window = None,
              alibi_slopes: ArrayLike | None = None, softcap: SupportsFloat | None = None,
              sinks: ArrayLike | None = None, return_lse: bool = False) -> _Result:
    """Scaled dot-product attention, ``softmax(Q Kᵀ · scale + mask) V``.

    The semantics of :func:`torch.nn.functional.scaled_dot_product_attention`
    on NumPy arrays, computed by cache-blocked SIMD kernels on OpenMP
    threads, with the GIL released.

    Parameters
    ----------
    query : array_like, shape (..., L, E)
    key : array_like, shape (..., S, E)
    value : array_like, shape (..., S, Ev)
        Leading dimensions broadcast against each other as in ``np.matmul``.
        Any strides (transposed, sliced, negative) are read in place.
    attn_mask : array_like of bool or float, optional
        Broadcastable to ``(..., L, S)``.  bool: True = may attend (as in
        torch SDPA); float: added to the scaled scores (``-inf`` hides).
    is_causal : bool or {'upper_left', 'lower_right'}, optional
        ``True`` or ``'upper_left'``: query ``i`` sees key ``j`` iff ``j <= i``
        (torch's alignment).  ``'lower_right'``: iff ``j <= i + S - L``, what
        decoding with a KV cache needs.  Combines with the other masks.
    scale : float, optional
        Multiplies ``Q Kᵀ``; default ``1 / sqrt(E)``.
    enable_gqa : bool, optional
        Grouped-query attention: dimension -3 holds heads, ``Hq`` a multiple
        of ``Hkv``; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
        K and V are never copied.
    key_padding_mask : array_like of bool, optional
        True = padding (hidden); shape ``(S,)`` or ``(N, S)`` with
        ``N = query.shape[0]``, as in ``torch.nn.MultiheadAttention``.
    return_weights : bool, optional
        Also return the attention weights ``(..., L, S)``.  Only then is an
        ``L x S`` matrix ever allocated.
    out : ndarray, optional
        Array of the result's exact shape and dtype (any strides), filled and
        returned.  Left untouched when an error is raised.
    num_threads : int, optional
        OpenMP threads (at most 256 are used); None = the OpenMP default.  The
        result is bitwise the same for every thread count.
    window : int or (left, right), optional
        Sliding-window (local) attention: query ``i``, at key position
        ``p(i)`` (``i``, or ``i + S - L`` with ``is_causal='lower_right'``),
        sees only the keys ``j`` with ``p(i) - left <= j <= p(i) + right``.
        An int ``w`` means ``(w, w)``; ``None`` (the default, or either side)
        is unbounded.  Combines with ``is_causal`` and every mask.  Key blocks
        outside every row's window are never computed: the cost grows with
        ``L * (left + right + 1)``, not ``L * S``.
    alibi_slopes : array_like, optional
        ALiBi: one slope per head, broadcastable to ``(..., H)`` (the batch
        shape, heads on axis -3 of ``query``); ``slope * |p(i) - j|`` is
        subtracted from the scaled (capped) score, ``p(i) = i + S - L`` with
        ``is_causal='lower_right'``, else ``i``.  Finite.
    softcap : float, optional
        ``> 0``: each scaled score ``s`` becomes ``softcap * tanh(s /
        softcap)``, before ALiBi and ``attn_mask``.
    sinks : array_like, optional
        One logit per head, broadcastable to ``(..., H)``, that joins every
        row's softmax denominator and carries no value (so a row's weights sum
        to less than 1); not NaN or ``+inf`` (``-inf``: no sink).  A row with
        no visible key still gives zeros.
    return_lse : bool, optional
        Also return each row's natural-log log-sum-exp of its final logits
        over its visible keys (the sink's ``exp`` included), ``-inf`` for a
        row with none: shape ``(..., H, L)`` (the batch shape + ``(L,)``),
        float32 for float16/bfloat16/float32 inputs, float64 for float64.  With it,
        :func:`fastattn.merge_attention` combines results over disjoint keys.

    Returns
    -------
    output : ndarray, shape (..., L, Ev)
        The inputs' dtype: float32, float64, float16 or bfloat16
        (``ml_dtypes.bfloat16``); the 16-bit ones are read in place, computed
        in float32 and the result rounded once (to nearest even).  Mixed
        16-bit dtypes give float32, a 16-bit dtype with float32 float32, with
        float64 float64; other mixes follow ``np.result_type``; integer and
        bool inputs give float64.  A float ``attn_mask`` is used in the
        inputs' dtype (float16 and bfloat16 ones too).
    weights : ndarray, shape (..., L, S)
        Only with ``return_weights=True``; the output's dtype.
    lse : ndarray, shape (..., L)
        Only with ``return_lse=True``; always last: ``(out, lse)`` or
        ``(out, weights, lse)``.

    Raises
    ------
    ValueError
        ``alibi_slopes`` or ``sinks`` of a shape that does not broadcast to
        ``(..., H)`` or with a bad value (non-finite slopes; NaN or ``+inf``
        sinks), ``softcap <= 0`` or non-finite; shapes that do not fit.
    TypeError
        A bool or non-real ``softcap``, ``alibi_slopes`` or ``sinks``.

    Notes
    -----
    A position hidden by any mask (or whose score is ``-inf``) gets weight
    exactly 0 and has no influence on the output, even if that key's or
    value's entries are NaN or Inf.  A row with no visible key gets zero
    weights and a zero output.  A visible NaN score makes its row NaN, as in
    SciPy.

    Examples
    --------
    The three-token example of the walkthrough, with causal masking:

    >>> import numpy as np, fastattn
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> out, w = fastattn.attention(x, x, x, is_causal=True, return_weights=True)
    >>> np.round(w, 3)
    array([[1.   , 0.   , 0.   ],
           [0.33 , 0.67 , 0.   ],
           [0.248, 0.248, 0.503]])
    >>> np.round(out, 3)
    array([[1.   , 0.   ],
           [0.33 , 0.67 ],
           [0.752, 0.752]])

    A causal sliding window: each query sees itself and one key before it:

    >>> w = fastattn.attention(x, x, x, is_causal=True, window=(1, 0),
    ...                        return_weights=True)[1]
    >>> np.round(w, 3)
    array([[1.  , 0.  , 0.  ],
           [0.33, 0.67, 0.  ],
           [0.  , 0.33, 0.67]])

    The score options (one head here: the batch shape is ``(1,)``):

    >>> x1 = x[None]
    >>> out, lse = fastattn.attention(x1, x1, x1, softcap=5.0, alibi_slopes=[0.5],
    ...                               sinks=[0.0], return_lse=True)
    >>> lse.shape
    (1, 3)
    >>> np.round(lse, 3)
    array([[1.474, 1.579, 1.936]])
    """
    # The common case (float32/float64 arrays, one batch shape, no mask array,
    # no options) takes one call per step and nothing more: with the kernel
    # call, these steps are the whole overhead of a tiny problem.
    q, k, v, cdt, odt = arrays_and_dtypes(query, key, value)
    batch, gqa, L, S, E, Ev = problem_shape(q.shape, k.shape, v.shape, enable_gqa)
    adt = _half.arith(cdt)  # the arithmetic: float32 for 16-bit inputs
    sc = check_scale(scale, adt) if scale is not None else 1.0 / math.sqrt(E) if E > 0 else 1.0
    nt = 0 if num_threads is None else thread_count(num_threads)
    plan = resolve(attn_mask, is_causal, key_padding_mask, batch, L, S, cdt, q.ndim, window)
    opts = None
    if alibi_slopes is not None or softcap is not None or sinks is not None or return_lse:
        opts = _scores.resolve(alibi_slopes, softcap, sinks, batch, adt)
    if out is not None:
        check_out(out, batch + (L, Ev), odt, (("query", q), ("key", k), ("value", v),
                                               ("attn_mask", plan.bool_mask),
                                               ("attn_mask", plan.add_mask),
                                               ("key_padding_mask", plan.pad)))
    weights = _weights_array(batch + (L, S), cdt) if return_weights else None
    lse = np.empty(batch + (L,), adt) if return_lse else None
    result = run_kernel(q, k, v, cdt, odt, batch, gqa, sc, plan, weights, out, nt, opts, lse)
    if return_weights:
        w = weights if odt is cdt else weights.astype(odt)
        return (result, w, lse) if return_lse else (result, w)
    return (result, lse) if return_lse else result


# ---------------------------------------------------------------------------
# the steps of attention(), in order
# ---------------------------------------------------------------------------

def arrays_and_dtypes(query, key, value) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.dtype, np.dtype]:
    """query, key and value as arrays, and their (compute dtype, result dtype)."""
    q = query if type(query) is _ndarray else as_array(query, "query")
    k = key if type(key) is _ndarray else as_array(key, "key")
    v = value if type(value) is _ndarray else as_array(value, "value")
    dt = q.dtype
    if (dt is _F32 or dt is _F64 or dt is _F16) and k.dtype is dt and v.dtype is dt:
        return q, k, v, dt, dt
    cdt, odt = kernel_dtypes((("query", dt), ("key", k.dtype), ("value", v.dtype)))
    return q, k, v, cdt, odt


def problem_shape(qs: tuple, ks: tuple, vs: tuple, enable_gqa: bool) -> tuple:
    """(batch, gqa, L, S, E, Ev) of query, key and value of shapes qs, ks, vs.

    ``batch`` is the broadcast leading dimensions; ``gqa`` is None, or (key/value
    heads, query heads per key head) with ``enable_gqa``."""
    if len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
        name, shape = next((n, s) for n, s in (("query", qs), ("key", ks), ("value", vs))
                           if len(s) < 2)
        raise ValueError(f"{name} must have at least 2 dimensions (..., rows, features), "
                         f"got shape {shape}")
    L, E = qs[-2:]
    S, Ek = ks[-2:]
    Ev = vs[-1]
    if Ek != E:
        raise ValueError(f"key's last dimension ({Ek}) must equal query's ({E}): "
                         f"query {qs}, key {ks}")
    if vs[-2] != S:
        raise ValueError(f"value must have as many rows as key (S): key {ks}, value {vs}")
    gqa = _gqa_groups(qs, ks, vs) if enable_gqa else None
    batch = qs[:-2]
    if gqa is not None or batch != ks[:-2] or batch != vs[:-2]:
        batch = _batch_shape(qs, ks, vs, gqa, enable_gqa)
    if len(batch) + (gqa is not None) > _MAX_BATCH_DIMS:
        _too_many_dims(qs, ks, vs)
    return batch, gqa, L, S, E, Ev


def _gqa_groups(qs: tuple, ks: tuple, vs: tuple) -> tuple[int, int] | None:
    """(key/value heads, query heads per key head) for enable_gqa; None if equal."""
    if len(qs) < 3 or len(ks) < 3 or len(vs) < 3:
        raise ValueError(f"enable_gqa needs a head dimension (-3) in query, key and value: "
                         f"query {qs}, key {ks}, value {vs}")
    hq, hk, hv = qs[-3], ks[-3], vs[-3]
    if hk != hv or hk == 0 or hq % hk:
        raise ValueError(f"enable_gqa: query heads ({hq}) must be a multiple of the key/value "
                         f"heads ({hk}, {hv}), which must be equal: query {qs}, key {ks}, "
                         f"value {vs}")
    return None if hq == hk else (hk, hq // hk)


def _too_many_dims(qs: tuple, ks: tuple, vs: tuple) -> NoReturn:
    raise ValueError(f"at most {_MAX_BATCH_DIMS} leading dimensions: query {qs}, key {ks}, "
                     f"value {vs}")


def _batch_shape(qs: tuple, ks: tuple, vs: tuple, gqa, enable_gqa: bool) -> tuple:
    """The broadcast leading dimensions of query, key and value."""
    if max(len(qs), len(ks), len(vs)) - 2 > _MAX_BATCH_DIMS:
        _too_many_dims(qs, ks, vs)  # before NumPy's own limit on dimensions
    try:
        if gqa is None:
            return np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
        hq = qs[-3]
        return np.broadcast_shapes(qs[:-2], ks[:-3] + (hq,), vs[:-3] + (hq,))
    except ValueError:
        raise ValueError(f"the leading dimensions of query {qs}, key {ks} and value {vs} do not "
                         f"broadcast" + ("" if enable_gqa else
                                         " (for grouped-query heads, enable_gqa=True)")) from None


def _weights_array(shape: tuple, cdt: np.dtype) -> np.ndarray:
    """The (..., L, S) array return_weights fills, if this machine can hold it."""
    nbytes = math.prod(shape) * cdt.itemsize
    if nbytes > physical_memory():
        raise MemoryError(f"the weights {shape} need {nbytes / 2**30:.1f} GiB, more "
                          f"than this machine's memory; use return_weights=False (streaming)")
    try:
        return np.empty(shape, dtype=cdt)
    except ValueError as e:  # larger than the address space
        raise MemoryError(f"the weights {shape} cannot be allocated: {e}") from None


def run_kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, cdt: np.dtype, odt: np.dtype,
               batch: tuple, gqa, sc: float, plan: MaskPlan, weights, out, nt: int,
               opts: _scores.ScoreOptions | None = None, lse: np.ndarray | None = None):
    """The inputs in the compute dtype, through the kernel: the output in the
    result dtype, ``out`` itself when given (``weights`` and ``lse`` filled
    if given; ``opts``: the score options, None if there are none)."""
    q, k, v = kernel_inputs(q, k, v, cdt)
    # The kernel writes out itself when it can, else a new array it allocates.
    direct = out is not None and odt is cdt and out.flags.aligned
    if gqa is None:
        causal, offset, wl, wr, bm, am, pad = plan
        target = out if direct else None
        if opts is None and lse is None:
            target = _core.attention(q, k, v, target, batch=batch, scale=sc, causal=causal,
                                     causal_offset=offset, win_left=wl, win_right=wr,
                                     bool_mask=bm, add_mask=am, pad=pad, weights=weights,
                                     num_threads=nt)
        else:
            cap, al, sk = opts if opts is not None else (0.0, None, None)
            target = _core.attention(q, k, v, target, batch=batch, scale=sc, causal=causal,
                                     causal_offset=offset, win_left=wl, win_right=wr,
                                     bool_mask=bm, add_mask=am, pad=pad, weights=weights,
                                     num_threads=nt, softcap=cap, alibi=al, sinks=sk,
                                     lse=None if lse is None else lse[..., None])
    else:
        target = out if direct else np.empty(batch + (q.shape[-2], v.shape[-1]), dtype=cdt)
        _gqa.run_grouped(q, k, v, target, batch, gqa, sc, plan, weights, nt, opts, lse)
    if target is not out:
        if out is not None:
            out[...] = target
            return out
        if odt is not cdt:
            return target.astype(odt)
    return target


def kernel_inputs(q: np.ndarray, k: np.ndarray, v: np.ndarray, cdt: np.dtype
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v as the kernel reads them: of the compute dtype ``cdt`` (or
    float32 queries against 16-bit keys and values, read in place), aligned;
    a copy only where needed."""
    if _core.in_kernel_form(q, k, v, cdt):
        return q, k, v
    if cdt is _F32 and k.dtype == v.dtype and _half.is_half(k.dtype):
        # float32 queries against 16-bit keys and values (a KV cache): the
        # kernel reads K and V in place, never a float32 copy
        return kernel_operand(q, cdt), kernel_operand(k, k.dtype), kernel_operand(v, v.dtype)
    return kernel_operand(q, cdt), kernel_operand(k, cdt), kernel_operand(v, cdt)


def kernel_operand(x: np.ndarray, cdt: np.dtype) -> np.ndarray:
    """x in the kernel's element type ``cdt``, aligned (a copy only when
    either is needed)."""
    if x.dtype != cdt:
        return x.astype(cdt)
    return x if x.flags.aligned else np.ascontiguousarray(x)
