"""Fuzz suite: fastattn.softmax against scipy.special.softmax and
fastattn.reference.softmax.

Hypothesis (the conftest's fixed derandomized profile) draws shapes, axes
(None, int, tuple), dtypes, strides, magnitudes up to 1e4, NaN/Inf entries and
broadcast masks.  Without a mask the truth is scipy.special.softmax on float64
copies, with one fastattn.reference.softmax.  The bound is the interval
argument of test_fuzz_attention.py with ``Δ_j = (eps_c + eps_64) |x_j - max x|``
(the input is exact), computed by fuzz_common.softmax_interval.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from conftest import empty_with_layout, examples
from fuzz_common import EPS64, F16, F32, F64, LAYOUTS, SPECIALS, _eps, _values, layout, softmax_interval


@st.composite
def softmax_cases(draw):
    dtype = draw(st.sampled_from([F32, F32, F64, F64, F16]))
    ndim = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    if draw(st.booleans()):
        shape[draw(st.integers(0, ndim - 1))] = draw(st.integers(6, 150))
    shape = tuple(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-ndim, ndim - 1))
    else:
        axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        axis = tuple(a - ndim if draw(st.booleans()) else a for a in axes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = _values(draw, rng, shape, dtype) + draw(st.sampled_from([0.0, 0.0, 50.0, -1e4]))
    x = x.astype(dtype).astype(np.float64)
    p = draw(st.sampled_from([0.0, 0.0, 0.02, 0.2, 0.9]))
    pick = rng.random(shape) < p
    x[pick] = SPECIALS[rng.integers(0, 3, int(pick.sum()))]
    mask = None
    if draw(st.booleans()):
        mshape = tuple(n if draw(st.booleans()) else 1 for n in shape)
        mshape = mshape[draw(st.integers(0, ndim)):]
        mask = rng.random(mshape) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    return dict(x=x, dtype=dtype, axis=axis, mask=mask,
                layout=draw(st.sampled_from(LAYOUTS)),
                out_layout=draw(st.sampled_from([None, None, "C", "sliced", "negative", "F"])))


def _rows(a, axis):
    """a with the softmax axes moved last and flattened: (rows, n)."""
    axes = tuple(range(a.ndim)) if axis is None else tuple(
        ax % a.ndim for ax in (axis if isinstance(axis, tuple) else (axis,)))
    t = np.moveaxis(a, axes, tuple(range(a.ndim - len(axes), a.ndim)))
    n = math.prod(t.shape[t.ndim - len(axes):])
    return t.reshape(-1, n)


@settings(max_examples=examples(150))
@given(case=softmax_cases())
def test_fuzz_softmax_vs_scipy_and_reference(isa, case):
    x64, dtype, axis, mask = case["x"], case["dtype"], case["axis"], case["mask"]
    cdt = F32 if dtype == F16 else dtype
    x = layout(x64.astype(dtype), case["layout"])
    out = None
    if case["out_layout"] is not None:
        out, _ = empty_with_layout(x.shape, dtype, case["out_layout"], -7.0)
    got = fastattn.softmax(x, axis=axis, mask=mask, out=out)
    if out is not None:
        assert got is out
    assert got.dtype == dtype and got.shape == x.shape
    with np.errstate(all="ignore"):
        if mask is None:
            want = scipy.special.softmax(x64, axis=axis)
            keep = np.ones(x.shape, bool)
        else:
            want = reference.softmax(x64, axis=axis, mask=mask)
            keep = np.broadcast_to(mask, x.shape)
    g, w, kp, xr = (_rows(np.asarray(a, np.float64) if a.dtype != bool else a, axis)
                    for a in (got, want, keep, x64))
    assert np.array_equal(np.isnan(g), np.isnan(w)), "NaN pattern differs from the reference"
    assert np.all(g[~kp] == 0), "a masked entry is not exactly 0"
    # a slice is "finite" when no kept entry is NaN or +inf and one kept entry is > -inf
    fin = (np.all(~kp | np.isfinite(xr) | (xr == -np.inf), axis=-1)
           & np.any(kp & (xr > -np.inf), axis=-1))
    vis = kp & (xr > -np.inf) & fin[:, None]
    with np.errstate(all="ignore"):
        mx = np.max(np.where(vis, xr, -np.inf), axis=-1, keepdims=True)
        # shift-invariant: work with x - max (what the kernel exponentiates)
        x0 = np.where(vis, xr - np.where(np.isfinite(mx), mx, 0.0), 0.0)
        delta = (_eps(cdt) + EPS64) * np.abs(x0)
    lo, hi = softmax_interval(x0, delta, vis)
    n = vis.sum(axis=-1, keepdims=True)
    eps_out = _eps(dtype) if dtype == F16 else 0.0
    rho = (n + 16) * (_eps(cdt) + EPS64) + eps_out
    tau = 4 * float(np.finfo(cdt).tiny) + (2.0 ** -24 if dtype == F16 else 0.0)
    hi = np.minimum(hi * (1 + rho), 1.0) + tau
    lo = np.maximum(lo * (1 - rho) - tau, 0.0)
    inside = (g >= lo) & (g <= hi)
    assert np.all(inside[vis]), (
        f"softmax outside its bound: {g[vis & ~inside][:5]} "
        f"in [{lo[vis & ~inside][:5]}, {hi[vis & ~inside][:5]}], reference {w[vis & ~inside][:5]}")
    # kept -inf entries of a finite slice are exactly 0
    assert np.all(g[fin[:, None] & kp & (xr == -np.inf)] == 0)
    # slices with no finite kept entry and no NaN: all 0 (masked) as the reference
    assert np.all(g[~fin[:, None] & ~np.isnan(w)] == w[~fin[:, None] & ~np.isnan(w)])
