"""fastattn.reference: window, ALiBi, soft-cap, sinks, return_lse and varlen.

The hand-computed cases build their expected values from the formulas of
the reference's module docstring with ``math``, never by calling the
reference again; the properties tie the options to each other and to an
independent float64 evaluation of the logits.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fastattn import reference

T = math.tanh(1.0)
E = math.exp


def _allclose(actual, expected, rtol=1e-12, atol=1e-12):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                               np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# hand-computed cases
# ---------------------------------------------------------------------------

def test_hand_one_head_3x3_window_alibi_softcap_sink():
    # q = k = I, scale 1: raw score delta_ij; softcap 1 -> tanh(1) on the
    # diagonal, 0 elsewhere; ALiBi 0.5 -> -0.5 |i - j|; window (1, 0): row i
    # sees j in {i-1, i}; sink 0 adds exp(0) = 1 to each denominator.
    eye = np.eye(3)[None]
    v = np.array([[[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]]])
    out, w, lse = reference.attention(eye, eye, v, scale=1.0, window=(1, 0), alibi_slopes=[0.5],
                                      softcap=1.0, sinks=[0.0], return_weights=True,
                                      return_lse=True)
    d0 = E(T) + 1
    d1 = E(-0.5) + E(T) + 1
    expected_w = np.array([[E(T) / d0, 0, 0],
                           [E(-0.5) / d1, E(T) / d1, 0],
                           [0, E(-0.5) / d1, E(T) / d1]])
    _allclose(w[0], expected_w)
    _allclose(out[0], expected_w @ v[0])
    _allclose(lse[0], [math.log(d0), math.log(d1), math.log(d1)])
    assert w[0].sum(axis=-1).max() < 1       # the sink takes its share


def test_hand_window_alone_uniform_over_visible():
    # q = 0: every logit is 0, so each row is uniform over the keys it sees.
    q, k = np.zeros((1, 5, 2)), np.ones((1, 5, 2))
    _, w = reference.attention(q, k, k, window=(2, 1), return_weights=True)
    visible = [[0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4]]
    expected = np.zeros((5, 5))
    for i, js in enumerate(visible):
        expected[i, js] = 1 / len(js)
    _allclose(w[0], expected)


def test_hand_window_int_is_symmetric_and_none_side_unbounded():
    q, k = np.zeros((1, 4, 1)), np.ones((1, 4, 1))
    _, w = reference.attention(q, k, k, window=1, return_weights=True)
    _, w_pair = reference.attention(q, k, k, window=(1, 1), return_weights=True)
    np.testing.assert_array_equal(w, w_pair)
    _, w_left = reference.attention(q, k, k, window=(None, 0), return_weights=True)
    _allclose(w_left[0], np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None])
    _, w_right = reference.attention(q, k, k, window=(0, None), return_weights=True)
    _allclose(w_right[0], np.triu(np.ones((4, 4))) / np.arange(4, 0, -1)[:, None])


def test_hand_window_lower_right_alignment_L2_S4():
    # p(i) = i + S - L = i + 2: row 0 sees {1, 2}, row 1 sees {2, 3}.
    q, k = np.zeros((1, 2, 1)), np.ones((1, 4, 1))
    _, w = reference.attention(q, k, k, is_causal="lower_right", window=(1, 0),
                               return_weights=True)
    _allclose(w[0], [[0, 0.5, 0.5, 0], [0, 0, 0.5, 0.5]])
    # Without lower_right the same window is aligned at p(i) = i.
    _, w = reference.attention(q, k, k, window=(1, 0), return_weights=True)
    _allclose(w[0], [[1, 0, 0, 0], [0.5, 0.5, 0, 0]])


def test_hand_alibi_alone_per_head_slopes():
    q, k = np.zeros((2, 3, 1)), np.ones((2, 3, 1))
    v = np.arange(6.0).reshape(2, 3, 1)
    out, w = reference.attention(q, k, v, alibi_slopes=np.array([1.0, 0.25]),
                                 return_weights=True)
    for h, slope in enumerate((1.0, 0.25)):
        for i in range(3):
            e = [E(-slope * abs(i - j)) for j in range(3)]
            _allclose(w[h, i], np.array(e) / sum(e))
            _allclose(out[h, i, 0], sum(e[j] * v[h, j, 0] for j in range(3)) / sum(e))


def test_hand_alibi_lower_right_distance_from_p_of_i():
    q, k = np.zeros((1, 1, 1)), np.ones((1, 3, 1))
    _, w = reference.attention(q, k, k, is_causal="lower_right", alibi_slopes=[2.0],
                               return_weights=True)
    e = [E(-2.0 * 2), E(-2.0 * 1), 1.0]      # p(0) = 0 + 3 - 1 = 2
    _allclose(w[0, 0], np.array(e) / sum(e))


def test_hand_alibi_negative_slope_allowed():
    q, k = np.zeros((1, 1, 1)), np.ones((1, 2, 1))
    _, w = reference.attention(q, k, k, alibi_slopes=[-1.0], return_weights=True)
    _allclose(w[0, 0], np.array([1.0, E(1.0)]) / (1 + E(1.0)))


def test_hand_softcap_alone():
    q = np.array([[[2.0]]])
    k = np.array([[[10.0], [0.0], [-30.0]]])
    _, w, lse = reference.attention(q, k, k, scale=1.0, softcap=5.0, return_weights=True,
                                    return_lse=True)
    s = [5 * math.tanh(20 / 5), 0.0, 5 * math.tanh(-60 / 5)]
    den = sum(E(x) for x in s)
    _allclose(w[0, 0], [E(x) / den for x in s])
    _allclose(lse[0, 0], math.log(den))


def test_hand_order_softcap_before_alibi_and_additive_mask():
    # q = 0: raw scores 0.  Capping happens first, so the mask's +5 and the
    # ALiBi bias -3 reach the logits uncapped.
    q, k = np.zeros((1, 1, 1)), np.ones((1, 2, 1))
    mask = np.array([[5.0, 0.0]])
    _, w = reference.attention(q, k, k, attn_mask=mask, softcap=1.0, alibi_slopes=[3.0],
                               return_weights=True)
    s = [5.0, -3.0]                           # key 0: mask +5, distance 0; key 1: -3 * 1
    _allclose(w[0, 0], np.array([E(s[0]), E(s[1])]) / (E(s[0]) + E(s[1])))


def test_hand_softcap_turns_raw_minus_inf_into_minus_cap():
    q = np.array([[[1.0]]])
    k = np.array([[[-np.inf], [0.0]]])
    v = np.array([[[1.0], [3.0]]])
    out, w = reference.attention(q, k, v, scale=1.0, softcap=2.0, return_weights=True)
    den = E(-2.0) + 1
    _allclose(w[0, 0], [E(-2.0) / den, 1 / den])
    _allclose(out[0, 0, 0], (E(-2.0) + 3) / den)
    # Without softcap the -inf score hides key 0.
    _, w = reference.attention(q, k, v, scale=1.0, return_weights=True)
    _allclose(w[0, 0], [0.0, 1.0])


def test_hand_sinks_alone_weights_sum_below_one():
    q, k = np.zeros((2, 1, 1)), np.ones((2, 3, 1))
    _, w, lse = reference.attention(q, k, k, sinks=[0.0, math.log(3.0)], return_weights=True,
                                    return_lse=True)
    _allclose(w[0, 0], [1 / 4] * 3)           # 3 keys + exp(0)
    _allclose(w[1, 0], [1 / 6] * 3)           # 3 keys + exp(log 3)
    _allclose(lse[:, 0], [math.log(4.0), math.log(6.0)])


def test_hand_sink_far_above_the_logits_does_not_overflow():
    q, k = np.zeros((1, 1, 1)), np.ones((1, 1, 1))
    _, w, lse = reference.attention(q, k, k, sinks=[1000.0], return_weights=True,
                                    return_lse=True)
    _allclose(w[0, 0], [E(-1000.0)], atol=0)  # exp(0 - 1000) / (exp(-1000) + 1)
    _allclose(lse[0, 0], 1000.0)


def test_hand_row_with_no_visible_key_with_sink_gives_zeros_and_lse_minus_inf():
    # lower_right, L=3, S=1: p(i) = i - 2, so rows 0 and 1 see no key.
    q, k = np.ones((1, 3, 2)), np.ones((1, 1, 2))
    v = np.full((1, 1, 2), 7.0)
    out, w, lse = reference.attention(q, k, v, is_causal="lower_right", sinks=[1.0],
                                      return_weights=True, return_lse=True)
    np.testing.assert_array_equal(out[0, :2], 0)
    np.testing.assert_array_equal(w[0, :2], 0)
    np.testing.assert_array_equal(lse[0, :2], -np.inf)
    s = 2 / math.sqrt(2)
    _allclose(lse[0, 2], math.log(E(s) + E(1.0)))
    _allclose(out[0, 2], 7 * E(s) / (E(s) + E(1.0)))


def test_hand_lse_minus_inf_for_no_keys_S0():
    out, lse = reference.attention(np.ones((2, 3, 4)), np.ones((2, 0, 4)), np.ones((2, 0, 5)),
                                   sinks=[0.0, 1.0], return_lse=True)
    assert out.shape == (2, 3, 5) and lse.shape == (2, 3)
    np.testing.assert_array_equal(out, 0)
    np.testing.assert_array_equal(lse, -np.inf)


def test_window_hidden_keys_with_nan_do_not_leak():
    q = np.ones((1, 3, 2))
    k = np.ones((1, 3, 2))
    v = np.array([[[1.0, 1.0], [2.0, 2.0], [np.nan, np.inf]]])
    k[0, 2] = np.nan
    out = reference.attention(q, k, v, window=(1, 0), alibi_slopes=[1.0], softcap=3.0,
                              sinks=[0.0])
    assert np.isfinite(out[0, :2]).all()
    assert np.isnan(out[0, 2]).all()          # row 2 sees key 2, whose score is NaN


def test_nan_score_makes_row_nan_with_sinks_and_lse():
    q, k = np.ones((1, 1, 1)), np.array([[[np.nan], [1.0]]])
    out, w, lse = reference.attention(q, k, k, sinks=[0.0], return_weights=True,
                                      return_lse=True)
    assert np.isnan(w).all() and np.isnan(out).all() and np.isnan(lse).all()


def test_return_order_out_weights_lse():
    x = np.eye(3)[None]
    res = reference.attention(x, x, x, return_weights=True, return_lse=True)
    assert len(res) == 3
    assert [a.shape for a in res] == [(1, 3, 3), (1, 3, 3), (1, 3)]
    res = reference.attention(x, x, x, return_lse=True)
    assert len(res) == 2 and res[1].shape == (1, 3)


@pytest.mark.parametrize("dtype, lse_dtype", [(np.float16, np.float32), (np.float32, np.float32),
                                              (np.float64, np.float64), (np.int64, np.float64)])
def test_lse_dtype_float32_for_half_and_single_float64_for_double(dtype, lse_dtype):
    x = np.ones((2, 3, 4), dtype=dtype)
    out, lse = reference.attention(x, x, x, sinks=[0.0, 1.0], alibi_slopes=[0.1, 0.2],
                                   softcap=2.0, window=1, return_lse=True)
    assert lse.dtype == lse_dtype
    assert out.dtype == (np.float64 if dtype == np.int64 else dtype)


def test_lse_per_batch_and_head_slopes_and_sinks_shapes():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 6, 5))
    slopes = rng.uniform(0, 1, (2, 3))
    out, lse = reference.attention(q, k, k, alibi_slopes=slopes, sinks=0.5, return_lse=True)
    for n in range(2):
        o, s = reference.attention(q[n], k[n], k[n], alibi_slopes=slopes[n], sinks=[0.5] * 3,
                                   return_lse=True)
        _allclose(out[n], o)
        _allclose(lse[n], s)


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------

@st.composite
def problems(draw, *, min_L=0, min_S=0):
    """A small random (q, k, v) of shape (H, L, E), (H, S, E), (H, S, Ev)."""
    H = draw(st.integers(1, 3))
    L = draw(st.integers(min_L, 5))
    S = draw(st.integers(min_S, 6))
    Ed = draw(st.integers(1, 4))
    Ev = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = (2 * rng.standard_normal((H, L, Ed))).astype(dtype)
    k = (2 * rng.standard_normal((H, S, Ed))).astype(dtype)
    v = rng.standard_normal((H, S, Ev)).astype(dtype)
    return q, k, v, rng


def _tol(dtype):
    return 2e-5 if np.dtype(dtype) != np.float64 else 1e-12


windows = st.one_of(st.none(), st.integers(0, 6),
                    st.tuples(st.one_of(st.none(), st.integers(0, 6)),
                              st.one_of(st.none(), st.integers(0, 6))))
causals = st.sampled_from([False, True, "upper_left", "lower_right"])


def _everything(q, k, v, **kw):
    """(out, weights, lse) of the reference."""
    return reference.attention(q, k, v, return_weights=True, return_lse=True, **kw)


def _assert_same(a, b, tol=None):
    """Each of the results a and b equal, bitwise or to within tol."""
    for x, y in zip(a, b):
        if tol is None:
            np.testing.assert_array_equal(x, y)
        else:
            _allclose(x, y, rtol=tol, atol=tol)


@settings(max_examples=examples(60))
@given(problems(), causals)
def test_window_none_none_equals_no_window(prob, causal):
    q, k, v, _ = prob
    _assert_same(_everything(q, k, v, is_causal=causal),
                 _everything(q, k, v, is_causal=causal, window=(None, None)))


@settings(max_examples=examples(60))
@given(problems(), causals)
def test_window_larger_than_L_plus_S_equals_no_window(prob, causal):
    q, k, v, _ = prob
    big = q.shape[-2] + k.shape[-2]
    _assert_same(_everything(q, k, v, is_causal=causal),
                 _everything(q, k, v, is_causal=causal, window=(big, big)))


@settings(max_examples=examples(60))
@given(problems())
def test_causal_upper_left_equals_window_none_0(prob):
    q, k, v, _ = prob
    w = _everything(q, k, v, window=(None, 0))
    _assert_same(_everything(q, k, v, is_causal=True), w)
    _assert_same(_everything(q, k, v, is_causal="upper_left"), w)


@settings(max_examples=examples(60))
@given(problems())
def test_causal_lower_right_equals_window_none_0_aligned_lower_right(prob):
    q, k, v, _ = prob
    L, S = q.shape[-2], k.shape[-2]
    c = _everything(q, k, v, is_causal="lower_right")
    _assert_same(c, _everything(q, k, v, is_causal="lower_right", window=(None, 0)))
    if S >= L:   # the same mask from a window aligned at p(i) = i
        _assert_same(c, _everything(q, k, v, window=(None, S - L)))


@settings(max_examples=examples(60))
@given(problems(), causals, windows)
def test_sinks_minus_inf_equals_no_sinks(prob, causal, window):
    q, k, v, _ = prob
    no_sink = np.full(q.shape[0], -np.inf)
    _assert_same(_everything(q, k, v, is_causal=causal, window=window),
                 _everything(q, k, v, is_causal=causal, window=window, sinks=no_sink),
                 tol=_tol(q.dtype))


@settings(max_examples=examples(60))
@given(problems(), causals)
def test_softcap_huge_matches_no_softcap(prob, causal):
    q, k, v, _ = prob
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    _assert_same(_everything(q, k, v, is_causal=causal),
                 _everything(q, k, v, is_causal=causal, softcap=1e7), tol=1e-9)


def _logits64(q, k, scale, causal, window, slopes, cap):
    """Independent float64 logits and hidden mask, one entry at a time."""
    H, L, S = q.shape[0], q.shape[1], k.shape[1]
    left, right = (window, window) if window is None or isinstance(window, int) else window
    s = np.empty((H, L, S))
    hidden = np.empty((H, L, S), bool)
    for h, i, j in np.ndindex(H, L, S):
        x = scale * sum(float(a) * float(b) for a, b in zip(q[h, i], k[h, j]))
        if cap is not None:
            x = cap * math.tanh(x / cap)
        p = i + S - L if causal == "lower_right" else i
        if slopes is not None:
            x -= slopes[h] * abs(p - j)
        s[h, i, j] = x
        hidden[h, i, j] = ((bool(causal) and j > p) or (left is not None and j < p - left)
                           or (right is not None and j > p + right))
    return s, hidden


@settings(max_examples=examples(80))
@given(problems(), causals, windows, st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([None, 0.5, 1.3]))
def test_lse_is_log_of_softmax_denominator_and_out_is_exp_of_logit_minus_lse(
        prob, causal, window, use_slopes, use_cap, use_sinks, scale):
    q, k, v, rng = prob
    H, L, E_ = q.shape
    slopes = rng.uniform(-0.5, 1.0, H) if use_slopes else None
    cap = float(rng.uniform(0.5, 4.0)) if use_cap else None
    sinks = rng.uniform(-2, 2, H) if use_sinks else None
    out, w, lse = reference.attention(q, k, v, is_causal=causal, window=window, scale=scale,
                                      alibi_slopes=slopes, softcap=cap, sinks=sinks,
                                      return_weights=True, return_lse=True)
    sc = 1 / math.sqrt(E_) if scale is None else scale
    s, hidden = _logits64(q, k, sc, causal, window, slopes, cap)
    terms = np.where(hidden, -np.inf, s)
    if sinks is not None:
        terms = np.concatenate([terms, np.broadcast_to(sinks[:, None, None], (H, L, 1))], -1)
    dead = hidden.all(axis=-1)
    # no key and no sink: every row is dead (SciPy before 1.11 refuses an empty axis)
    expected = (np.full((H, L), -np.inf) if terms.shape[-1] == 0
                else np.where(dead, -np.inf, scipy.special.logsumexp(terms, axis=-1)))
    t = _tol(q.dtype)
    assert lse.shape == (H, L)
    np.testing.assert_array_equal(lse == -np.inf, dead)
    live = ~dead
    _allclose(lse[live], expected[live], rtol=t, atol=t)
    ew = np.where(hidden | dead[..., None], 0, np.exp(s - np.where(dead, 0, expected)[..., None]))
    _allclose(w, ew, rtol=10 * t, atol=10 * t)
    _allclose(out, ew @ v.astype(np.float64), rtol=10 * t, atol=10 * t)


# ---------------------------------------------------------------------------
# varlen
# ---------------------------------------------------------------------------

@st.composite
def packed(draw):
    n = draw(st.integers(0, 4))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 2))
    lq = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    lk = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    cdt = draw(st.sampled_from([np.int32, np.int64]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(cdt)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(cdt)
    q = rng.standard_normal((int(cq[-1]), H, 3)).astype(dtype)
    k = rng.standard_normal((int(ck[-1]), Hkv, 3)).astype(dtype)
    v = rng.standard_normal((int(ck[-1]), Hkv, 2)).astype(dtype)
    return q, k, v, cq, ck, rng


@settings(max_examples=examples(60))
@given(packed(), causals, windows, st.booleans(), st.booleans(), st.booleans())
def test_varlen_equals_per_sequence_calls(pk, causal, window, per_seq_slopes, use_cap,
                                          use_sinks):
    q, k, v, cq, ck, rng = pk
    n, H, Hkv = len(cq) - 1, q.shape[1], k.shape[1]
    slopes = rng.uniform(0, 1, (n, H) if per_seq_slopes else (H,))
    cap = 1.5 if use_cap else None
    sinks = rng.uniform(-1, 1, H) if use_sinks else None
    out, lse = reference.attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window,
                                          alibi_slopes=slopes, softcap=cap, sinks=sinks,
                                          return_lse=True)
    assert out.shape == (q.shape[0], H, 2) and out.dtype == q.dtype
    assert lse.shape == (H, q.shape[0])
    rep = H // Hkv
    for b in range(n):
        r = slice(int(cq[b]), int(cq[b + 1]))
        c = slice(int(ck[b]), int(ck[b + 1]))
        qb = q[r].transpose(1, 0, 2)
        kb = np.repeat(k[c].transpose(1, 0, 2), rep, axis=0)
        vb = np.repeat(v[c].transpose(1, 0, 2), rep, axis=0)
        o, s = reference.attention(qb, kb, vb, is_causal=causal, window=window,
                                   alibi_slopes=slopes[b] if per_seq_slopes else slopes,
                                   softcap=cap, sinks=sinks, return_lse=True)
        np.testing.assert_array_equal(out[r], o.transpose(1, 0, 2))
        np.testing.assert_array_equal(lse[:, r], s)


def test_varlen_empty_key_sequence_gives_zeros_and_lse_minus_inf():
    q = np.ones((3, 2, 4))
    k = np.ones((2, 1, 4))
    cq = np.array([0, 2, 3], np.int32)
    ck = np.array([0, 0, 2], np.int32)
    out, lse = reference.attention_varlen(q, k, k, cq, ck, return_lse=True)
    np.testing.assert_array_equal(out[:2], 0)
    np.testing.assert_array_equal(lse[:, :2], -np.inf)
    _allclose(out[2], 1.0)
    _allclose(lse[:, 2], 4 / 2 + math.log(2))     # two keys with logit q.k / sqrt(4) = 2


def test_varlen_single_sequence_equals_attention_without_lse():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((4, 2, 3)), rng.standard_normal((5, 2, 3))
    out = reference.attention_varlen(q, k, k, [0, 4], [0, 5], is_causal="lower_right")
    whole = reference.attention(q.transpose(1, 0, 2), k.transpose(1, 0, 2),
                                k.transpose(1, 0, 2), is_causal="lower_right")
    np.testing.assert_array_equal(out, whole.transpose(1, 0, 2))


# ---------------------------------------------------------------------------
# bad input: each raises the documented error, naming the argument
# ---------------------------------------------------------------------------

X = np.ones((2, 3, 4))


@pytest.mark.parametrize("window, exc", [
    pytest.param(True, TypeError, id="bool"),
    pytest.param((1, False), TypeError, id="bool-right"),
    pytest.param(1.5, TypeError, id="non-integer"),
    pytest.param((2.0, 1), TypeError, id="float-left"),
    pytest.param("2", TypeError, id="string"),
    pytest.param(-1, ValueError, id="negative"),
    pytest.param((0, -2), ValueError, id="negative-right"),
    pytest.param(float("inf"), ValueError, id="non-finite-inf"),
    pytest.param((None, float("nan")), ValueError, id="non-finite-nan"),
    pytest.param((1, 2, 3), ValueError, id="three-sizes"),
])
def test_bad_window_raises_naming_window(window, exc):
    with pytest.raises(exc, match="window"):
        reference.attention(X, X, X, window=window)


@pytest.mark.parametrize("softcap, exc", [
    pytest.param(0.0, ValueError, id="zero"),
    pytest.param(-1.0, ValueError, id="negative"),
    pytest.param(float("nan"), ValueError, id="non-finite-nan"),
    pytest.param(float("inf"), ValueError, id="non-finite-inf"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param("1", TypeError, id="string"),
])
def test_bad_softcap_raises_naming_softcap(softcap, exc):
    with pytest.raises(exc, match="softcap"):
        reference.attention(X, X, X, softcap=softcap)


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
@pytest.mark.parametrize("values", [
    pytest.param(np.ones(3), id="too-many-heads"),
    pytest.param(np.ones((3, 2)), id="extra-batch-axis"),
    pytest.param(np.ones((2, 1, 1)), id="trailing-axes"),
])
def test_per_head_wrong_shape_raises_naming_argument_and_shapes(name, values):
    shape = re.escape(str(values.shape))
    with pytest.raises(ValueError, match=rf"{name} of shape {shape}.*\(2,\)"):
        reference.attention(X, X, X, **{name: values})


@pytest.mark.parametrize("name, bad", [
    ("alibi_slopes", np.nan), ("alibi_slopes", np.inf), ("alibi_slopes", -np.inf),
    ("sinks", np.nan), ("sinks", np.inf),
])
def test_per_head_non_finite_raises_naming_argument(name, bad):
    with pytest.raises(ValueError, match=name):
        reference.attention(X, X, X, **{name: [0.0, bad]})


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
def test_per_head_bool_dtype_raises_type_error(name):
    with pytest.raises(TypeError, match=name):
        reference.attention(X, X, X, **{name: [True, False]})


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
def test_per_head_without_head_axis_raises(name):
    x2 = np.ones((3, 4))
    with pytest.raises(ValueError, match=name):
        reference.attention(x2, x2, x2, **{name: 0.5})


Q, K = np.ones((5, 2, 3)), np.ones((4, 1, 3))


@pytest.mark.parametrize("cq, ck, name", [
    pytest.param([0, 3, 2, 5], [0, 1, 2, 4], "cu_seqlens_q", id="q-not-monotone"),
    pytest.param([0, 2, 5], [0, 1, 3], "cu_seqlens_k", id="k-wrong-end"),
    pytest.param([1, 2, 5], [0, 1, 4], "cu_seqlens_q", id="q-not-starting-at-0"),
    pytest.param([0, 2, 6], [0, 1, 4], "cu_seqlens_q", id="q-wrong-end"),
    pytest.param([0, 2, 5], [0, 1, 2, 4], "cu_seqlens", id="length-mismatch"),
    pytest.param(np.array([0, 2, 5], np.float64), [0, 1, 4], "cu_seqlens_q", id="float-dtype"),
    pytest.param([0, 2, 5], np.array([0, 1, 4], np.uint32), "cu_seqlens_k", id="uint32-dtype"),
    pytest.param(np.array([[0, 2, 5]]), [0, 1, 4], "cu_seqlens_q", id="two-dimensional"),
    pytest.param(np.array([], np.int64), [0, 4], "cu_seqlens_q", id="empty"),
])
def test_varlen_bad_cu_seqlens_raise_naming_the_array(cq, ck, name):
    cq = np.asarray(cq) if isinstance(cq, np.ndarray) else np.asarray(cq, np.int32)
    ck = np.asarray(ck) if isinstance(ck, np.ndarray) else np.asarray(ck, np.int64)
    with pytest.raises(ValueError, match=name):
        reference.attention_varlen(Q, K, K, cq, ck)


def test_varlen_bad_shapes_raise():
    cq, ck = np.array([0, 5]), np.array([0, 4])
    with pytest.raises(ValueError, match="multiple"):
        reference.attention_varlen(np.ones((5, 3, 3)), np.ones((4, 2, 3)), np.ones((4, 2, 3)),
                                   cq, ck)
    with pytest.raises(ValueError, match="query"):
        reference.attention_varlen(np.ones((5, 3)), K, K, cq, ck)
    with pytest.raises(ValueError, match="value"):
        reference.attention_varlen(Q, K, np.ones((3, 1, 3)), cq, ck)
    with pytest.raises(ValueError, match=r"alibi_slopes of shape \(3,\).*\(1, 2\)"):
        reference.attention_varlen(Q, K, K, cq, ck, alibi_slopes=np.ones(3))
