"""Plain NumPy/SciPy ground truth for every fastattn kernel.

Nothing here is fast; everything here is meant to be obviously right.  The
functions take the same arguments as :func:`fastattn.attention` and
:func:`fastattn.softmax` and are what the test suite compares against.

Semantics (shared with the kernels, written down once here):

* Query row ``i`` of a query with ``L`` rows, against ``S`` keys, sits at key
  position ``p(i) = i + S - L`` when ``is_causal="lower_right"`` and at
  ``p(i) = i`` otherwise (``is_causal`` False, True or ``"upper_left"``).
* The *logit* of query ``i`` against key ``j`` is built in this order:

  1. ``s = scale * q_i . k_j``;
  2. with ``softcap=c``: ``s = c * tanh(s / c)``;
  3. with ``alibi_slopes``: ``s = s - slope_h * |p(i) - j|`` (``h`` the head);
  4. plus the additive ``attn_mask``, if any.

  All of it in the compute dtype: float32 for float32 inputs, float64 for
  float64, integer and any 16-bit (float16, bfloat16) inputs; the result of
  16-bit inputs is rounded once to their dtype.
* Position ``(i, j)`` is *hidden* when any mask hides it: the causal mask
  (``j > p(i)``), the window (below), ``key_padding_mask`` (True = padding),
  a boolean ``attn_mask`` that is False there, an additive ``attn_mask``
  that is ``-inf`` there -- or when the logit itself is ``-inf``.  (With
  ``softcap`` a raw score of ``-inf`` becomes ``-softcap``, since
  ``tanh(-inf) = -1``: it is soft-capped like any other score, not hidden.)
* ``window=(left, right)`` keeps key ``j`` visible only when
  ``p(i) - left <= j <= p(i) + right``; an int ``w`` means ``(w, w)``, and
  ``None`` (for the whole window or for either side) means unbounded on
  that side.  Sizes are ints ``>= 0``: a bool or non-integer type is a
  TypeError, a negative or non-finite size a ValueError.
* Hidden positions get weight exactly 0 and have no influence at all on the
  output, even when that key's or value's entries are NaN or Inf.
* Without sinks, the visible positions of a row get
  ``scipy.special.softmax`` of their logits.  A NaN (or ``+inf``) logit
  makes every visible weight of its row NaN, as in SciPy.
* ``sinks`` (one logit ``t_h`` per head) joins every row's softmax
  denominator and contributes no value: with ``m = max(max_j s_j, t_h)``
  over the visible ``j``, ``w_j = exp(s_j - m) / (sum_k exp(s_k - m) +
  exp(t_h - m))``, so a row's weights sum to less than 1 (to 1 for a sink
  of ``-inf``, which is the same as no sink); NaN and ``+inf`` sinks are
  rejected.
* A row with no visible position gets all-zero weights and a zero output --
  also when there is a sink (the sink alone does not make a row live).
* ``alibi_slopes`` and ``sinks`` are real arrays broadcastable to
  ``(..., H)``, the output's batch shape, whose last axis holds the heads
  (axis -3 of ``query``); so the call needs a head axis.  Slopes must be
  finite; a wrong shape or a non-finite value is a ValueError naming the
  argument, a bool or non-real dtype a TypeError.
* ``softcap`` is a finite real ``> 0`` (a bool or non-real is a TypeError,
  anything else a ValueError).
* ``return_lse=True`` also returns the natural-log log-sum-exp of each row's
  final logits over its visible keys, the sink's ``exp`` included:
  ``lse = m + log(sum_j exp(s_j - m) + exp(t_h - m))``, shape ``(..., H, L)``
  (float32 for float16/bfloat16/float32 results, float64 for float64).  It is ``-inf`` for a row with nothing visible (sink or not) and
  NaN for a row whose weights are NaN.  The results come back as
  ``(out, lse)``, or ``(out, weights, lse)`` with ``return_weights`` too.
  The output of a row is ``sum_j exp(s_j - lse) v_j``, which is what lets
  :func:`fastattn.merge.merge_attention` combine parts over disjoint keys.
* :func:`attention_varlen` runs :func:`attention` on each sequence of a
  packed batch (flash-attn's layout), see its docstring.

The backward pass (:func:`attention_backward`, differentiated by hand in
float64) follows from these rules.  With ``P`` the weights, ``O = P V`` the
output, ``dO`` the gradient flowing into the output and ``g`` the one flowing
into ``lse``:

* ``dV = Pᵀ dO``;
* ``dP_ij = dO_i . v_j`` and ``D_i = sum_j P_ij dP_ij = dO_i . O_i``;
* ``dS_ij = P_ij (dP_ij - D_i + g_i)`` on the final logits (``d lse_i / d
  s_ij = P_ij``), exactly 0 where ``P_ij`` is 0: a hidden position never
  reaches a gradient, even when its key or value holds NaN or Inf;
* through the soft-cap ``c tanh(s / c)``: times ``1 - tanh(s / c)²``; ALiBi
  and the masks are constants;
* ``dQ = scale dS K`` and ``dK = scale dSᵀ Q``, each summed over what the
  forward broadcast (batch dimensions of length 1, the query heads that share
  a key/value head);
* a sink ``t`` with weight ``p_i = exp(t - lse_i)`` in row ``i``'s
  denominator: ``d t = sum_i p_i (g_i - D_i)`` over the rows that see keys.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special

from . import _half
from ._masks import check_window as _check_window
from ._scores import check_softcap as _check_softcap
from ._scores import per_head as _per_head
from ._varlen_checks import check_packed as _check_packed

__all__ = ["attention", "attention_backward", "attention_varlen", "softmax"]


def _compute_dtype(*arrays):
    """(compute dtype, result dtype): any 16-bit input (float16, bfloat16) is
    computed in float64 (the ground truth of the kernels' float32 arithmetic)
    and gives its own dtype if every input has it, float32 for mixed 16-bit
    dtypes or with float32, float64 with float64."""
    dts = [a.dtype for a in arrays]
    if any(_half.is_half(dt) for dt in dts):
        if all(dt == dts[0] for dt in dts):
            return np.dtype(np.float64), dts[0]
        rest = [dt for dt in dts if not _half.is_half(dt)]
        rt = np.result_type(*rest) if rest else np.dtype(np.float32)
        f16_ints = rt.kind in "biu" and not any(_half.is_bfloat16(dt) for dt in dts)
        if f16_ints and np.result_type(*dts) == np.float16:
            return np.dtype(np.float64), np.dtype(np.float16)
        wide = rt == np.float64 or rt.kind in "biu"
        return np.dtype(np.float64), np.dtype(np.float64 if wide else np.float32)
    dt = np.result_type(*arrays)
    if dt.kind in "biu":
        return np.dtype(np.float64), np.dtype(np.float64)
    if dt.kind != "f":
        raise TypeError(f"unsupported dtype {dt}")
    return dt, dt


def _lse_dtype(odt):
    """The log-sum-exp's dtype: float32 for 16-bit results."""
    return np.dtype(np.float32) if _half.is_half(odt) else odt


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None,
              enable_gqa=False, *, key_padding_mask=None, return_weights=False,
              out=None, num_threads=None, window=None, alibi_slopes=None,
              softcap=None, sinks=None, return_lse=False):
    """Reference scaled dot-product attention (see the module docstring)."""
    left, right = _check_window(window)
    cap = _check_softcap(softcap)
    q, k, v, cdt, odt = _inputs(query, key, value, enable_gqa)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else 1.0
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    slopes = _per_head("alibi_slopes", alibi_slopes, batch, cdt)
    sink = _per_head("sinks", sinks, batch, cdt, neg_inf_ok=True)
    sink = None if sink is None else sink[..., None, None]
    with np.errstate(all="ignore"):
        pos = np.arange(L)[:, None] + (S - L if is_causal == "lower_right" else 0)  # p(i)
        j = np.arange(S)[None, :]
        scores = _logits(q, k, scale, cap, slopes, pos, j, cdt)
        hidden = _hidden(batch + (L, S), pos, j, is_causal, left, right, key_padding_mask,
                         q.ndim)
        scores, hidden = _with_mask(scores, hidden, attn_mask, cdt)
        dead = hidden.all(axis=-1, keepdims=True)
        masked = np.where(hidden | dead, -np.inf, scores)
        masked = np.where(dead, 0, masked)          # keep softmax away from all -inf rows
        # m of the module docstring: the row's largest visible logit, or the sink.
        top = masked.max(axis=-1, keepdims=True) if S > 0 else np.zeros(batch + (L, 1), cdt)
        if sink is not None:
            top = np.maximum(top, sink)
        weights = _weights(masked, hidden, top, sink, S, cdt)
        # Sum over visible keys only: a hidden key never touches the output.
        vb = np.broadcast_to(v, batch + (S, v.shape[-1]))
        contrib = np.where(hidden[..., None], 0, weights[..., None] * vb[..., None, :, :])
        output = contrib.sum(axis=-2).astype(odt)
        lse = _lse(masked, top, sink, dead, odt) if return_lse else None
    if out is not None:
        out[...] = output
        output = out
    result = (output,)
    if return_weights:
        result += (weights.astype(odt),)
    if return_lse:
        result += (lse,)
    return result if len(result) > 1 else output


