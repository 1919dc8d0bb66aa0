"""fastattn.attention_backward against fastattn.reference.attention_backward
(float64), on every ISA path the machine has.

Error bounds.  float64: each gradient entry is a sum of at most
``n = max(L, S)`` products of a weight, a score difference and an input,
each of those itself a dot product over ``E`` or ``Ev``; a forward error
analysis gives ``|error| <= c (n + E + Ev) u max|g|`` with ``u = 2**-53``
and a small constant c; 1e-12 of ``max|g|`` is far above that for these
sizes and still catches any wrong term.  float32: the same analysis with
``u = 2**-24``, plus the forward's float32 ``lse`` (relative error ``u`` per
weight); so the bound is ``4 (n + E + Ev) u max|g|``.  float16 / bfloat16:
inputs are read exactly and the arithmetic is float32 (the bound above),
then three roundings to the 16-bit ``u16`` (2**-11, 2**-8): the gradient's
own (``u16 |g|``), and the forward's rounded ``out`` and the caller's 16-bit
``grad_out`` entering ``D = dO . O`` (each below ``u16 |g|`` in effect):
``3 u16 max|g|`` more.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference
from backward_common import grad_bound as _bound
from half_common import HALF_IDS, HALVES

OPTIONS = {
    "plain": {},
    "causal_upper_left": {"is_causal": True},
    "causal_lower_right": {"is_causal": "lower_right"},
    "window": {"window": (9, 4)},
    "window_causal": {"window": (20, None), "is_causal": True},
    "softcap": {"softcap": 1.5},
    "alibi": {"alibi_slopes": np.array([0.05, 0.02])},
    "sinks": {"sinks": np.array([0.3, -0.7])},
    "key_padding_mask": {"key_padding_mask": np.arange(150) % 7 == 3},
    "bool_mask": {"attn_mask": np.tri(70, 150, 40, dtype=bool)},
    "additive_mask": {"attn_mask": np.linspace(-2, 2, 70 * 150).reshape(70, 150)},
    "all": {"is_causal": "lower_right", "window": (60, None), "softcap": 2.0,
            "alibi_slopes": np.array([0.1, 0.05]), "sinks": np.array([0.1, 0.9])},
}


def _inputs(rng, shape_q, shape_k, Ev, dtype):
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal(shape_k[:-1] + (Ev,)).astype(dtype)
    return q, k, v


def _compare(q, k, v, *, grad_lse=False, threads=(None,), rng=None, **opts):
    """Run both backward passes on one forward and compare every gradient;
    fastattn's runs once per thread count, each bitwise the first."""
    rng = rng or np.random.default_rng(7)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(out.dtype)
    g = rng.standard_normal(lse.shape).astype(lse.dtype) if grad_lse else None
    got, *others = (fastattn.attention_backward(d_o, q, k, v, out, lse, grad_lse=g,
                                                num_threads=n, **opts) for n in threads)
    for n, other in zip(threads[1:], others):
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, other)), f"num_threads={n}"
    want = reference.attention_backward(d_o, q, k, v, out, lse, grad_lse=g, **opts)
    assert len(got) == len(want)
    n = max(q.shape[-2], k.shape[-2]) + q.shape[-1] + v.shape[-1]
    for name, a, b in zip(("grad_query", "grad_key", "grad_value", "grad_sinks"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert np.isfinite(a).all(), name
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
        assert err <= _bound(b, q.dtype, n), (name, err, _bound(b, q.dtype, n))
    return got


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_matches_reference(isa, name, dtype):
    q, k, v = _inputs(np.random.default_rng(1), (1, 2, 70, 5), (1, 2, 150, 5), 7, dtype)
    _compare(q, k, v, grad_lse=True, **OPTIONS[name])


@pytest.mark.parametrize("L,S,E,Ev", [(1, 1, 3, 2), (1, 300, 8, 8), (300, 1, 4, 6),
                                      (129, 257, 16, 3), (64, 128, 1, 1), (65, 129, 33, 17)],
                         ids=["L1_S1", "L1", "S1", "off_blocks_E_ne_Ev", "on_blocks_E1",
                              "one_past_blocks"])
def test_odd_shapes(isa, L, S, E, Ev):
    q, k, v = _inputs(np.random.default_rng(2), (2, L, E), (2, S, E), Ev, np.float64)
    _compare(q, k, v, grad_lse=True, is_causal="lower_right" if L <= S else False)


@pytest.mark.parametrize("L", [125, 126, 127, 128, 129, 253], ids=lambda L: f"L{L}")
def test_wide_heads_take_query_blocks_of_a_whole_key_block(isa, L):
    """E + Ev >= 256 switches to query blocks of FA_KC rows (rounded down to
    the tile's rows): lengths around them, causal with a window, in float32
    and float64, and bitwise the same for one and two threads."""
    for dt in (np.float64, np.float32):
        q, k, v = _inputs(np.random.default_rng(L), (1, 2, L, 160), (1, 2, 260, 160), 96, dt)
        opts = {"is_causal": "lower_right", "window": (200, None)}
        _compare(q, k, v, grad_lse=True, threads=(1, 2), **opts)


@pytest.mark.parametrize("E,Ev", [(0, 5), (6, 0), (0, 0)], ids=["E0", "Ev0", "E0_Ev0"])
@pytest.mark.parametrize("name", ["plain", "causal_lower_right", "sinks", "all"])
def test_empty_feature_axes_match_reference(isa, E, Ev, name):
    """E = 0 (every score 0 but for the options) or Ev = 0 (an empty output):
    the gradients that remain come through the weights and lse."""
    q, k, v = _inputs(np.random.default_rng(8), (1, 2, 70, E), (1, 2, 150, E), Ev, np.float64)
    _compare(q, k, v, grad_lse=True, **OPTIONS[name])


def test_grouped_query_heads_sum_into_their_kv_head(isa, dtype):
    q, k, v = _inputs(np.random.default_rng(3), (2, 6, 40, 8), (2, 2, 90, 8), 8, dtype)
    _compare(q, k, v, enable_gqa=True, is_causal=True, alibi_slopes=np.linspace(0.1, 0.6, 6),
             sinks=np.zeros(6), grad_lse=True)


def test_broadcast_batch_dims_are_summed(isa, dtype):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 1, 30, 8)).astype(dtype)       # broadcast over heads
    k = rng.standard_normal((1, 2, 50, 8)).astype(dtype)       # over the batch
    v = rng.standard_normal((2, 50, 4)).astype(dtype)          # a leading dim missing
    _compare(q, k, v, window=(10, 10), sinks=np.array([0.5, -0.5]), grad_lse=True)


