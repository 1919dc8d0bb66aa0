"""Shared by the fuzz suites (test_fuzz_attention.py, test_fuzz_softmax.py):
memory layouts, random values of every magnitude, and the softmax interval
whose derivation test_fuzz_attention.py's docstring gives."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from conftest import relayout


F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


EPS64 = float(np.finfo(np.float64).eps)


LAYOUTS = ("C", "C", "F", "T", "step2", "neg_rows", "neg_feat", "neg_all")


SPECIALS = np.array([np.nan, np.inf, -np.inf])


# ---------------------------------------------------------------------------
# layouts: the same values behind different strides
# ---------------------------------------------------------------------------

def layout(a, kind):
    """``a``'s values with the memory layout ``kind`` (a view, never a copy of junk)."""
    a = np.asarray(a)
    if a.ndim == 0 or kind == "C":
        return np.ascontiguousarray(a)
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "T":        # leading axis last in memory (a transposed view)
        return relayout(a, "permuted")
    if kind == "step2":    # every other element of a buffer whose others are junk (NaN)
        return relayout(a, "sliced")
    if kind == "neg_all":
        return relayout(a, "negative")
    if kind == "neg_rows":  # [::-1] on the row axis
        ax = max(a.ndim - 2, 0)
    else:                   # neg_feat: [::-1] on the feature axis
        ax = a.ndim - 1
    sl = (slice(None),) * ax + (slice(None, None, -1),)
    r = np.ascontiguousarray(a[sl])[sl]
    assert r.strides[ax] < 0 or a.shape[ax] <= 1
    return r


def _log_excl_sum(x, keep):
    """log Σ_{k≠j, keep} exp(x_k) for every j along the last axis (no cancellation)."""
    with np.errstate(all="ignore"):
        mx = np.max(np.where(keep, x, -np.inf), axis=-1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        e = np.where(keep, np.exp(x - mx), 0.0)
        pre = np.concatenate([np.zeros_like(e[..., :1]), np.cumsum(e, axis=-1)[..., :-1]],
                             axis=-1)
        suf = np.concatenate([np.cumsum(e[..., ::-1], axis=-1)[..., ::-1][..., 1:],
                              np.zeros_like(e[..., :1])], axis=-1)
        return np.log(pre + suf) + mx


def softmax_interval(s, delta, vis):
    """(w_lo, w_hi): the softmax of any scores within ``s ± delta`` (visible only)."""
    with np.errstate(all="ignore"):
        lo = np.where(vis, s - delta, -np.inf)
        hi = np.where(vis, s + delta, -np.inf)
        # w = 1 / (1 + exp(rest - own)): no cancellation near w = 1
        log_hi = -np.log1p(np.exp(_log_excl_sum(lo, vis) - hi))
        log_lo = -np.log1p(np.exp(_log_excl_sum(hi, vis) - lo))
        w_hi = np.where(vis, np.exp(log_hi), 0.0)
        w_lo = np.where(vis, np.exp(log_lo), 0.0)
    w_hi = np.where(np.isnan(w_hi), 1.0, w_hi)
    w_lo = np.where(np.isnan(w_lo), 0.0, w_lo)
    return w_lo, w_hi


def _eps(cdt):
    return float(np.finfo(cdt).eps)


def _values(draw, rng, shape, dtype):
    mag = draw(st.sampled_from([1.0, 1.0, 1.0, 1e-2, 10.0, 100.0, 1e4, "wide"]))
    if mag == "wide":  # every magnitude from 1e-3 to 1e4 in one array
        x = rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(-3, 4, shape)
    else:
        x = rng.standard_normal(shape) * mag
    return x.astype(dtype).astype(np.float64)  # representable in dtype
