"""fastattn.attention against fastattn.reference.attention: masks, dead rows,
NaN and Inf.

Boolean and additive masks, key padding, rows that see no key (exactly zero),
hidden NaN/Inf entries that must not leak into the result, and visible ones
that must give the reference's NaN.  The numeric tests run on every ISA path
(the ``isa`` fixture) in float32 and float64 (the ``dtype`` fixture); the
mask's dtype rule runs once.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference
from conftest import (
    CAUSAL,
    _randn,
    assert_close,
    check_against_reference,
    finite_absmax,
    reference_attention64,
    tol_for,
)


# ---------------------------------------------------------------------------
# masks and dead rows
# ---------------------------------------------------------------------------

def test_fully_masked_row_gives_zeros(isa, dtype, rng):
    L, S = 5, 6
    q, k, v = _randn(rng, (L, 4), dtype), _randn(rng, (S, 4), dtype), _randn(rng, (S, 3), dtype)
    bm = rng.random((L, S)) < 0.7
    bm[2] = False
    o, w = check_against_reference(q, k, v, bm)
    assert np.all(o[2] == 0) and np.all(w[2] == 0)
    fm = rng.standard_normal((L, S)).astype(dtype)
    fm[1] = -np.inf
    o, w = check_against_reference(q, k, v, fm)
    assert np.all(o[1] == 0) and np.all(w[1] == 0)
    assert not np.any(np.isnan(o)) and not np.any(np.isnan(w))
    np.testing.assert_allclose(np.delete(w, 1, axis=0).sum(-1), 1, atol=10 * tol_for(dtype))


def test_fully_masked_row_with_nan_values_gives_zeros(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 4), dtype), _randn(rng, (5, 4), dtype), _randn(rng, (5, 2), dtype)
    k[1] = np.nan
    v[1] = np.inf
    m = np.zeros((3, 5), dtype=bool)
    m[1, 1] = True     # only row 1 sees the poisoned key
    o, w = fastattn.attention(q, k, v, m, return_weights=True)
    assert np.all(o[[0, 2]] == 0) and np.all(w[[0, 2]] == 0)


def test_all_keys_padded_gives_zeros(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 3, 4), dtype), _randn(rng, (2, 5, 4), dtype), _randn(rng, (2, 5, 3), dtype)
    kpm = np.array([[True] * 5, [False, True, False, True, True]])
    o, w = check_against_reference(q, k, v, key_padding_mask=kpm)
    assert np.all(o[0] == 0) and np.all(w[0] == 0)
    assert np.all(w[1][:, [1, 3, 4]] == 0)


def test_row_hidden_by_combination_gives_zeros(isa, dtype, rng):
    """Each mask alone leaves keys visible; together they hide the row."""
    L = S = 4
    q, k, v = _randn(rng, (1, L, 3), dtype), _randn(rng, (1, S, 3), dtype), _randn(rng, (1, S, 3), dtype)
    kpm = np.array([[True, False, False, False]])           # hides key 0
    bm = np.ones((L, S), dtype=bool)
    bm[1, 1] = False                                         # row 1 loses key 1
    o, w = check_against_reference(q, k, v, bm, is_causal=True, key_padding_mask=kpm)
    # row 0 sees only key 0 (causal) which is padding: dead
    # row 1 sees keys 0, 1: padding + bool mask: dead
    assert np.all(o[0, :2] == 0) and np.all(w[0, :2] == 0)
    assert np.all(w[0, 2:].sum(-1) > 0.99)


def test_key_padding_mask_1d_with_causal_and_bool_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 3, 8, 5), dtype), _randn(rng, (2, 3, 11, 5), dtype), _randn(rng, (2, 3, 11, 4), dtype)
    kpm = rng.random(11) < 0.3
    bm = rng.random((3, 8, 11)) < 0.7
    for causal in CAUSAL:
        check_against_reference(q, k, v, bm, is_causal=causal, key_padding_mask=kpm)


def test_key_padding_mask_2d_with_float_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 2, 8, 5), dtype), _randn(rng, (3, 2, 11, 5), dtype), _randn(rng, (3, 2, 11, 4), dtype)
    kpm = rng.random((3, 11)) < 0.3
    kpm[1] = True   # batch 1 is all padding
    fm = rng.standard_normal((8, 11)).astype(dtype)
    fm[rng.random((8, 11)) < 0.2] = -np.inf
    for causal in CAUSAL:
        o, w = check_against_reference(q, k, v, fm, is_causal=causal, key_padding_mask=kpm)
        assert np.all(o[1] == 0)


def test_key_padding_mask_2d_3d_query(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 6, 5), dtype), _randn(rng, (3, 7, 5), dtype), _randn(rng, (3, 7, 2), dtype)
    kpm = rng.random((3, 7)) < 0.4
    o, w = check_against_reference(q, k, v, key_padding_mask=kpm)
    for n in range(3):
        assert np.all(w[n][:, kpm[n]] == 0)


def test_key_padding_mask_equals_bool_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 4, 6, 5), dtype), _randn(rng, (2, 4, 9, 5), dtype), _randn(rng, (2, 4, 9, 3), dtype)
    kpm = rng.random((2, 9)) < 0.4
    a = fastattn.attention(q, k, v, key_padding_mask=kpm, is_causal=True)
    b = fastattn.attention(q, k, v, ~kpm[:, None, None, :], is_causal=True)
    assert_close(a, b, dtype, magnitude=finite_absmax(v))


def test_additive_mask_with_neg_inf(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 7, 4), dtype), _randn(rng, (2, 9, 4), dtype), _randn(rng, (2, 9, 3), dtype)
    fm = rng.standard_normal((2, 7, 9)).astype(dtype) * 2
    fm[rng.random(fm.shape) < 0.4] = -np.inf
    o, w = check_against_reference(q, k, v, fm)
    assert np.all(w[np.isneginf(fm)] == 0)
    # large finite negative values are not hiding: they give tiny, non-zero weight... or 0 by underflow
    fm2 = np.where(np.isneginf(fm), -30.0, fm).astype(dtype)
    check_against_reference(q, k, v, fm2)


def test_additive_mask_shifts_scores(isa, dtype, rng):
    """A constant additive mask changes nothing; a per-key one is a bias."""
    q, k, v = _randn(rng, (5, 4), dtype), _randn(rng, (6, 4), dtype), _randn(rng, (6, 3), dtype)
    base = fastattn.attention(q, k, v)
    shifted = fastattn.attention(q, k, v, np.full((5, 6), 3.25, dtype))
    assert_close(shifted, base, dtype, magnitude=finite_absmax(v), factor=4)
    check_against_reference(q, k, v, np.linspace(-2, 2, 6).astype(dtype))


def test_float64_mask_with_float32_inputs_keeps_float32(rng):
    q, k, v = (_randn(rng, s, np.float32) for s in [(4, 3), (5, 3), (5, 2)])
    m = rng.standard_normal((4, 5))
    o = fastattn.attention(q, k, v, m)
    assert o.dtype == reference.attention(q, k, v, m).dtype == np.float32
    check_against_reference(q, k, v, m)


def test_bool_mask_all_true_is_no_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (5, 4), dtype), _randn(rng, (6, 4), dtype), _randn(rng, (6, 3), dtype)
    a = fastattn.attention(q, k, v, np.ones((5, 6), dtype=bool))
    b = fastattn.attention(q, k, v)
    assert_close(a, b, dtype, magnitude=finite_absmax(v))


# ---------------------------------------------------------------------------
# NaN / Inf
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["causal", "lower_right", "padding", "padding2d", "bool", "neginf"])
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_hidden_nan_key_has_no_influence(isa, dtype, rng, how, poison):
    """A hidden key's K and V entries can be NaN/Inf: the output is as if the key were absent."""
    L, S, E = 6, 8, 5
    q = _randn(rng, (2, L, E), dtype)
    k = _randn(rng, (2, S, E), dtype)
    v = _randn(rng, (2, S, 3), dtype)
    j = S - 1   # hidden from every row by causal (L < S), or hidden by a mask
    kwargs, mask = {}, None
    if how == "causal":
        kwargs["is_causal"] = True
        keep_rows = slice(None)
    elif how == "lower_right":
        kwargs["is_causal"] = "lower_right"
        keep_rows = slice(None, L - 1)   # only the last row sees key S-1
    elif how == "padding":
        kpm = np.zeros(S, dtype=bool)
        kpm[j] = True
        kwargs["key_padding_mask"] = kpm
        keep_rows = slice(None)
    elif how == "padding2d":
        kpm = np.zeros((2, S), dtype=bool)
        kpm[:, j] = True
        kwargs["key_padding_mask"] = kpm
        keep_rows = slice(None)
    elif how == "bool":
        mask = np.ones((L, S), dtype=bool)
        mask[:, j] = False
        keep_rows = slice(None)
    else:
        mask = np.zeros((L, S), dtype=dtype)
        mask[:, j] = -np.inf
        keep_rows = slice(None)
    clean_o, clean_w = fastattn.attention(q, k, v, mask, return_weights=True, **kwargs)
    k2, v2 = k.copy(), v.copy()
    k2[:, j] = poison
    v2[:, j] = poison
    o, w = fastattn.attention(q, k2, v2, mask, return_weights=True, **kwargs)
    o_ref, w_ref = reference_attention64(q, k2, v2, mask, **kwargs)
    assert not np.any(np.isnan(o[:, keep_rows])), "a hidden NaN/Inf key leaked into the output"
    assert not np.any(np.isnan(w[:, keep_rows]))
    np.testing.assert_array_equal(w[:, keep_rows, j], 0)
    assert_close(o[:, keep_rows], clean_o[:, keep_rows], dtype, magnitude=finite_absmax(v))
    assert_close(w[:, keep_rows], clean_w[:, keep_rows], dtype)
    # without the poisoned key at all
    k3, v3 = np.delete(k, j, axis=-2), np.delete(v, j, axis=-2)
    if how in ("padding", "padding2d", "bool", "neginf", "causal"):
        m3 = None if mask is None else np.delete(mask, j, axis=-1)
        kw3 = {kk: vv for kk, vv in kwargs.items() if kk != "key_padding_mask"}
        o3 = fastattn.attention(q, k3, v3, m3, **kw3)
        assert_close(o, o3, dtype, magnitude=finite_absmax(v))
    # and everything (including rows that do see the poison) as the reference
    assert_close(o, o_ref, dtype, magnitude=finite_absmax(v))
    assert_close(w, w_ref, dtype)