def test_zero_dim_sinks_get_a_zero_dim_array_gradient():
    """One sink for every head, given as a NumPy scalar: its gradient is an
    array of shape () (not a NumPy scalar), the sum of the heads'."""
    q, k, v = _inputs(np.random.default_rng(5), (1, 2, 5, 4), (1, 2, 7, 4), 4, np.float64)
    out, lse = fastattn.attention(q, k, v, sinks=np.float64(0.3), return_lse=True)
    g = np.ones_like(out)
    got = fastattn.attention_backward(g, q, k, v, out, lse, sinks=np.float64(0.3))[3]
    wide = fastattn.attention_backward(g, q, k, v, out, lse, sinks=np.array([0.3, 0.3]))[3]
    assert type(got) is np.ndarray and got.shape == () and got.dtype == np.float64
    np.testing.assert_allclose(got, wide.sum(), rtol=1e-12)
    cu = np.array([0, 5])
    qv, kv, vv = (x[0].transpose(1, 0, 2) for x in (q, k, v))
    o, l = fastattn.attention_varlen(qv, kv, vv, cu, np.array([0, 7]), sinks=0.3,
                                     return_lse=True)
    d = fastattn.attention_varlen_backward(np.ones_like(o), qv, kv, vv, o, l, cu,
                                           np.array([0, 7]), sinks=np.float64(0.3))[3]
    assert type(d) is np.ndarray and d.shape == ()
    np.testing.assert_allclose(d, got, rtol=1e-12)


