"""fastattn.merge.merge_attention: exact attention over a union of key sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fastattn import reference
from fastattn.merge import merge_attention

# float32 rounding of a few-term sum of products, with room for exp/log
TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def test_hand_two_parts():
    # lse 0 and log 3: weights 1/4 and 3/4 of the union.
    out, lse = merge_attention([np.array([[[1.0, 0.0]]]), np.array([[[2.0, 4.0]]])],
                               [np.array([[0.0]]), np.array([[math.log(3.0)]])])
    np.testing.assert_allclose(lse, [[math.log(4.0)]], rtol=1e-15)
    np.testing.assert_allclose(out, [[[1 / 4 + 3 / 4 * 2, 3 / 4 * 4]]], rtol=1e-15)


def test_hand_large_lses_stay_finite():
    out, lse = merge_attention([np.ones((1, 1, 1)), np.full((1, 1, 1), 3.0)],
                               [np.full((1, 1), 1000.0), np.full((1, 1), 1000.0)])
    np.testing.assert_allclose(lse, [[1000.0 + math.log(2.0)]], rtol=1e-15)
    np.testing.assert_allclose(out, [[[2.0]]], rtol=1e-15)


def test_single_part_is_returned_unchanged():
    rng = np.random.default_rng(0)
    o, l_ = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3))
    out, lse = merge_attention([o], [l_])
    np.testing.assert_array_equal(out, o)
    np.testing.assert_array_equal(lse, l_)


def test_row_hidden_in_every_part_gives_zeros_and_minus_inf_without_nan():
    outs = [np.full((1, 2, 3), np.nan), np.array([[[1.0, 2.0, 3.0], [np.inf] * 3]])]
    lses = [np.full((1, 2), -np.inf), np.array([[0.5, -np.inf]])]
    out, lse = merge_attention(outs, lses)
    np.testing.assert_array_equal(lse, [[0.5, -np.inf]])
    np.testing.assert_array_equal(out, [[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])


def test_part_with_minus_inf_lse_never_touches_the_row():
    outs = [np.array([[[np.nan]]]), np.array([[[5.0]]])]
    out, lse = merge_attention(outs, [np.array([[-np.inf]]), np.array([[2.0]])])
    np.testing.assert_array_equal(out, [[[5.0]]])
    np.testing.assert_array_equal(lse, [[2.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_plus_inf_lse_makes_the_row_nan(bad):
    out, lse = merge_attention([np.ones((1, 2, 1)), np.ones((1, 2, 1))],
                               [np.array([[bad, 0.0]]), np.zeros((1, 2))])
    assert np.isnan(out[0, 0]).all() and np.isnan(lse[0, 0])
    np.testing.assert_allclose(out[0, 1], 1.0)
    np.testing.assert_allclose(lse[0, 1], math.log(2.0))


@pytest.mark.parametrize("dtype, lse_dtype", [(np.float16, np.float32), (np.float32, np.float32),
                                              (np.float64, np.float64)])
def test_result_dtypes_out_as_outputs_lse_float32_or_float64(dtype, lse_dtype):
    outs = [np.ones((2, 3, 4), dtype), np.ones((2, 3, 4), dtype)]
    lses = [np.zeros((2, 3), lse_dtype), np.zeros((2, 3), lse_dtype)]
    out, lse = merge_attention(outs, lses)
    assert out.dtype == dtype and lse.dtype == lse_dtype


def test_float16_outputs_accumulate_in_float32():
    # The definition: merge the float32 copies, round the result once.
    rng = np.random.default_rng(2)
    outs = [(100 * rng.standard_normal((2, 3, 4))).astype(np.float16) for _ in range(3)]
    lses = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    out, lse = merge_attention(outs, lses)
    out32, lse32 = merge_attention([o.astype(np.float32) for o in outs], lses)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, out32.astype(np.float16))
    np.testing.assert_array_equal(lse, lse32)


def test_accepts_tuples_and_nested_lists():
    out, lse = merge_attention(([[[1.0]]], [[[3.0]]]), ([[0.0]], [[0.0]]))
    np.testing.assert_allclose(out, [[[2.0]]])
    np.testing.assert_allclose(lse, [[math.log(2.0)]])


# ---------------------------------------------------------------------------
# property: merging a split of the keys gives the whole call
# ---------------------------------------------------------------------------

@st.composite
def key_splits(draw):
    """q, k, v, a bool mask, and 2-4 split points of the keys (empty parts too)."""
    N, H, L, S = draw(st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 5),
                                st.integers(0, 9)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n_parts = draw(st.integers(2, 4))
    cuts = sorted(draw(st.lists(st.integers(0, S), min_size=n_parts - 1,
                                max_size=n_parts - 1)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = (2 * rng.standard_normal((N, H, L, 4))).astype(dtype)
    k = (2 * rng.standard_normal((N, H, S, 4))).astype(dtype)
    v = rng.standard_normal((N, H, S, 3)).astype(dtype)
    # Roughly half the positions hidden: some rows are hidden in some parts,
    # and a drawn row is hidden in all of them.
    mask = rng.random((L, S)) < 0.5
    mask[draw(st.integers(0, L - 1))] = False
    return q, k, v, mask, [0, *cuts, S]


def _split_calls(q, k, v, mask, bounds, **kw):
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, s = reference.attention(q, k[..., a:b, :], v[..., a:b, :], mask[:, a:b],
                                   return_lse=True, **kw)
        outs.append(o)
        lses.append(s)
    return outs, lses


@settings(max_examples=examples(100))
@given(key_splits(), st.booleans())
def test_merge_of_key_split_equals_whole_call(split, use_mask):
    q, k, v, mask, bounds = split
    if not use_mask:
        mask = np.ones_like(mask)
    whole, whole_lse = reference.attention(q, k, v, mask, return_lse=True)
    outs, lses = _split_calls(q, k, v, mask, bounds)
    out, lse = merge_attention(outs, lses)
    assert out.dtype == q.dtype and lse.dtype == whole_lse.dtype
    t = TOL[q.dtype]
    np.testing.assert_array_equal(lse == -np.inf, whole_lse == -np.inf)
    np.testing.assert_allclose(lse, whole_lse, rtol=t, atol=t)
    np.testing.assert_allclose(out, whole, rtol=t, atol=t)
    assert not np.isnan(out).any()
    dead = whole_lse == -np.inf
    np.testing.assert_array_equal(out[dead], 0)


@settings(max_examples=examples(60))
@given(key_splits())
def test_merge_of_key_split_equals_whole_call_with_softcap(split):
    # Soft-capping is per logit, so a key split commutes with it (unlike ALiBi
    # and windows, whose positions a part would have to be told).
    q, k, v, mask, bounds = split
    whole, whole_lse = reference.attention(q, k, v, mask, softcap=2.0, return_lse=True)
    out, lse = merge_attention(*_split_calls(q, k, v, mask, bounds, softcap=2.0))
    t = TOL[q.dtype]
    np.testing.assert_allclose(lse, whole_lse, rtol=t, atol=t)
    np.testing.assert_allclose(out, whole, rtol=t, atol=t)


@settings(max_examples=examples(60))
@given(key_splits(), st.randoms(use_true_random=False))
def test_merge_depends_on_nothing_but_the_order_of_the_parts(split, random):
    q, k, v, mask, bounds = split
    outs, lses = _split_calls(q, k, v, mask, bounds)
    out, lse = merge_attention(outs, lses)
    # The same parts in the same order: bitwise the same, also from copies.
    again = merge_attention([o.copy() for o in outs], [s.copy() for s in lses])
    np.testing.assert_array_equal(again[0], out)
    np.testing.assert_array_equal(again[1], lse)
    # Another order: the same up to rounding.
    order = list(range(len(outs)))
    random.shuffle(order)
    out2, lse2 = merge_attention([outs[i] for i in order], [lses[i] for i in order])
    t = TOL[q.dtype]
    np.testing.assert_allclose(out2, out, rtol=t, atol=t)
    np.testing.assert_allclose(lse2, lse, rtol=t, atol=t)


def test_merge_of_merges_equals_merge_of_all():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 8, 3)),
               rng.standard_normal((2, 8, 2)))
    outs, lses = _split_calls(q, k, v, np.ones((4, 8), bool), [0, 2, 5, 8])
    ab = merge_attention(outs[:2], lses[:2])
    nested = merge_attention([ab[0], outs[2]], [ab[1], lses[2]])
    flat = merge_attention(outs, lses)
    np.testing.assert_allclose(nested[0], flat[0], rtol=1e-13)
    np.testing.assert_allclose(nested[1], flat[1], rtol=1e-13)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------

O, LS = np.zeros((2, 3, 4)), np.zeros((2, 3))


@pytest.mark.parametrize("outputs, lses, match", [
    pytest.param([], [], "outputs is empty", id="empty"),
    pytest.param([O], [], "lses is empty", id="empty-lses"),
    pytest.param([O, O], [LS], r"as many parts.*2 and 1", id="count-mismatch"),
    pytest.param([O, np.zeros((2, 3, 5))], [LS, LS], r"outputs\[1\].*\(2, 3, 5\)",
                 id="output-shape-mismatch"),
    pytest.param([O, O.astype(np.float32)], [LS, LS], r"outputs\[1\].*float32",
                 id="output-dtype-mismatch"),
    pytest.param([O, O], [LS, np.zeros((2, 4))], r"lses\[1\].*\(2, 4\)",
                 id="lse-shape-mismatch"),
    pytest.param([O, O], [LS, LS.astype(np.float32)], r"lses\[1\].*float32",
                 id="lse-dtype-mismatch"),
    pytest.param([O], [np.zeros((2, 3, 4))], r"lses.*\(2, 3\).*\(2, 3, 4\)",
                 id="lse-shape-not-out-shape-minus-last"),
    pytest.param([np.zeros(())], [np.zeros(())], "outputs", id="zero-dim-outputs"),
    pytest.param(np.zeros(()), [LS], "outputs", id="zero-dim-array-as-sequence"),
    pytest.param([[[1.0, 2.0], [1.0]]], [LS], r"outputs\[0\] cannot be made an array",
                 id="ragged-nested-list"),
])
def test_bad_input_raises_value_error_naming_argument(outputs, lses, match):
    with pytest.raises(ValueError, match=match):
        merge_attention(outputs, lses)


class _Unconvertible:
    """An array of a library NumPy cannot read (torch's bfloat16 tensors)."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Got unsupported ScalarType BFloat16")


@pytest.mark.parametrize("outputs, lses, match", [
    pytest.param([O.astype(np.int64)], [LS], "outputs", id="int-outputs"),
    pytest.param([O], [LS.astype(bool)], "lses", id="bool-lses"),
    pytest.param(3, [LS], "outputs", id="not-a-sequence"),
    pytest.param([O.astype(np.longdouble)], [LS], "outputs must hold float16, bfloat16",
                 id="long-double-outputs"),
    pytest.param([O, _Unconvertible()], [LS, LS],
                 r"outputs\[1\] cannot be made an array: Got unsupported ScalarType",
                 id="a-part-numpy-cannot-read"),
])
def test_non_float_input_raises_type_error_naming_argument(outputs, lses, match):
    with pytest.raises(TypeError, match=match):
        merge_attention(outputs, lses)
