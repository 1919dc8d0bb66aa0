"""Odd but valid input to fastattn.attention and fastattn.softmax: zero-size
dimensions, scale 0 and scales near the dtype's maximum, additive masks of
finfo.min, NaN and Inf entries.  The result is what fastattn.reference gives
(NaN where it has NaN).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference
from api_common import OS, SENTINEL, _qkv


def _check_reference(q, k, v, mask=None, **kw):
    """Both paths agree with the reference (NaN where it has NaN)."""
    exp_o, exp_w = reference.attention(q, k, v, mask, return_weights=True, **kw)
    o, w = fastattn.attention(q, k, v, mask, return_weights=True, **kw)
    o2 = fastattn.attention(q, k, v, mask, **kw)
    tol = 2e-5 if o.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(w, exp_w, rtol=tol, atol=tol, equal_nan=True)
    np.testing.assert_allclose(o, exp_o, rtol=tol, atol=tol * 10, equal_nan=True)
    np.testing.assert_allclose(o2, exp_o, rtol=tol, atol=tol * 10, equal_nan=True)
    assert np.array_equal(np.isnan(o), np.isnan(exp_o))
    assert np.array_equal(np.isnan(o2), np.isnan(exp_o))
    return o, w


# ---------------------------------------------------------------------------
# zero-size dimensions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("rw", [False, True], ids=["streaming", "weights"])
def test_batch_zero_gives_empty_result(rw):
    q, k, v = _qkv()
    res = fastattn.attention(q[:0], k[:0], v[:0], return_weights=rw)
    o = res[0] if rw else res
    assert o.shape == (0, 3, 6) and o.dtype == np.float64
    if rw:
        assert res[1].shape == (0, 3, 5)


@pytest.mark.parametrize("rw", [False, True], ids=["streaming", "weights"])
def test_L_zero_gives_empty_result(rw):
    q, k, v = _qkv()
    res = fastattn.attention(q[:, :0], k, v, return_weights=rw, is_causal=True)
    o = res[0] if rw else res
    assert o.shape == (2, 0, 6)
    if rw:
        assert res[1].shape == (2, 0, 5)


@pytest.mark.parametrize("rw", [False, True], ids=["streaming", "weights"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_S_zero_gives_zero_output(rw, dtype):
    """No key at all: every row has no visible key -> zero output."""
    q, k, v = _qkv(dtype)
    out = np.full(OS, SENTINEL, dtype)
    res = fastattn.attention(q, k[:, :0], v[:, :0], return_weights=rw, out=out)
    o = res[0] if rw else res
    assert o is out and np.all(out == 0)
    if rw:
        assert res[1].shape == (2, 3, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_E_zero_gives_uniform_weights(dtype):
    """Zero features: every score is 0, the weights are uniform over the
    visible keys and the output is the mean of their values."""
    q, k, v = _qkv(dtype)
    o, w = fastattn.attention(q[..., :0], k[..., :0], v, return_weights=True, is_causal=True)
    exp_w = np.tril(np.ones((3, 5))) / np.arange(1, 4)[:, None]
    np.testing.assert_allclose(w, np.broadcast_to(exp_w, (2, 3, 5)), rtol=1e-6)
    exp_o = np.stack([np.cumsum(v[:, :3], axis=1)[:, i] / (i + 1) for i in range(3)], axis=1)
    np.testing.assert_allclose(o, exp_o, rtol=1e-5, atol=1e-6)
    o2 = fastattn.attention(q[..., :0], k[..., :0], v, is_causal=True)
    np.testing.assert_allclose(o2, exp_o, rtol=1e-5, atol=1e-6)


def test_Ev_zero_gives_empty_output_and_correct_weights():
    q, k, v = _qkv()
    o, w = fastattn.attention(q, k, v[..., :0], return_weights=True, is_causal=True)
    assert o.shape == (2, 3, 0)
    _, exp_w = reference.attention(q, k, v[..., :0], return_weights=True, is_causal=True)
    np.testing.assert_allclose(w, exp_w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gqa", [False, True], ids=["heads", "grouped_heads"])
def test_Ev_zero_still_gives_each_rows_lse(gqa):
    """An empty output, but every row's log-sum-exp is computed (merging and
    the backward need it)."""
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((2, 2 if gqa else 4, 9, 5))
    o, lse = fastattn.attention(q, k, k[..., :0], is_causal="lower_right", enable_gqa=gqa,
                                return_lse=True)
    kk = np.repeat(k, 2, axis=1) if gqa else k
    _, want = reference.attention(q, kk, kk[..., :0], is_causal="lower_right", return_lse=True)
    assert o.shape == (2, 4, 6, 0)
    np.testing.assert_allclose(lse, want, rtol=1e-13, atol=0)


def test_every_dimension_zero():
    z = np.zeros((0, 0, 0))
    assert fastattn.attention(z, z, z).shape == (0, 0, 0)


# ---------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_zero_gives_uniform_weights_over_visible_keys(dtype):
    q, k, v = _qkv(dtype)
    kpm = np.array([[False, True, False, False, False], [False] * 5])
    o, w = fastattn.attention(q, k, v, is_causal=True, key_padding_mask=kpm, scale=0.0,
                              return_weights=True)
    vis = np.tril(np.ones((3, 5), bool))[None] & ~kpm[:, None, :]
    exp_w = vis / vis.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, exp_w, rtol=1e-6, atol=0)
    assert np.all(w[~vis] == 0)
    _check_reference(q, k, v, is_causal=True, key_padding_mask=kpm, scale=0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_near_dtype_max_whose_log2e_multiple_overflows_as_reference(dtype):
    """The streaming path works in log2 units (Q times scale * log2(e)); a
    scale that is finite but whose log2(e) multiple overflows the dtype must
    still give the reference's (finite) answer."""
    big = float(np.finfo(dtype).max) * 0.9   # * log2(e) > max
    q, k, v = _qkv(dtype)
    q = q * dtype(1.0 / big) * dtype(4.0)        # scale * q of order 1
    o = fastattn.attention(q, k, v, scale=big)
    exp_o = reference.attention(q, k, v, scale=big)
    assert np.all(np.isfinite(o))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(o, exp_o, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_additive_mask_of_dtype_min_on_whole_rows_gives_uniform_weights(dtype, causal):
    """A row whose every key has the additive mask finfo.min (a common
    stand-in for -inf) has finite, equal scores: uniform weights over its
    visible keys, as the reference and torch -- not a hidden row (zeros), which
    scaling the mask into log2 units would make of it (-FLT_MAX * log2(e) =
    -inf)."""
    q, k, v = _qkv(dtype)
    m = np.zeros((3, 5), dtype)
    m[1, :] = np.finfo(dtype).min
    o = _check_reference(q, k, v, m, is_causal=causal)[0]
    nvis = 2 if causal else 5
    np.testing.assert_allclose(o[:, 1], v[:, :nvis].mean(axis=1),
                               rtol=1e-5 if dtype == np.float32 else 1e-12)


# ---------------------------------------------------------------------------
# inf and NaN in the inputs: as the reference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("where", ["query", "key", "value", "hidden_key", "hidden_value",
                                   "mask"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_inf_and_nan_in_inputs_as_reference(dtype, where, bad):
    q, k, v = _qkv(dtype, qs=(2, 40, 8), ks=(2, 70, 8), vs=(2, 70, 5), seed=3)
    mask = np.zeros((40, 70), dtype)
    kpm = np.zeros(70, bool)
    kpm[60:] = True
    if where == "query":
        q[0, 7, 2] = bad
    elif where == "key":
        k[1, 13, 0] = bad
    elif where == "value":
        v[0, 21, 4] = bad
    elif where == "hidden_key":
        k[:, 65, 1] = bad           # padding: must have no influence
    elif where == "hidden_value":
        v[:, 66, :] = bad           # padding: must have no influence
    else:
        mask[5, 9] = bad
        mask[6, :] = -np.inf         # a row with nothing visible
    o, _ = _check_reference(q, k, v, mask, key_padding_mask=kpm, is_causal="lower_right")
    if where.startswith("hidden"):
        assert np.isfinite(o).all()


def test_nan_in_float_attn_mask_as_reference():
    q, k, v = _qkv()
    m = np.zeros((3, 5))
    m[1, 2] = np.nan
    o, _ = _check_reference(q, k, v, m)
    assert np.isnan(o[:, 1]).all() and np.isfinite(o[:, [0, 2]]).all()


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------

def test_softmax_zero_size_gives_empty_result():
    for shape in [(0,), (3, 0), (0, 4)]:
        for axis in (None, -1, 0):
            r = fastattn.softmax(np.zeros(shape), axis=axis)
            assert r.shape == shape and r.dtype == np.float64


def test_softmax_zero_dim_input():
    assert fastattn.softmax(np.float64(3.0)) == 1.0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # from scipy, in the reference
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_softmax_inf_and_nan_as_reference(bad):
    x = np.random.default_rng(4).standard_normal((5, 7))
    x[2, 3] = bad
    x[4, :] = -np.inf
    m = np.ones((5, 7), bool)
    m[1, 3] = False
    for axis in (-1, 0, None):
        for mask in (None, m):
            got = fastattn.softmax(x, axis=axis, mask=mask)
            exp = reference.softmax(x, axis=axis, mask=mask)
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-15, equal_nan=True)