def test_key_padding_per_batch_and_bool_mask_per_head(isa):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, (2, 2, 33, 4), (2, 2, 140, 4), 5, np.float64)
    pad = rng.random((2, 140)) < 0.3
    mask = rng.random((2, 1, 33, 140)) < 0.6
    _compare(q, k, v, key_padding_mask=pad, attn_mask=mask)


def test_rows_with_nothing_visible_give_zero_gradients(isa):
    q, k, v = _inputs(np.random.default_rng(6), (2, 20, 4), (2, 30, 4), 4, np.float64)
    mask = np.ones((2, 20, 30), bool)
    mask[:, 3] = False                                   # row 3 sees nothing
    mask[1] = False                                      # batch 1 sees nothing at all
    dq, dk, dv = _compare(q, k, v, attn_mask=mask, grad_lse=True)
    assert not dq[:, 3].any() and not dq[1].any() and not dk[1].any() and not dv[1].any()


@pytest.mark.parametrize("softcap", [None, 2.0], ids=["no_softcap", "softcap"])
def test_nan_and_inf_in_hidden_keys_and_values_never_reach_a_gradient(isa, dtype, softcap):
    q, k, v = _inputs(np.random.default_rng(7), (1, 2, 40, 6), (1, 2, 160, 6), 6, dtype)
    pad = np.zeros(160, bool)
    pad[[5, 20, 21]] = True                              # seen by later rows but for the pad
    k[..., 5, :], v[..., 20, :], v[..., 21, 0] = np.nan, np.inf, -np.inf
    k[..., 150:, :] = np.inf                             # the future of every row (causal)
    v[..., 155, :] = np.nan
    got = _compare(q, k, v, key_padding_mask=pad, is_causal=True, grad_lse=True, softcap=softcap)
    dk, dv = got[1], got[2]
    assert not dk[..., [5, 20, 21, 150, 155], :].any()
    assert not dv[..., [5, 20, 21, 150, 155], :].any()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_16_bit_inputs_keep_their_dtype(isa, dt):
    q, k, v = _inputs(np.random.default_rng(8), (2, 2, 70, 16), (2, 2, 150, 16), 12, dt)
    got = _compare(q, k, v, is_causal=True, softcap=3.0, sinks=np.array([0.2, 0.1]),
                   grad_lse=True)
    assert [g.dtype for g in got[:3]] == [dt] * 3


def test_bitwise_identical_for_one_and_two_threads(isa, dtype):
    rng = np.random.default_rng(9)
    q, k, v = _inputs(rng, (2, 2, 200, 32), (2, 2, 300, 32), 24, dtype)
    opts = {"is_causal": "lower_right", "softcap": 4.0}
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(dtype)
    one = fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=1, **opts)
    two = fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=2, **opts)
    for a, b in zip(one, two):
        assert a.tobytes() == b.tobytes()


def test_integer_inputs_give_float64_gradients():
    q = np.arange(12).reshape(3, 4) % 3
    out, lse = fastattn.attention(q, q, q, return_lse=True)
    got = fastattn.attention_backward(np.ones_like(out), q, q, q, out, lse)
    want = reference.attention_backward(np.ones_like(out), q, q, q, out, lse)
    for a, b in zip(got, want):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_strided_and_reversed_inputs_are_read_in_place(isa, dtype):
    rng = np.random.default_rng(10)
    q = np.swapaxes(rng.standard_normal((2, 6, 70)).astype(dtype), -1, -2)   # column stride 70
    k = rng.standard_normal((2, 140, 12)).astype(dtype)[:, ::-1, ::2]        # negative rows
    v = np.asfortranarray(rng.standard_normal((2, 140, 5)).astype(dtype))
    _compare(q, k, v, is_causal="lower_right", alibi_slopes=np.array([0.1, 0.3]), grad_lse=True)


