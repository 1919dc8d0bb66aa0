"""fastattn.attention against fastattn.reference.attention: ``out=``,
``return_weights``, result dtypes and ``scale``.

The numeric tests run on every ISA path (the ``isa`` fixture), most in
float32 and float64 (the ``dtype`` fixture); those of ``out=``'s layouts, the
result dtypes and the inputs left unchanged (the Python layer's and the
driver's work, the same for every path) run once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference
from conftest import (
    _randn,
    assert_close,
    check_against_reference,
    empty_with_layout,
    expected_result_dtype,
    finite_absmax,
    hidden_positions,
    reference_attention64,
    tol_for,
)


# ---------------------------------------------------------------------------
# out=, return_weights, dtypes, scale
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["C", "F", "sliced", "negative", "permuted"])
def test_out_non_contiguous(dtype, rng, layout):
    q, k, v = _randn(rng, (2, 3, 7, 4), dtype), _randn(rng, (2, 3, 9, 4), dtype), _randn(rng, (2, 3, 9, 5), dtype)
    expected = fastattn.attention(q, k, v, is_causal=True)
    out, parent = empty_with_layout((2, 3, 7, 5), dtype, layout, -99.0)
    res = fastattn.attention(q, k, v, is_causal=True, out=out)
    assert res is out
    np.testing.assert_array_equal(out, expected)
    if layout == "sliced":
        # the junk between the view's elements is untouched
        untouched = np.ones(parent.shape, dtype=bool)
        untouched[tuple(slice(1, 2 * n, 2) for n in out.shape)] = False
        assert np.all(parent[untouched] == -99.0)


def test_out_with_return_weights(dtype, rng):
    q, k, v = _randn(rng, (6, 4), dtype), _randn(rng, (8, 4), dtype), _randn(rng, (8, 3), dtype)
    out = np.empty((6, 3), dtype)
    res = fastattn.attention(q, k, v, out=out, return_weights=True)
    assert isinstance(res, tuple) and res[0] is out
    check_against_reference(q, k, v, out=np.empty((6, 3), dtype))


def test_out_float16(isa, rng):
    q, k, v = (_randn(rng, s, np.float16) for s in [(6, 4), (8, 4), (8, 3)])
    out = np.full((3, 6), np.nan, np.float16).T
    res = fastattn.attention(q, k, v, out=out)
    assert res is out
    assert_close(out, reference_attention64(q, k, v)[0], np.float16, magnitude=finite_absmax(v))


def test_return_weights_rows_sum_to_one_or_zero(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 20, 8), dtype), _randn(rng, (3, 31, 8), dtype), _randn(rng, (3, 31, 8), dtype)
    m = rng.random((3, 20, 31)) < 0.5
    m[0, 5] = False
    m[2, :3] = False
    o, w = fastattn.attention(q, k, v, m, is_causal="lower_right", return_weights=True)
    sums = w.astype(np.float64).sum(axis=-1)
    dead = ~np.any(hidden_positions(20, 31, (3,), is_causal="lower_right", attn_mask=m) == False, axis=-1)  # noqa: E712
    assert dead.any()
    np.testing.assert_array_equal(sums[dead], 0)
    np.testing.assert_allclose(sums[~dead], 1, rtol=0, atol=20 * tol_for(dtype))
    assert np.all(w >= 0) and np.all(w <= 1)


def test_return_weights_output_is_weights_times_value(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 9, 5), dtype), _randn(rng, (2, 12, 5), dtype), _randn(rng, (2, 12, 4), dtype)
    o, w = fastattn.attention(q, k, v, is_causal=True, return_weights=True)
    assert_close(o, w.astype(np.float64) @ v.astype(np.float64), dtype, magnitude=finite_absmax(v), factor=3)
    o2 = fastattn.attention(q, k, v, is_causal=True)
    assert_close(o, o2, dtype, magnitude=finite_absmax(v))


@pytest.mark.parametrize("idtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, bool])
def test_int_inputs_give_float64(idtype, rng):
    q = rng.integers(0, 3, (4, 3)).astype(idtype)
    k = rng.integers(0, 3, (5, 3)).astype(idtype)
    v = rng.integers(0, 3, (5, 2)).astype(idtype)
    o, w = check_against_reference(q, k, v, is_causal=True)
    assert o.dtype == np.float64 and w.dtype == np.float64
    o_f = fastattn.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                             is_causal=True)
    assert_close(o, o_f, np.float64)


@pytest.mark.parametrize("dts", [
    (np.float32, np.float64, np.float32),
    (np.float64, np.float32, np.float32),
    (np.float16, np.float32, np.float16),
    (np.float16, np.float16, np.float64),
    (np.int32, np.float32, np.float32),
    (np.int8, np.float16, np.float16),
    (np.int64, np.int16, np.float32),
    (np.float16, np.float16, np.float16),
])
def test_mixed_dtypes_follow_result_type(dts, rng):
    q = (rng.standard_normal((2, 5, 4)) * 2).astype(dts[0])
    k = (rng.standard_normal((2, 7, 4)) * 2).astype(dts[1])
    v = (rng.standard_normal((2, 7, 3)) * 2).astype(dts[2])
    want = expected_result_dtype(q, k, v)
    assert reference.attention(q, k, v).dtype == want
    o, w = check_against_reference(q, k, v, is_causal="lower_right")
    assert o.dtype == want and w.dtype == want


def test_float16_computed_in_float32(isa, rng):
    """float16 in, float16 out, but no float16 overflow in the scores or sums."""
    E = 64
    q = np.full((3, E), 40.0, np.float16)   # q.k = 64 * 1600 = 102400 > float16 max
    k = np.full((5, E), 40.0, np.float16)
    k[1] = -40.0
    v = _randn(rng, (5, 4), np.float16)
    o, w = fastattn.attention(q, k, v, return_weights=True)
    assert o.dtype == np.float16 and w.dtype == np.float16
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(w))
    assert_close(o, reference_attention64(q, k, v)[0], np.float16, magnitude=finite_absmax(v))
    # many keys: the softmax denominator would overflow float16 if summed there
    S = 70000
    k2 = np.zeros((S, 4), np.float16)
    v2 = np.ones((S, 2), np.float16)
    o2 = fastattn.attention(np.zeros((1, 4), np.float16), k2, v2)
    np.testing.assert_allclose(o2.astype(np.float64), 1.0, atol=2e-3)


def test_scale_zero_uniform_weights(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 6, 4), dtype, 5), _randn(rng, (2, 8, 4), dtype, 5), _randn(rng, (2, 8, 3), dtype)
    o, w = check_against_reference(q, k, v, scale=0.0)
    assert_close(w, np.full(w.shape, 1 / 8), dtype)
    assert_close(o, np.broadcast_to(v.astype(np.float64).mean(axis=-2, keepdims=True), o.shape),
                 dtype, magnitude=finite_absmax(v))
    # with causal: uniform over the visible prefix
    o, w = check_against_reference(q, k, v, scale=0.0, is_causal=True)
    for i in range(6):
        assert_close(w[:, i, : i + 1], np.full((2, i + 1), 1 / (i + 1)), dtype)


def test_scale_default_is_inv_sqrt_E(isa, dtype, rng):
    q, k, v = _randn(rng, (5, 7), dtype), _randn(rng, (6, 7), dtype), _randn(rng, (6, 3), dtype)
    a = fastattn.attention(q, k, v)
    b = fastattn.attention(q, k, v, scale=1 / math.sqrt(7))
    assert_close(a, b, dtype, magnitude=finite_absmax(v))
    c = fastattn.attention(q, k, v, scale=1.0)
    assert not np.allclose(a, c)
    check_against_reference(q, k, v, scale=1.0)
    check_against_reference(q, k, v, scale=-0.5)
    check_against_reference(q, k, v, scale=np.float32(0.25))


def test_large_scale_saturates_without_overflow(isa, dtype, rng):
    q, k, v = _randn(rng, (4, 8), dtype), _randn(rng, (9, 8), dtype), _randn(rng, (9, 3), dtype)
    o, w = check_against_reference(q, k, v, scale=30.0, factor=5)
    assert np.all(np.isfinite(o))
    o, w = check_against_reference(q * 1000, k * 1000, v, factor=5)
    assert np.all(np.isfinite(o))


def test_inputs_are_not_modified(dtype, rng):
    q, k, v = _randn(rng, (2, 6, 4), dtype), _randn(rng, (2, 8, 4), dtype), _randn(rng, (2, 8, 3), dtype)
    m = rng.standard_normal((6, 8)).astype(dtype)
    kpm = rng.random(8) < 0.3
    copies = [a.copy() for a in (q, k, v, m, kpm)]
    fastattn.attention(q, k, v, m, is_causal=True, key_padding_mask=kpm, return_weights=True)
    for a, c in zip((q, k, v, m, kpm), copies):
        np.testing.assert_array_equal(a, c)


def test_accepts_array_likes():
    q = [[1.0, 0.0], [0.0, 1.0]]
    o = fastattn.attention(q, q, q)
    np.testing.assert_allclose(o, reference.attention(q, q, q), atol=1e-12)
    assert o.dtype == np.float64