def test_hidden_nan_value_has_no_influence_large(isa, dtype, rng):
    """Same across block boundaries: many hidden poisoned keys in a long sequence."""
    L, S = 130, 600
    q, k, v = _randn(rng, (L, 16), dtype), _randn(rng, (S, 16), dtype), _randn(rng, (S, 8), dtype)
    kpm = rng.random(S) < 0.2
    k[kpm] = np.nan
    v[kpm] = np.inf
    m = rng.random((L, S)) < 0.9
    o = fastattn.attention(q, k, v, m, is_causal="lower_right", key_padding_mask=kpm)
    assert np.all(np.isfinite(o))
    check_against_reference(q, k, v, m, is_causal="lower_right", key_padding_mask=kpm, factor=2)


def test_visible_nan_gives_nan_row(isa, dtype, rng):
    L, S = 5, 6
    q, k, v = _randn(rng, (L, 4), dtype), _randn(rng, (S, 4), dtype), _randn(rng, (S, 3), dtype)
    k_nan = k.copy()
    k_nan[2, 1] = np.nan           # visible to rows >= 2 under causal
    o, w = check_against_reference(q, k_nan, v, is_causal=True)
    assert np.all(np.isnan(o[2:])) and np.all(np.isnan(w[2:, :3]))
    assert np.all(np.isfinite(o[:2]))
    v_nan = v.copy()
    v_nan[3, 0] = np.nan           # only output column 0 of rows that see key 3
    o, w = check_against_reference(q, k, v_nan, is_causal=True)
    assert np.all(np.isnan(o[3:, 0])) and np.all(np.isfinite(o[:, 1:]))
    assert np.all(np.isfinite(o[:3]))
    q_nan = q.copy()
    q_nan[4, 0] = np.nan
    o, w = check_against_reference(q_nan, k, v)
    assert np.all(np.isnan(o[4])) and np.all(np.isfinite(o[:4]))