def _inputs(query, key, value, enable_gqa):
    """q, k, v in the compute dtype (grouped-query heads repeated), and the
    (compute dtype, result dtype)."""
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    cdt, odt = _compute_dtype(q, k, v)
    q, k, v = q.astype(cdt), k.astype(cdt), v.astype(cdt)
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, rep, axis=-3)
        v = np.repeat(v, rep, axis=-3)
    return q, k, v, cdt, odt


def _logits(q, k, scale, cap, slopes, pos, j, cdt):
    """The scaled scores, soft-capped, minus the ALiBi bias."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * cdt.type(scale)
    if cap is not None:
        scores = cdt.type(cap) * np.tanh(scores / cdt.type(cap))
    if slopes is not None:
        scores = scores - slopes[..., None, None] * np.abs(pos - j).astype(cdt)
    return scores


def _hidden(shape, pos, j, is_causal, left, right, key_padding_mask, query_ndim):
    """The positions of ``shape`` (batch + (L, S)) that the causal mask, the
    window and the key padding hide."""
    hidden = np.zeros(shape, dtype=bool)
    if is_causal:
        hidden |= j > pos
    if left is not None:
        hidden |= j < pos - left
    if right is not None:
        hidden |= j > pos + right
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask, dtype=bool)
        if kpm.ndim == 2:  # (N, S): N is the first dimension of query
            kpm = kpm.reshape((kpm.shape[0],) + (1,) * (query_ndim - 3) + (1, shape[-1]))
        hidden |= kpm
    return hidden


def _with_mask(scores, hidden, attn_mask, cdt):
    """``attn_mask`` applied (bool: hides; float: added, -inf hides), and the
    positions whose score is -inf hidden: (scores, hidden), of one shape
    (``hidden`` is updated in place)."""
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == bool:
            hidden |= ~m
        else:
            m = m.astype(cdt)
            hidden |= m == -np.inf
            scores = scores + m
    scores = np.broadcast_to(scores, hidden.shape)
    return scores, hidden | (scores == -np.inf)


def _weights(masked, hidden, top, sink, S, cdt):
    """The softmax of each row over its visible logits (and the sink)."""
    if sink is None:
        weights = scipy.special.softmax(masked, axis=-1) if S > 0 else masked
    else:
        # scipy's softmax with one more term, the sink's, in the denominator.
        e = np.exp(masked - top)
        weights = e / (e.sum(axis=-1, keepdims=True) + np.exp(sink - top))
    return np.where(hidden, 0, weights).astype(cdt)


def _lse(masked, top, sink, dead, odt):
    """Each row's log-sum-exp (the sink's term included); -inf for a dead row."""
    total = np.exp(masked - top).sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - top)
    return np.where(dead, -np.inf, top + np.log(total))[..., 0].astype(_lse_dtype(odt))


def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, *, is_causal=False,
                     scale=None, window=None, alibi_slopes=None, softcap=None, sinks=None,
                     return_lse=False):
    """Reference attention over packed sequences of different lengths.

    flash-attn's varlen layout: sequence ``b`` owns query rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key/value rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``, and its queries attend to its
    keys only, exactly as one :func:`attention` call on that sequence (with
    ``p(i)``, the causal mask, the window and ALiBi counted within the
    sequence).

    Parameters
    ----------
    query : array_like, shape (total_q, H, D)
    key : array_like, shape (total_k, H_kv, D)
    value : array_like, shape (total_k, H_kv, Dv)
        ``H`` a multiple of ``H_kv`` (grouped-query attention: query head
        ``h`` uses key/value head ``h // (H // H_kv)``).
    cu_seqlens_q, cu_seqlens_k : array_like of int32 or int64, shape (n + 1,)
        Non-decreasing, starting at 0 and ending at ``total_q`` and
        ``total_k``; both describe the same ``n`` sequences.  Empty
        sequences are allowed (a query with no key gives zeros, lse -inf).
    is_causal, scale, window, softcap, return_lse
        As in :func:`attention`, applied to each sequence.
    alibi_slopes, sinks : array_like, optional
        Broadcastable to ``(n, H)``: one value per head, or per sequence and
        head.

    Returns
    -------
    output : ndarray, shape (total_q, H, Dv)
    lse : ndarray, shape (H, total_q)
        Only with ``return_lse=True``; heads first, as flash-attn's varlen
        functions return it.

    Raises
    ------
    ValueError
        On shapes that do not fit the layout, or bad ``cu_seqlens_*`` (not
        int32/int64, not 1-D, wrong ends, decreasing, or of different
        lengths), naming the array.
    """
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    H, _, cq, ck = _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k)
    n = cq.size - 1
    slopes = _per_head("alibi_slopes", alibi_slopes, (n, H), np.float64)
    sink = _per_head("sinks", sinks, (n, H), np.float64, neg_inf_ok=True)
    cdt, odt = _compute_dtype(q, k, v)
    output = np.zeros((q.shape[0], H, v.shape[2]), dtype=odt)
    lse = np.full((H, q.shape[0]), -np.inf, dtype=_lse_dtype(odt))
    for b in range(n):
        rows = slice(cq[b], cq[b + 1])
        keys = slice(ck[b], ck[b + 1])
        if rows.start == rows.stop:
            continue
        o, s = attention(np.swapaxes(q[rows], 0, 1), np.swapaxes(k[keys], 0, 1),
                         np.swapaxes(v[keys], 0, 1), is_causal=is_causal, scale=scale,
                         enable_gqa=True, window=window, softcap=softcap,
                         alibi_slopes=None if slopes is None else slopes[b],
                         sinks=None if sink is None else sink[b], return_lse=True)
        output[rows] = np.swapaxes(o, 0, 1)
        lse[:, rows] = s
    return (output, lse) if return_lse else output


def softmax(x, axis=None, *, mask=None, out=None):
    """Reference softmax: ``scipy.special.softmax`` with an optional keep-mask."""
    x = np.asarray(x)
    if _half.is_half(x.dtype):  # computed in float64, rounded once
        return softmax(x.astype(np.float64), axis, mask=mask, out=out).astype(x.dtype)
    if x.dtype.kind in "biu":
        x = x.astype(np.float64)
    if mask is None:
        result = scipy.special.softmax(x, axis=axis)
    else:
        keep = np.broadcast_to(np.asarray(mask, dtype=bool), x.shape)
        with np.errstate(all="ignore"):
            xm = np.where(keep, x, -np.inf)
            mx = np.max(xm, axis=axis, keepdims=True)
            dead = ~np.any(keep, axis=axis, keepdims=True)
            e = np.where(keep, np.exp(xm - np.where(dead, 0, mx)), 0)
            s = np.sum(e, axis=axis, keepdims=True)
            result = np.where(keep & ~dead, e / np.where(dead, 1, s), 0).astype(x.dtype)
    if out is not None:
        out[...] = result
        return out
    return result


def _grad_sum_to(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """``grad`` summed over the leading and length-1 axes NumPy broadcast
    to reach ``grad.shape`` from ``shape`` (autograd's rule)."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead else grad
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _unrepeat_heads(grad: np.ndarray, kv_heads: int) -> np.ndarray:
    """Sum the query heads that shared one key/value head (grouped-query
    attention repeats key/value head ``h`` for query heads ``h * rep ..
    h * rep + rep - 1``)."""
    heads = grad.shape[-3]
    if grad.ndim < 3 or heads == kv_heads:
        return grad
    rep = heads // kv_heads
    shape = grad.shape[:-3] + (kv_heads, rep) + grad.shape[-2:]
    return grad.reshape(shape).sum(axis=-3)


def _masked_matmul(w: np.ndarray, x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``sum_j w_ij x_j`` over the positions ``keep`` only, so that a NaN or
    Inf row of ``x`` at a position that is not kept never reaches the sum."""
    terms = np.where(keep[..., None], w[..., None] * x[..., None, :, :], 0.0)
    return terms.sum(axis=-2)


def _grad_as(grad: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A gradient in its input's dtype: 16-bit and floating inputs keep
    theirs (rounded once), integer ones get float64."""
    dt = like.dtype
    return grad.astype(dt if (dt.kind == "f" or _half.is_half(dt)) else np.float64)


def attention_backward(grad_out, query, key, value, out, lse, attn_mask=None,
                       is_causal=False, scale=None, enable_gqa=False, *,
                       key_padding_mask=None, window=None, alibi_slopes=None,
                       softcap=None, sinks=None, grad_lse=None, num_threads=None,
                       return_mask_grad=False):
    """Reference gradients of :func:`fastattn.reference.attention`.

    ``out`` and ``lse`` are what the forward returned for the same arguments;
    the reference recomputes both in float64 and only checks their shapes,
    so that the ground truth does not depend on the kernel under test.
    Returns ``(grad_query, grad_key, grad_value)``, plus ``grad_sinks`` when
    ``sinks`` is given, plus with ``return_mask_grad`` that of the float
    ``attn_mask`` (the logits' gradient, summed to the mask's shape), each of
    its input's shape and dtype.
    """
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    o, p, lse64 = attention(q64, k64, v64, attn_mask, is_causal, scale, enable_gqa,
                          key_padding_mask=key_padding_mask, window=window,
                          alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks,
                          return_weights=True, return_lse=True)
    for name, given, want in (("out", out, o.shape), ("lse", lse, lse64.shape)):
        if np.shape(given) != want:
            raise ValueError(f"{name} must have shape {want} (the forward's), got "
                             f"{np.shape(given)}")
    d_o = np.broadcast_to(np.asarray(grad_out, dtype=np.float64), o.shape)
    g = np.zeros(lse64.shape) if grad_lse is None else \
        np.broadcast_to(np.asarray(grad_lse, dtype=np.float64), lse64.shape)
    kv_heads = k.shape[-3] if k.ndim >= 3 else None
    kr, vr = k64, v64
    if enable_gqa and q.ndim >= 3 and kv_heads != q.shape[-3]:
        rep = q.shape[-3] // kv_heads
        kr, vr = np.repeat(k64, rep, axis=-3), np.repeat(v64, rep, axis=-3)
    keep = p != 0
    with np.errstate(all="ignore"):
        d_v = _masked_matmul(np.swapaxes(p, -1, -2), d_o, np.swapaxes(keep, -1, -2))
        d_p = np.matmul(d_o, np.swapaxes(vr, -1, -2))
        row = np.sum(d_o * o, axis=-1)                       # D_i
        d_s = np.where(keep, p * (d_p - row[..., None] + g[..., None]), 0.0)
        d_logits = d_s
        if softcap is not None:
            raw = np.matmul(q64, np.swapaxes(kr, -1, -2)) * scale
            d_s = np.where(keep, d_s * (1.0 - np.tanh(raw / softcap) ** 2), 0.0)
        d_q = _masked_matmul(d_s, np.broadcast_to(kr, d_s.shape[:-2] + kr.shape[-2:]),
                             keep) * scale
        d_k = _masked_matmul(np.swapaxes(d_s, -1, -2),
                             np.broadcast_to(q64, d_s.shape[:-2] + q64.shape[-2:]),
                             np.swapaxes(keep, -1, -2)) * scale
    grads = [_grad_as(_grad_sum_to(d_q, q.shape), q)]
    for d, a in ((d_k, k), (d_v, v)):
        d = _unrepeat_heads(d, kv_heads) if enable_gqa and kv_heads else d
        grads.append(_grad_as(_grad_sum_to(d, a.shape), a))
    if sinks is not None:
        grads.append(_sink_grad(sinks, lse64, row, g))
    if return_mask_grad:
        m = np.asarray(attn_mask)
        if attn_mask is None or m.dtype == np.bool_:
            raise ValueError("return_mask_grad needs a floating-point attn_mask")
        grads.append(_grad_as(_grad_sum_to(d_logits, m.shape), m))
    return tuple(grads)


def _sink_grad(sinks, lse64: np.ndarray, row: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``d t_h = sum_i p_i (g_i - D_i)``, ``p_i = exp(t_h - lse_i)``, over the
    rows that see keys (``lse`` finite), summed to the shape of ``sinks``."""
    t = np.asarray(sinks)
    t64 = np.broadcast_to(t.astype(np.float64), lse64.shape[:-1])[..., None]
    live = np.isfinite(lse64)
    with np.errstate(all="ignore"):
        p_sink = np.where(live, np.exp(t64 - np.where(live, lse64, 0.0)), 0.0)
        d_t = np.where(live, p_sink * (g - row), 0.0).sum(axis=-1)
    dt = t.dtype if t.dtype.kind == "f" else np.dtype(np.float64)
    return _grad_sum_to(d_t, t.shape).astype(dt)
