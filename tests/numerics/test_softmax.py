"""fastattn.softmax: a drop-in for scipy.special.softmax, plus a keep-mask."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from conftest import FLOAT_DTYPES, LAYOUTS, assert_close, empty_with_layout, examples, relayout


def _scipy64(x, axis):
    """scipy's softmax on a float64 copy: accurate values, scipy's NaN rules."""
    with np.errstate(all="ignore"):
        return scipy.special.softmax(np.asarray(x, dtype=np.float64), axis=axis)


def _check_vs_scipy(x, axis, **kwargs):
    got = fastattn.softmax(x, axis=axis, **kwargs)
    with np.errstate(all="ignore"):
        sp = scipy.special.softmax(x, axis=axis)
    assert isinstance(got, np.ndarray)
    assert got.dtype == sp.dtype, (got.dtype, sp.dtype)
    assert got.shape == x.shape
    assert_close(got, _scipy64(x, axis), got.dtype)
    return got


@st.composite
def softmax_cases(draw, special=True):
    ndim = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(ndim)]
    if draw(st.booleans()):
        # one long axis: crosses SIMD widths and unrolled loops
        shape[draw(st.integers(0, ndim - 1))] = draw(st.integers(7, 70))
    shape = tuple(shape)
    axis_kind = draw(st.sampled_from(["none", "int", "neg", "tuple"]))
    if axis_kind == "none":
        axis = None
    elif axis_kind == "int":
        axis = draw(st.integers(0, ndim - 1))
    elif axis_kind == "neg":
        axis = draw(st.integers(-ndim, -1))
    else:
        axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        axis = tuple(a - ndim if draw(st.booleans()) else a for a in axes)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mag = draw(st.sampled_from([1.0, 10.0, 100.0, 1e-3]))
    x = rng.standard_normal(shape) * mag + draw(st.sampled_from([0.0, 50.0, -1000.0]))
    if special and draw(st.booleans()):
        p = draw(st.sampled_from([0.05, 0.3, 0.9]))
        specials = np.array([np.inf, -np.inf, np.nan, -np.inf])
        pick = rng.random(shape) < p
        x[pick] = specials[rng.integers(0, 4, pick.sum())]
    layout = draw(st.sampled_from(LAYOUTS))
    return x, axis, layout


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@settings(max_examples=examples(200))
@given(case=softmax_cases())
def test_softmax_matches_scipy_random(isa, dtype, case):
    x, axis, layout = case
    x = relayout(x.astype(dtype), layout)
    _check_vs_scipy(x, axis)


@settings(max_examples=examples(50))
@given(case=softmax_cases(special=False))
def test_softmax_matches_scipy_random_float16(isa, case):
    x, axis, layout = case
    x = relayout(np.clip(x, -6e4, 6e4).astype(np.float16), layout)
    got = fastattn.softmax(x, axis=axis)
    assert got.dtype == np.float16
    assert_close(got, _scipy64(x, axis), np.float16)


@st.composite
def masked_cases(draw):
    x, axis, layout = draw(softmax_cases())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dims = [n if draw(st.booleans()) else 1 for n in x.shape]
    drop = draw(st.integers(0, len(dims)))
    mshape = tuple(dims[drop:])
    p = draw(st.sampled_from([0.2, 0.6, 0.95, 1.0]))
    mask = rng.random(mshape) < p
    return x, axis, layout, mask, draw(st.sampled_from(LAYOUTS))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@settings(max_examples=examples(150))
@given(case=masked_cases())
def test_masked_softmax_matches_reference_random(isa, dtype, case):
    x, axis, layout, mask, mlayout = case
    x = relayout(x.astype(dtype), layout)
    mask = relayout(mask, mlayout)
    got = fastattn.softmax(x, axis=axis, mask=mask)
    with np.errstate(all="ignore"):
        exp = reference.softmax(x.astype(np.float64), axis=axis, mask=mask)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    keep = np.broadcast_to(mask, x.shape)
    # Masked entries are exactly 0, even in a slice whose kept entries are
    # NaN (fastattn.reference.softmax computes 0/NaN = NaN there; the
    # documented semantics -- and attention's hidden weights -- say 0).
    assert np.all(got[~keep] == 0), "masked entries must be exactly 0"
    assert_close(got[keep], exp[keep], dtype)


# ---------------------------------------------------------------------------
# named cases
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2, -3, (0, 1), (1, 2), (0, 2), (-1, 0), (0, 1, 2)])
def test_softmax_axes(isa, dtype, axis, rng):
    x = rng.standard_normal((3, 4, 5)).astype(dtype) * 3
    _check_vs_scipy(x, axis)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 1000, 4099])
def test_softmax_lengths(isa, dtype, n, rng):
    x = rng.standard_normal((2, n)).astype(dtype) * 4
    _check_vs_scipy(x, -1)
    _check_vs_scipy(x, None)
    _check_vs_scipy(np.ascontiguousarray(x.T), 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_noncontiguous(isa, dtype, layout, rng):
    x = relayout(rng.standard_normal((3, 5, 17)).astype(dtype), layout)
    for axis in (None, 0, -1, 1, (0, 2)):
        _check_vs_scipy(x, axis)


def test_softmax_transposed_and_stepped(isa, dtype, rng):
    base = rng.standard_normal((40, 30)).astype(dtype)
    for x in (base.T, base[::3, ::-2], base[5:25:2].T[::-1]):
        for axis in (0, 1, None):
            _check_vs_scipy(x, axis)


def test_softmax_with_infinities_and_nan(isa, dtype):
    x = np.array([
        [0.0, 1.0, 2.0, 3.0],
        [-np.inf, 1.0, 2.0, -np.inf],      # -inf -> 0
        [np.inf, 1.0, 2.0, 3.0],           # +inf -> NaN everywhere (scipy)
        [np.nan, 1.0, 2.0, 3.0],           # NaN -> NaN everywhere
        [-np.inf, -np.inf, -np.inf, -np.inf],  # all -inf -> NaN (scipy)
        [np.inf, np.inf, 0.0, 0.0],
        [-np.inf, 5.0, -np.inf, -np.inf],  # a single finite -> exactly 1
    ], dtype=dtype)
    got = _check_vs_scipy(x, 1)
    assert np.all(got[1, [0, 3]] == 0)
    assert got[6, 1] == 1 and np.all(got[6, [0, 2, 3]] == 0)
    assert np.all(np.isnan(got[2:6]))
    _check_vs_scipy(x, 0)
    _check_vs_scipy(x, None)
    _check_vs_scipy(x[:2], None)


def test_softmax_extreme_values_no_overflow(isa, dtype):
    big = np.finfo(dtype).max
    x = np.array([[big, -big, 0.0], [big, big, big], [-big, -big, -big], [1e-30, 0, -1e-30]], dtype=dtype)
    got = _check_vs_scipy(x, -1)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[1:3], 1 / 3, rtol=1e-6)


def test_softmax_sums_to_one(isa, dtype, rng):
    x = rng.standard_normal((4, 6, 9)).astype(dtype) * 10
    for axis in (0, 1, 2, (0, 2), None):
        s = fastattn.softmax(x, axis=axis).astype(np.float64).sum(axis=axis)
        np.testing.assert_allclose(s, 1, atol=1e-5 if dtype == np.float32 else 1e-13)


def test_softmax_float16(isa, rng):
    x = rng.standard_normal((5, 33)).astype(np.float16) * 3
    for axis in (None, 0, 1):
        got = fastattn.softmax(x, axis=axis)
        assert got.dtype == np.float16 == scipy.special.softmax(x, axis=axis).dtype
        assert_close(got, _scipy64(x, axis), np.float16)


@pytest.mark.parametrize("idtype", [np.int8, np.int32, np.int64, np.uint8, bool])
def test_softmax_int_gives_float64(idtype, rng):
    x = rng.integers(0, 5, (3, 7)).astype(idtype)
    for axis in (None, 0, -1):
        got = fastattn.softmax(x, axis=axis)
        # (scipy itself gives float16 for int8/uint8/bool: np.exp's promotion;
        # fastattn documents float64 for every integer/bool input)
        assert got.dtype == np.float64
        assert_close(got, _scipy64(x, axis), np.float64)


def test_softmax_1d_and_0d(isa, dtype):
    x = np.array([1.0, 2.0, 3.0], dtype)
    _check_vs_scipy(x, None)
    _check_vs_scipy(x, 0)
    _check_vs_scipy(x, -1)
    x0 = np.array(2.5, dtype)
    got = fastattn.softmax(x0)
    assert got.shape == () and got == 1


def test_softmax_list_input():
    got = fastattn.softmax([1.0, 2.0, 3.0])
    np.testing.assert_allclose(got, scipy.special.softmax([1.0, 2.0, 3.0]), rtol=1e-13)


def test_softmax_input_not_modified(dtype, rng):
    x = rng.standard_normal((4, 5)).astype(dtype)
    c = x.copy()
    fastattn.softmax(x, axis=1, mask=x > 0)
    np.testing.assert_array_equal(x, c)


# ---------------------------------------------------------------------------
# mask
# ---------------------------------------------------------------------------

def test_masked_entries_exactly_zero(isa, dtype, rng):
    x = rng.standard_normal((4, 9)).astype(dtype)
    x[0, 2] = np.nan
    x[1, 3] = np.inf
    x[2, 4] = -np.inf
    mask = np.ones((4, 9), dtype=bool)
    mask[0, 2] = mask[1, 3] = mask[2, 4] = False
    mask[3, ::2] = False
    got = fastattn.softmax(x, axis=1, mask=mask)
    assert np.all(got[~mask] == 0)
    assert np.all(np.isfinite(got)), "a masked NaN/Inf must not leak"
    np.testing.assert_allclose(got.astype(np.float64).sum(1), 1, atol=1e-5)
    assert_close(got, reference.softmax(x.astype(np.float64), axis=1, mask=mask), dtype)


def test_masked_all_masked_slice_is_zero(isa, dtype, rng):
    x = rng.standard_normal((3, 5)).astype(dtype)
    mask = rng.random((3, 5)) < 0.6
    mask[1] = False
    got = fastattn.softmax(x, axis=1, mask=mask)
    assert np.all(got[1] == 0)
    assert not np.any(np.isnan(got))
    got = fastattn.softmax(x, axis=None, mask=np.zeros((3, 5), bool))
    assert np.all(got == 0) and got.dtype == np.dtype(dtype)
    # axis=0: column 2 fully masked
    mask = np.ones((3, 5), bool)
    mask[:, 2] = False
    got = fastattn.softmax(x, axis=0, mask=mask)
    assert np.all(got[:, 2] == 0)
    assert_close(got[:, [0, 1, 3, 4]], scipy.special.softmax(x.astype(np.float64), axis=0)[:, [0, 1, 3, 4]], dtype)


def test_masked_all_true_equals_unmasked(isa, dtype, rng):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    for axis in (None, 1, (0, 2)):
        a = fastattn.softmax(x, axis=axis, mask=np.ones(x.shape, bool))
        b = fastattn.softmax(x, axis=axis)
        assert_close(a, b, dtype)


@pytest.mark.parametrize("mshape", [(5,), (1, 5), (4, 1), (3, 1, 5), (1, 1, 1), ()])
def test_mask_broadcasts(isa, dtype, mshape, rng):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    mask = rng.random(mshape) < 0.6
    for axis in (None, -1, 0, (1, 2)):
        got = fastattn.softmax(x, axis=axis, mask=mask)
        exp = reference.softmax(x.astype(np.float64), axis=axis, mask=mask)
        assert got.shape == x.shape
        assert_close(got, exp, dtype)


def test_masked_int_input(rng):
    x = rng.integers(-3, 3, (4, 6))
    m = rng.random((4, 6)) < 0.5
    got = fastattn.softmax(x, axis=1, mask=m)
    assert got.dtype == np.float64
    assert_close(got, reference.softmax(x, axis=1, mask=m), np.float64)


# ---------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_out_is_x_in_place(isa, dtype, layout, rng):
    x0 = rng.standard_normal((4, 6, 7)).astype(dtype)
    for axis in (None, -1, 0, (0, 2)):
        x = relayout(x0, layout)
        expected = scipy.special.softmax(x0.astype(np.float64), axis=axis)
        res = fastattn.softmax(x, axis=axis, out=x)
        assert res is x
        assert np.shares_memory(res, x)
        assert_close(x, expected, dtype)


def test_softmax_out_is_x_in_place_sliced_leaves_rest(isa, dtype, rng):
    parent = np.full((9, 11), 123.0, dtype)
    x = parent[1::2, 1::2]
    x[...] = rng.standard_normal(x.shape)
    x0 = x.copy()
    res = fastattn.softmax(x, axis=1, out=x)
    assert res is x
    assert_close(x, scipy.special.softmax(x0.astype(np.float64), axis=1), dtype)
    other = np.ones(parent.shape, bool)
    other[1::2, 1::2] = False
    assert np.all(parent[other] == 123.0)


def test_softmax_out_is_x_with_mask(isa, dtype, rng):
    x = rng.standard_normal((5, 8)).astype(dtype)
    x0 = x.copy()
    m = rng.random((5, 8)) < 0.5
    m[2] = False
    res = fastattn.softmax(x, axis=1, mask=m, out=x)
    assert res is x
    assert_close(x, reference.softmax(x0.astype(np.float64), axis=1, mask=m), dtype)
    assert np.all(x[~m] == 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_out_separate_array(isa, dtype, layout, rng):
    x = rng.standard_normal((3, 5, 6)).astype(dtype)
    out, parent = empty_with_layout(x.shape, dtype, layout, -1.0)
    res = fastattn.softmax(x, axis=1, out=out)
    assert res is out
    assert_close(out, scipy.special.softmax(x.astype(np.float64), axis=1), dtype)


def test_softmax_out_float16_and_int(isa, rng):
    x = rng.standard_normal((3, 7)).astype(np.float16)
    out = np.empty_like(x)
    assert fastattn.softmax(x, axis=1, out=out) is out
    assert_close(out, scipy.special.softmax(x.astype(np.float64), axis=1), np.float16)
    xi = rng.integers(0, 4, (3, 7))
    out = np.empty((3, 7), np.float64)
    assert fastattn.softmax(xi, axis=1, out=out) is out
    assert_close(out, scipy.special.softmax(xi, axis=1), np.float64)