def test_visible_pos_inf_score_gives_nan_row(isa, dtype):
    q = np.array([[1.0, 1.0], [-1.0, 1.0], [0.5, 0.5]], dtype)
    k = np.array([[np.inf, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype)
    v = np.array([[1.0], [2.0], [3.0]], dtype)
    o, w = check_against_reference(q, k, v)
    # row 0: score +inf -> NaN row (as scipy.special.softmax)
    assert np.all(np.isnan(o[0])) and np.all(np.isnan(w[0]))
    # row 1: score -inf -> that key is hidden, the row is fine
    assert w[1, 0] == 0 and np.all(np.isfinite(o[1]))


def test_neg_inf_score_is_hidden(isa, dtype):
    q = np.array([[-1.0, 0.0]], dtype)
    k = np.array([[np.inf, 0.0], [1.0, 0.0]], dtype)
    v = np.array([[np.nan, np.nan], [3.0, 4.0]], dtype)
    o, w = fastattn.attention(q, k, v, return_weights=True)
    np.testing.assert_array_equal(w, [[0, 1]])
    np.testing.assert_array_equal(o, [[3, 4]])


def test_infinite_value_visible(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 4), dtype), _randn(rng, (4, 4), dtype), _randn(rng, (4, 2), dtype)
    v[1, 0] = np.inf
    check_against_reference(q, k, v)