def test_nan_grad_out_on_a_row_with_nothing_visible_gives_zeros(isa):
    q, k, v = _inputs(np.random.default_rng(11), (1, 10, 4), (1, 12, 4), 3, np.float64)
    mask = np.ones((10, 12), bool)
    mask[2] = False
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True)
    d_o = np.ones_like(out)
    d_o[0, 2] = np.nan
    dq, dk, dv = fastattn.attention_backward(d_o, q, k, v, out, lse, mask)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert not dq[0, 2].any()


def test_nan_in_a_hidden_key_with_finite_values_gives_finite_gradients(isa, dtype):
    q, k, v = _inputs(np.random.default_rng(12), (1, 2, 30, 6), (1, 2, 140, 6), 5, dtype)
    pad = np.zeros(140, bool)
    pad[[3, 129]] = True
    k[..., 3, :], k[..., 129, 2] = np.nan, np.inf
    dk = _compare(q, k, v, key_padding_mask=pad, grad_lse=True)[1]
    assert not dk[..., [3, 129], :].any()


def test_forward_arrays_of_odd_byte_strides_give_the_same_bits(isa):
    """out, lse and grad_out as fields of structured arrays (strides not a
    whole number of elements): read as elements, not as truncated strides."""
    def field(a):
        rec = np.zeros(a.shape, dtype=[("pad", np.int16), ("x", a.dtype)])
        rec["x"] = a
        return rec["x"]
    rng = np.random.default_rng(9)
    for dt in (np.float32, np.float64):
        q, k, v = _inputs(rng, (2, 2, 30, 8), (2, 2, 50, 8), 6, dt)
        out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True)
        d_o = rng.standard_normal(out.shape).astype(dt)
        g_lse = rng.standard_normal(lse.shape).astype(lse.dtype)
        want = fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True, grad_lse=g_lse)
        got = fastattn.attention_backward(field(d_o), q, k, v, field(out), field(lse),
                                          is_causal=True, grad_lse=field(g_lse))
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("qs,ks,gqa", [((0, 2, 5, 4), (0, 2, 6, 4), False),
                                       ((2, 0, 5, 4), (2, 0, 6, 4), False),
                                       ((0, 5, 4), (2, 6, 4), True)],
                         ids=["batch0", "heads0", "query_heads0_of_two_kv_heads"])
def test_empty_batch_or_heads_give_empty_or_zero_gradients(qs, ks, gqa):
    q, k, v = np.ones(qs), np.ones(ks), np.ones(ks[:-1] + (3,))
    out, lse = fastattn.attention(q, k, v, enable_gqa=gqa, return_lse=True)
    grads = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse, enable_gqa=gqa)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert not any(g.any() for g in grads)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"], ids=["float32", "bfloat16"])
def test_scores_of_billions_give_finite_gradients(isa, dtype):
    """s - lse rounds above 0 by hundreds at scores of ~3e9: P is never
    above 1 (it had overflowed into Inf and NaN gradients).  The weights
    are one-hot, so dQ and dK are the scale times float32's rounding of
    dS (the reference's are 0)."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes").bfloat16
    rng = np.random.default_rng(10)
    q, k, v = _inputs(rng, (2, 40, 32), (2, 40, 32), 16, dtype)
    out, lse = fastattn.attention(q, k, v, scale=1e8, return_lse=True)
    grads = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse, scale=1e8)
    for g in grads:
        assert np.isfinite(g.astype(np.float32)).all()
    for g in grads[:2]:
        assert np.abs(g.astype(np.float32)).max() <= 1e-4 * 1e8
    assert np.abs(grads[2].astype(np.float32)).max() <= 40   # each dO row to one key
