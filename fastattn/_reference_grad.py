"""Plain NumPy ground truth of the attention backward pass (float64).

:func:`attention_backward` differentiates :func:`fastattn.reference.attention`
by hand, in float64, on the same semantics (see that module's docstring).
With ``P`` the weights, ``O = P V`` the output, ``dO`` the gradient flowing
into the output and ``g`` the one flowing into ``lse``:

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

import numpy as np

from . import _half

__all__ = ["attention_backward"]


def _sum_to(grad: np.ndarray, shape: tuple) -> np.ndarray:
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


def _as_grad(grad: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A gradient in its input's dtype: 16-bit and floating inputs keep
    theirs (rounded once), integer ones get float64."""
    dt = like.dtype
    return grad.astype(dt if (dt.kind == "f" or _half.is_half(dt)) else np.float64)


def attention_backward(grad_out, query, key, value, out, lse, attn_mask=None,
                       is_causal=False, scale=None, enable_gqa=False, *,
                       key_padding_mask=None, window=None, alibi_slopes=None,
                       softcap=None, sinks=None, grad_lse=None, num_threads=None):
    """Reference gradients of :func:`fastattn.reference.attention`.

    ``out`` and ``lse`` are what the forward returned for the same arguments;
    the reference recomputes both in float64 and only checks their shapes,
    so that the ground truth does not depend on the kernel under test.
    Returns ``(grad_query, grad_key, grad_value)``, plus ``grad_sinks`` when
    ``sinks`` is given, each of its input's shape and dtype.
    """
    from .reference import attention as forward

    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    o, p, lse64 = forward(q64, k64, v64, attn_mask, is_causal, scale, enable_gqa,
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
        if softcap is not None:
            raw = np.matmul(q64, np.swapaxes(kr, -1, -2)) * scale
            d_s = np.where(keep, d_s * (1.0 - np.tanh(raw / softcap) ** 2), 0.0)
        d_q = _masked_matmul(d_s, np.broadcast_to(kr, d_s.shape[:-2] + kr.shape[-2:]),
                             keep) * scale
        d_k = _masked_matmul(np.swapaxes(d_s, -1, -2),
                             np.broadcast_to(q64, d_s.shape[:-2] + q64.shape[-2:]),
                             np.swapaxes(keep, -1, -2)) * scale
    grads = [_as_grad(_sum_to(d_q, q.shape), q)]
    for d, a in ((d_k, k), (d_v, v)):
        d = _unrepeat_heads(d, kv_heads) if enable_gqa and kv_heads else d
        grads.append(_as_grad(_sum_to(d, a.shape), a))
    if sinks is not None:
        grads.append(_sink_grad(sinks, lse64, row, g))
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
    return _sum_to(d_t, t.shape).astype(dt)
