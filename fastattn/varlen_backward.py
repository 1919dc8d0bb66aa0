"""attention_varlen_backward(): the gradients of
:func:`fastattn.attention_varlen`.

Each sequence is the problem of :func:`fastattn.attention_backward` on
zero-copy views of the packed arrays (heads moved first by a stride swap),
its gradients written into the matching rows of the packed ones: a
sequence's work is its own ``L x S``.  One C call runs them all, as the
forward does (``src_c/driver/varlen.c``); each sequence's gradients are
bitwise those of its own call.  A key row belongs to one sequence, so
nothing is summed across sequences but the sinks' gradient (per sequence
and head, then summed to the shape of ``sinks``, in sequence order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

import numpy as np

from . import _core
from ._api import kernel_operand
from ._grads import (check_lse, drop_features, grad_as, grad_lse_operand,
                     no_empty_features, sinks_grad)
from ._half import arith, is_half
from ._validate import as_array, forward_array, kernel_dtypes
from ._varlen_call import packed_call
from ._varlen_checks import check_packed

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Window: TypeAlias = SupportsIndex | tuple[SupportsIndex | None, SupportsIndex | None] | None

__all__ = ["attention_varlen_backward"]


def attention_varlen_backward(grad_out: ArrayLike, query: ArrayLike, key: ArrayLike,
                              value: ArrayLike, out: ArrayLike, lse: ArrayLike,
                              cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                              is_causal: _Causal = False, scale: SupportsFloat | None = None,
                              window: _Window = None, alibi_slopes: ArrayLike | None = None,
                              softcap: SupportsFloat | None = None,
                              sinks: ArrayLike | None = None, grad_lse: ArrayLike | None = None,
                              num_threads: SupportsIndex | None = None
                              ) -> tuple[_Float, ...]:
    """Gradients of :func:`fastattn.attention_varlen` (packed sequences).

    Parameters
    ----------
    grad_out : array_like, shape (total_q, H, Dv)
        The gradient flowing into the output (the output's dtype).
    query, key, value, cu_seqlens_q, cu_seqlens_k
        As given to :func:`fastattn.attention_varlen`.
    out : array_like, shape (total_q, H, Dv)
        The forward's output.
    lse : array_like, shape (H, total_q)
        The forward's ``return_lse=True`` result (heads first).
    is_causal, scale, window, alibi_slopes, softcap, sinks, num_threads
        As given to :func:`fastattn.attention_varlen`.
    grad_lse : array_like, shape (H, total_q), optional
        The gradient flowing into ``lse``; None means zero.

    Returns
    -------
    grad_query, grad_key, grad_value : ndarray
        Each of its input's shape and dtype.
    grad_sinks : ndarray
        Only when ``sinks`` is given: the shape of ``sinks``.

    Raises
    ------
    ValueError
        As :func:`fastattn.attention_varlen` and
        :func:`fastattn.attention_backward`.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.random.default_rng(0).standard_normal((5, 2, 4))
    >>> cu = np.array([0, 2, 5], dtype=np.int32)
    >>> out, lse = fastattn.attention_varlen(x, x, x, cu, cu, is_causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.attention_varlen_backward(np.ones_like(out), x, x, x, out, lse,
    ...                                                 cu, cu, is_causal=True)
    >>> dq.shape, bool(np.allclose(dv.sum(axis=0), 5.0))
    ((5, 2, 4), True)
    """
    q, k, v = (as_array(x, n) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    H, H_kv, cq, ck = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k)
    kdt, odt = kernel_dtypes((("query", q.dtype), ("key", k.dtype), ("value", v.dtype)))
    adt = arith(kdt)
    pc = packed_call(H, H_kv, q.shape[2], cq, ck, kdt, adt, is_causal, scale, window,
                     alibi_slopes, softcap, sinks, num_threads)
    T = q.shape[0]
    d_o = forward_array("grad_out", grad_out, (T, H, v.shape[2]), odt)
    o = forward_array("out", out, d_o.shape, odt)
    lse_a = forward_array("lse", lse, (H, T), adt)
    check_lse(lse_a)
    g_lse = None if grad_lse is None else grad_lse_operand(grad_lse, lse_a.shape, adt)
    qk, kk, vk, ok, dok = no_empty_features(tuple(kernel_operand(x, kdt)
                                                  for x in (q, k, v, o, d_o)), T, k.shape[0])
    # The kernel's gradients: in the inputs' 16-bit dtype where it rounds
    # them itself, else in the arithmetic's, rounded here (backward.py's
    # rule).  Grouped key heads: the kernel sums each key head's dK, dV over
    # its query heads into these, broadcast over them.
    gdt = kdt if is_half(kdt) and _core.backward_rounds(qk) else adt
    dq, dk, dv = (np.zeros(x.shape, gdt) for x in (qk, kk, vk))
    d_sink = None if pc.sinks is None else np.zeros((cq.size - 1, H))
    if H == 0:  # no query heads: zero gradients
        return _with_sinks(tuple(grad_as(d, x) for d, x in ((dq, q), (dk, k), (dv, v))),
                           d_sink, sinks)
    _core.attention_backward(
        pc.rows(qk), pc.keys(kk), pc.keys(vk), pc.rows(ok), pc.lse_rows(lse_a), pc.rows(dok),
        pc.rows(dq), pc.keys(dk), pc.keys(dv), batch=pc.batch, scale=pc.scale,
        causal=pc.causal, win_left=pc.win_left, win_right=pc.win_right,
        num_threads=pc.num_threads, softcap=pc.softcap, alibi=pc.alibi, sinks=pc.sinks,
        glse=pc.lse_rows(g_lse), dsinks=None if d_sink is None else pc.per_sequence(d_sink),
        seqs=pc.seqs)
    grads = tuple(grad_as(drop_features(d, x), x) for d, x in ((dq, q), (dk, k), (dv, v)))
    return _with_sinks(grads, d_sink, sinks)


def _with_sinks(grads: tuple, d_sink, sinks) -> tuple:
    return grads if d_sink is None else grads + (sinks_grad(d_sink, sinks),)
