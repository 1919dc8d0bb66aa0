"""attention_varlen_backward(): the gradients of
:func:`fastattn.attention_varlen`.

Each sequence is one :func:`fastattn.attention_backward` call on zero-copy
views of the packed arrays (heads moved first by a stride swap), its
gradients written into the matching rows of the packed ones: a sequence's
work is its own ``L x S``.  A key row belongs to one sequence, so nothing is
summed across sequences but the sinks' gradient (per sequence and head,
then summed to the shape of ``sinks``, in sequence order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

import numpy as np

from ._half import arith, is_half
from ._scores import per_head
from ._validate import forward_array, kernel_dtypes
from ._varlen_checks import check_packed
from .backward import attention_backward

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Window: TypeAlias = SupportsIndex | tuple[SupportsIndex | None, SupportsIndex | None] | None

__all__ = ["attention_varlen_backward"]


def _heads_first(a: np.ndarray) -> np.ndarray:
    """(rows, H, C) viewed as (H, rows, C), never a copy."""
    return np.moveaxis(a, 1, 0)


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
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    H, H_kv, cq, ck = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k)
    kdt, odt = kernel_dtypes((("query", q.dtype), ("key", k.dtype), ("value", v.dtype)))
    cdt = arith(kdt)
    n = cq.size - 1
    slopes = per_head("alibi_slopes", alibi_slopes, (n, H), cdt)
    sink = per_head("sinks", sinks, (n, H), cdt, neg_inf_ok=True)
    d_o = forward_array("grad_out", grad_out, (q.shape[0], H, v.shape[2]), odt)
    o = forward_array("out", out, d_o.shape, odt)
    lse_a = forward_array("lse", lse, (H, q.shape[0]), cdt)
    g_lse = None if grad_lse is None else np.asarray(grad_lse)
    if g_lse is not None and g_lse.shape != lse_a.shape:
        raise ValueError(f"grad_lse must have lse's shape {lse_a.shape}, got {g_lse.shape}")
    grads = [np.zeros(x.shape, x.dtype if x.dtype.kind == "f" or is_half(x.dtype)
                      else np.float64) for x in (q, k, v)]
    d_sink = np.zeros((n, H)) if sink is not None else None
    # heads first once (stride swaps): a sequence's operands are then plain
    # slices of these views
    d_oh, qh, kh, vh, oh = (_heads_first(x) for x in (d_o, q, k, v, o))
    gh = [_heads_first(g) for g in grads]
    cql, ckl = cq.tolist(), ck.tolist()
    for b in range(n):
        r0, r1, k0, k1 = cql[b], cql[b + 1], ckl[b], ckl[b + 1]
        if r1 == r0:
            continue
        r = attention_backward(
            d_oh[:, r0:r1], qh[:, r0:r1], kh[:, k0:k1], vh[:, k0:k1], oh[:, r0:r1],
            lse_a[:, r0:r1], None, is_causal, scale, H != H_kv, window=window, softcap=softcap,
            alibi_slopes=None if slopes is None else slopes[b],
            sinks=None if sink is None else sink[b],
            grad_lse=None if g_lse is None else g_lse[:, r0:r1], num_threads=num_threads)
        gh[0][:, r0:r1] = r[0]
        gh[1][:, k0:k1] = r[1]
        gh[2][:, k0:k1] = r[2]
        if d_sink is not None:
            d_sink[b] = r[3]
    if d_sink is None:
        return tuple(grads)
    s = np.asarray(sinks)
    lead = d_sink.ndim - s.ndim
    total = d_sink.sum(axis=tuple(range(lead))) if lead else d_sink
    axes = tuple(i for i, m in enumerate(s.shape) if m == 1 and total.shape[i] != 1)
    total = total.sum(axis=axes, keepdims=True) if axes else total
    return tuple(grads) + (total.astype(s.dtype if s.dtype.kind == "f" else np.float64),)
