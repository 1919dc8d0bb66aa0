"""attention_varlen(): attention over packed sequences of different lengths.

flash-attn's varlen layout on NumPy arrays.  Each sequence is one call of
:func:`fastattn.attention` on zero-copy views of the packed arrays (heads
moved first by a stride swap, never a copy), writing straight into the
matching rows of the packed output: the work of a sequence is its own
``L x S``, never padded to the longest sequence.

The sequences run one after the other, each on all the threads (running
many short ones side by side, one thread each, was slower: their Python
parts take turns on the GIL).  The result is bitwise the same for any
thread count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, overload

import numpy as np

from ._api import attention
from ._half import arith
from ._scores import per_head
from ._validate import check_out, kernel_dtypes
from ._varlen_checks import check_packed

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Window: TypeAlias = "int | tuple[int | None, int | None] | None"

__all__ = ["attention_varlen"]


def _heads_first(a: np.ndarray) -> np.ndarray:
    """(rows, H, C) viewed as (H, rows, C), never a copy."""
    return np.moveaxis(a, 1, 0)


@overload
def attention_varlen(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                     cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     is_causal: _Causal = False, scale: SupportsFloat | None = None,
                     window: _Window = None, alibi_slopes: ArrayLike | None = None,
                     softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                     return_lse: Literal[False] = False, out: NDArray[Any] | None = None,
                     num_threads: SupportsIndex | None = None
                     ) -> _Float: ...
@overload
def attention_varlen(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                     cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     is_causal: _Causal = False, scale: SupportsFloat | None = None,
                     window: _Window = None, alibi_slopes: ArrayLike | None = None,
                     softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                     return_lse: Literal[True], out: NDArray[Any] | None = None,
                     num_threads: SupportsIndex | None = None
                     ) -> tuple[_Float, _Float]: ...
@overload
def attention_varlen(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                     cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     is_causal: _Causal = False, scale: SupportsFloat | None = None,
                     window: _Window = None, alibi_slopes: ArrayLike | None = None,
                     softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                     return_lse: bool = False, out: NDArray[Any] | None = None,
                     num_threads: SupportsIndex | None = None
                     ) -> _Float | tuple[_Float, _Float]: ...
def attention_varlen(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                     cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     is_causal: _Causal = False, scale: SupportsFloat | None = None,
                     window: _Window = None, alibi_slopes: ArrayLike | None = None,
                     softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                     return_lse: bool = False, out: NDArray[Any] | None = None,
                     num_threads: SupportsIndex | None = None
                     ) -> _Float | tuple[_Float, _Float]:
    """Attention over a packed batch of sequences of different lengths.

    flash-attn's varlen layout: sequence ``b`` owns query rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key/value rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; its queries attend to its keys
    only, exactly as one :func:`fastattn.attention` call on that sequence
    (the causal mask, the window and ALiBi counted within the sequence).
    Each sequence costs its own length: nothing is padded.

    Parameters
    ----------
    query : array_like, shape (total_q, H, D)
        The queries of all sequences, one after the other.
    key, value : array_like, shapes (total_k, H_kv, D) and (total_k, H_kv, Dv)
        The keys and values, packed the same way.  ``H`` is a multiple of
        ``H_kv``: grouped-query attention as ``attention(...,
        enable_gqa=True)``, query head ``h`` on key/value head
        ``h // (H // H_kv)``.  Any strides; never copied unless a dtype
        conversion needs it.
    cu_seqlens_q, cu_seqlens_k : array_like of int32 or int64, shape (n + 1,)
        Cumulative sequence lengths: non-decreasing, starting at 0 and
        ending at ``total_q`` and ``total_k``; both describe the same ``n``
        sequences.  Empty sequences are allowed (queries with no key get a
        zero output and an lse of ``-inf``).
    is_causal : bool or {'upper_left', 'lower_right'}, optional
        As in :func:`fastattn.attention`, within each sequence.
    scale : float, optional
        Multiplies ``Q Kᵀ``; default ``1 / sqrt(D)``.
    window : int or (left, right), optional
        Sliding window, as in :func:`fastattn.attention`, within each sequence.
    alibi_slopes : array_like, optional
        Broadcastable to ``(n, H)``: one slope per head, or per sequence
        and head.
    softcap : float, optional
        Soft-capping of the scores, as in :func:`fastattn.attention`.
    sinks : array_like, optional
        Broadcastable to ``(n, H)``: one sink logit per head, or per
        sequence and head.
    return_lse : bool, optional
        Also return the log-sum-exp of each row, heads first.
    out : ndarray, optional
        Array of shape ``(total_q, H, Dv)`` and the result dtype (any
        strides), filled and returned.  Left untouched when an error is
        raised: everything is checked before anything is computed.
    num_threads : int, optional
        OpenMP threads of each sequence's call; None = the OpenMP default.
        The result is bitwise the same for every thread count.

    Returns
    -------
    output : ndarray, shape (total_q, H, Dv)
        The dtype follows :func:`fastattn.attention`.
    lse : ndarray, shape (H, total_q)
        Only with ``return_lse=True``, in the compute dtype (float32 for
        float16/bfloat16/float32 inputs); heads first, as flash-attn's varlen
        functions return it.

    Raises
    ------
    ValueError
        On shapes that do not fit the layout (naming the arguments and their
        shapes), or bad ``cu_seqlens_*`` (not int32/int64, not 1-D, wrong
        ends, decreasing, or of different lengths), naming the array.
    TypeError
        As :func:`fastattn.attention` for bad dtypes and option types.

    See Also
    --------
    fastattn.reference.attention_varlen : the plain NumPy definition.

    Examples
    --------
    Two sequences, of 1 and 2 tokens, packed into 3 rows (one head of two
    dimensions); the second one causal within itself:

    >>> import numpy as np, fastattn
    >>> x = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])
    >>> cu = np.array([0, 1, 3], dtype=np.int32)
    >>> out = fastattn.attention_varlen(x, x, x, cu, cu, is_causal=True)
    >>> out.shape
    (3, 1, 2)
    >>> np.round(out[:, 0], 3)
    array([[1.  , 0.  ],
           [0.  , 1.  ],
           [0.67, 1.  ]])
    """
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    H, H_kv, cq, ck = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k)
    kdt, odt = kernel_dtypes((("query", q.dtype), ("key", k.dtype), ("value", v.dtype)))
    cdt = arith(kdt)  # float32 for 16-bit inputs (read in place)
    n = cq.size - 1
    slopes = per_head("alibi_slopes", alibi_slopes, (n, H), cdt)
    sink = per_head("sinks", sinks, (n, H), cdt, neg_inf_ok=True)
    shape = (q.shape[0], H, v.shape[2])
    if out is not None:
        check_out(out, shape, odt, (("query", q), ("key", k), ("value", v)))
    # Only the options given are passed on, so that a call without them works
    # whatever keywords this build's attention() has.
    options: dict[str, Any] = {}
    if window is not None:
        options["window"] = window
    if softcap is not None:
        options["softcap"] = softcap
    if return_lse:
        options["return_lse"] = True

    # heads first once (stride swaps): a sequence's operands are then plain
    # slices of these views
    qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)
    gqa = H != H_kv

    def call(rows: slice, keys: slice, target, b: int | None):
        extra = options
        if (slopes is not None or sink is not None) and b is not None:
            extra = dict(options)
            if slopes is not None:
                extra["alibi_slopes"] = slopes[b]
            if sink is not None:
                extra["sinks"] = sink[b]
        return attention(qh[:, rows], kh[:, keys], vh[:, keys], is_causal=is_causal,
                         scale=scale, enable_gqa=gqa, out=target, num_threads=num_threads,
                         **extra)

    # The other arguments (is_causal, scale, window, softcap, num_threads...)
    # are checked by attention() itself, on a problem with no rows, before
    # any row of the result is written.
    call(slice(0, 0), slice(0, 0), None, 0 if n else None)
    result = np.empty(shape, dtype=odt) if out is None else out
    rh = _heads_first(result)
    lse = np.full((H, q.shape[0]), -np.inf, dtype=cdt) if return_lse else None
    cql, ckl = cq.tolist(), ck.tolist()
    for b in range(n):
        r0, r1, k0, k1 = cql[b], cql[b + 1], ckl[b], ckl[b + 1]
        if r1 == r0:
            continue
        r = call(slice(r0, r1), slice(k0, k1), rh[:, r0:r1], b)
        if lse is not None:
            lse[:, r0:r1] = r[1]
    return (result, lse) if lse is not None else result
