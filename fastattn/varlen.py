"""attention_varlen(): attention over packed sequences of different lengths.

flash-attn's varlen layout on NumPy arrays.  Each sequence is the problem
of :func:`fastattn.attention` on zero-copy views of the packed arrays (heads
moved first by a stride swap, never a copy), its result written straight
into the matching rows of the packed output: the work of a sequence is its
own ``L x S``, never padded to the longest sequence.

One C call runs every sequence (``src_c/driver/varlen.c``): the long ones
one after the other on all the threads, the short ones side by side in one
parallel region, a thread each.  Each sequence's result is bitwise that of
its own :func:`fastattn.attention` call (its grouped-query heads run as
``attention`` runs them: a one-row sequence's group as the rows of one
problem), and so the same for any thread count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, overload

import numpy as np

from . import _core
from ._api import kernel_inputs
from ._half import arith
from ._validate import as_array, check_out, kernel_dtypes
from ._varlen_call import packed_call
from ._varlen_checks import check_packed

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Window: TypeAlias = "int | tuple[int | None, int | None] | None"

__all__ = ["attention_varlen"]


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
        raised (the result is copied into it once complete).
    num_threads : int, optional
        OpenMP threads of the call; None = the OpenMP default.  The result
        is bitwise the same for every thread count.

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
    q, k, v = (as_array(x, n) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    H, H_kv, cq, ck = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k)
    kdt, odt = kernel_dtypes((("query", q.dtype), ("key", k.dtype), ("value", v.dtype)))
    adt = arith(kdt)  # float32 for 16-bit inputs (read in place)
    pc = packed_call(H, H_kv, q.shape[2], cq, ck, kdt, adt, is_causal, scale, window,
                     alibi_slopes, softcap, sinks, num_threads)
    shape = (q.shape[0], H, v.shape[2])
    if out is not None:
        check_out(out, shape, odt, (("query", q), ("key", k), ("value", v)))
    q, k, v = kernel_inputs(q, k, v, kdt)
    # Into a new array even when out is given: a sequence's call can still
    # fail (its scratch) after others have written, and out must then be
    # left as it was.
    result = np.empty(shape, dtype=kdt)
    lse = np.empty((H, q.shape[0]), dtype=adt) if return_lse else None
    _core.attention(pc.rows(q), pc.keys(k), pc.keys(v), pc.rows(result), batch=pc.batch,
                    scale=pc.scale, causal=pc.causal, win_left=pc.win_left,
                    win_right=pc.win_right, num_threads=pc.num_threads, softcap=pc.softcap,
                    alibi=pc.alibi, sinks=pc.sinks, lse=pc.lse_rows(lse), seqs=pc.seqs)
    if out is not None:
        out[...] = result
        result = out
    elif odt != kdt:
        result = result.astype(odt)
    return (result, lse) if lse is not None else result
