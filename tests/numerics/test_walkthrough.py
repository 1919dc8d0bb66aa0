"""The attention walkthrough's 3-token example (the one fastattn.trace shows), as a test.

Q = K = V = X = [[1, 0], [0, 1], [1, 1]] (tokens A, B, C), d_k = 2, so the
scaled scores are [[.7071, 0, .7071], [0, .7071, .7071], [.7071, .7071, 1.4142]].

The expected values below are the true ones to 3 decimals (computed, not copied
from the text, which rounds intermediate values and misprints the causal row
of token B as [0.50, 0.50, 0]: it is softmax([0, 0.7071]) = [0.330, 0.670]).
Every expected value is within 5e-4 of the exact one, so the comparison uses
atol = 6e-4 (plus the dtype's own tolerance).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference
from conftest import tol_for

X = np.array([[1, 0], [0, 1], [1, 1]])

# softmax(scores) rows, exact to 3 decimals
W_UNMASKED = np.array([
    [0.401, 0.198, 0.401],   # A: e^.7071 = 2.028; 2.028 / 5.056
    [0.198, 0.401, 0.401],   # B
    [0.248, 0.248, 0.503],   # C: 2.028 / 8.170, 4.113 / 8.170
])
OUT_UNMASKED = np.array([
    [0.802, 0.599],          # A: .401*(1,0) + .198*(0,1) + .401*(1,1)
    [0.599, 0.802],          # B
    [0.752, 0.752],          # C
])
W_CAUSAL = np.array([
    [1.000, 0.000, 0.000],   # A sees only itself
    [0.330, 0.670, 0.000],   # B: softmax([0, .7071]) -- NOT [0.50, 0.50, 0]
    [0.248, 0.248, 0.503],   # C: unchanged, it is the last position
])
OUT_CAUSAL = np.array([
    [1.000, 0.000],
    [0.330, 0.670],
    [0.752, 0.752],
])

ATOL = 6e-4


def _check(actual, expected, dtype):
    assert actual.dtype == np.dtype(dtype)
    np.testing.assert_allclose(actual.astype(np.float64), expected,
                               rtol=0, atol=ATOL + 2 * tol_for(dtype))


def test_expected_values_are_the_true_values():
    """The constants above, re-derived from first principles."""
    s = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 2]]) / math.sqrt(2)
    w = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(w, W_UNMASKED, atol=5e-4)
    np.testing.assert_allclose(w @ X, OUT_UNMASKED, atol=5e-4)
    sb = s[1, :2]
    wb = np.exp(sb) / np.exp(sb).sum()
    np.testing.assert_allclose(wb, [0.330, 0.670], atol=5e-4)
    # the reference agrees
    o, w_ref = reference.attention(X, X, X, is_causal=True, return_weights=True)
    np.testing.assert_allclose(w_ref, W_CAUSAL, atol=5e-4)
    np.testing.assert_allclose(o, OUT_CAUSAL, atol=5e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_walkthrough_unmasked(dtype):
    x = X.astype(dtype)
    out, w = fastattn.attention(x, x, x, return_weights=True)
    _check(w, W_UNMASKED, dtype)
    _check(out, OUT_UNMASKED, dtype)
    # every row is a probability distribution
    np.testing.assert_allclose(w.astype(np.float64).sum(axis=-1), 1.0, atol=4 * tol_for(dtype))
    # without weights, the same output
    _check(fastattn.attention(x, x, x), OUT_UNMASKED, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("is_causal", [True, "upper_left", "lower_right"])
def test_walkthrough_causal(dtype, is_causal):
    """L == S, so every causal alignment is the same triangle."""
    x = X.astype(dtype)
    out, w = fastattn.attention(x, x, x, is_causal=is_causal, return_weights=True)
    _check(w, W_CAUSAL, dtype)
    _check(out, OUT_CAUSAL, dtype)
    # the future is hidden exactly, not approximately
    assert w[0, 1] == 0 and w[0, 2] == 0 and w[1, 2] == 0
    # token B is not the misprinted [0.50, 0.50, 0]
    assert abs(float(w[1, 0]) - 0.5) > 0.1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_walkthrough_causal_as_additive_mask(dtype):
    """The text's M: an upper triangle of -inf added before softmax."""
    x = X.astype(dtype)
    M = np.triu(np.full((3, 3), -np.inf), k=1).astype(dtype)
    out, w = fastattn.attention(x, x, x, attn_mask=M, return_weights=True)
    _check(w, W_CAUSAL, dtype)
    _check(out, OUT_CAUSAL, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_walkthrough_causal_as_bool_mask(dtype):
    x = X.astype(dtype)
    keep = np.tril(np.ones((3, 3), dtype=bool))
    out, w = fastattn.attention(x, x, x, attn_mask=keep, return_weights=True)
    _check(w, W_CAUSAL, dtype)
    _check(out, OUT_CAUSAL, dtype)


def test_walkthrough_int_input_gives_float64():
    out, w = fastattn.attention(X, X, X, is_causal=True, return_weights=True)
    _check(w, W_CAUSAL, np.float64)
    _check(out, OUT_CAUSAL, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_walkthrough_padding_or_causal(dtype):
    """'Padding masks combine with causal masks via logical OR': pad token C."""
    x = X.astype(dtype)
    out, w = fastattn.attention(x, x, x, is_causal=True, return_weights=True,
                                key_padding_mask=np.array([False, False, True]))
    # C's query (1,1) scores A and B equally (0.7071 each): [0.5, 0.5, 0]
    expected_w = np.array([[1, 0, 0], [0.330, 0.670, 0], [0.5, 0.5, 0]])
    expected_o = np.array([[1, 0], [0.330, 0.670], [0.5, 0.5]])
    _check(w, expected_w, dtype)
    _check(out, expected_o, dtype)
    assert np.all(w[:, 2] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_walkthrough_drill_change_token_b(dtype):
    """The text's drill: B = (1, 1).  Recomputed exactly here."""
    x = np.array([[1, 0], [1, 1], [1, 1]], dtype=dtype)
    s = (x.astype(np.float64) @ x.T.astype(np.float64)) / math.sqrt(2)
    w = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    out, w_got = fastattn.attention(x, x, x, return_weights=True)
    np.testing.assert_allclose(w_got, w, atol=4 * tol_for(dtype))
    np.testing.assert_allclose(out, w @ x.astype(np.float64), atol=4 * tol_for(dtype))
    # A's row: [e^.7071, e^.7071, e^.7071] -> uniform
    np.testing.assert_allclose(w_got[0], [1 / 3] * 3, atol=4 * tol_for(dtype))
