"""Plain NumPy/SciPy ground truth for every fastattn kernel.

Nothing here is fast; everything here is meant to be obviously right.  The
functions take the same arguments as :func:`fastattn.attention` and
:func:`fastattn.softmax` and are what the test suite compares against.

Semantics (shared with the kernels, written down once here):

* The score of query ``i`` against key ``j`` is ``scale * q_i . k_j`` plus
  the additive mask, if any.
* Position ``(i, j)`` is *hidden* when any mask hides it: the causal mask,
  ``key_padding_mask`` (True = padding), a boolean ``attn_mask`` that is
  False there, an additive ``attn_mask`` that is ``-inf`` there -- or when
  the score itself is ``-inf``.
* Hidden positions get weight exactly 0 and have no influence at all on the
  output, even when that key's or value's entries are NaN or Inf.
* The visible positions of a row get ``scipy.special.softmax`` of their
  scores.  A NaN (or ``+inf``) score makes every visible weight of its row
  NaN, as in SciPy.
* A row with no visible position gets all-zero weights and a zero output.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special

__all__ = ["attention", "softmax"]


def _compute_dtype(*arrays):
    dt = np.result_type(*arrays)
    if dt.kind in "biu":
        return np.dtype(np.float64), np.dtype(np.float64)
    if dt.kind != "f":
        raise TypeError(f"unsupported dtype {dt}")
    if dt == np.float16:
        return np.dtype(np.float32), np.dtype(np.float16)
    return dt, dt


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None,
              enable_gqa=False, *, key_padding_mask=None, return_weights=False,
              out=None, num_threads=None):
    """Reference scaled dot-product attention (see the module docstring)."""
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    cdt, odt = _compute_dtype(q, k, v)
    q, k, v = q.astype(cdt), k.astype(cdt), v.astype(cdt)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, rep, axis=-3)
        v = np.repeat(v, rep, axis=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else 1.0
    with np.errstate(all="ignore"):
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * cdt.type(scale)
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        hidden = np.zeros(batch + (L, S), dtype=bool)
        if is_causal:
            offset = S - L if is_causal == "lower_right" else 0
            i = np.arange(L)[:, None]
            j = np.arange(S)[None, :]
            hidden |= j > i + offset
        if attn_mask is not None:
            m = np.asarray(attn_mask)
            if m.dtype == bool:
                hidden |= ~m
            else:
                m = m.astype(cdt)
                hidden |= m == -np.inf
                scores = scores + m
        if key_padding_mask is not None:
            kpm = np.asarray(key_padding_mask, dtype=bool)
            if kpm.ndim == 2:  # (N, S): N is the first dimension of query
                kpm = kpm.reshape((kpm.shape[0],) + (1,) * (q.ndim - 3) + (1, S))
            hidden |= kpm
        scores = np.broadcast_to(scores, hidden.shape)
        hidden = hidden | (scores == -np.inf)
        dead = hidden.all(axis=-1, keepdims=True)
        masked = np.where(hidden | dead, -np.inf, scores)
        masked = np.where(dead, 0, masked)          # keep softmax away from all -inf rows
        weights = scipy.special.softmax(masked, axis=-1) if S > 0 else masked
        weights = np.where(hidden, 0, weights).astype(cdt)
        # Sum over visible keys only: a hidden key never touches the output.
        vb = np.broadcast_to(v, batch + (S, v.shape[-1]))
        contrib = np.where(hidden[..., None], 0, weights[..., None] * vb[..., None, :, :])
        output = contrib.sum(axis=-2).astype(odt)
    if out is not None:
        out[...] = output
        output = out
    if return_weights:
        return output, weights.astype(odt)
    return output


def softmax(x, axis=None, *, mask=None, out=None):
    """Reference softmax: ``scipy.special.softmax`` with an optional keep-mask."""
    x = np.asarray(x)
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
