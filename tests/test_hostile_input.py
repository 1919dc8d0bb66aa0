"""Hostile input: one named test per kind of bad (or merely odd) argument.

Errors are raised before anything is written (a given ``out`` keeps its
sentinel) and their message names the argument -- and, for shape errors, the
shapes.  Odd but valid input (zero-size dimensions, scale 0, NaN/Inf) gives
what :mod:`fastattn.reference` gives.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
import fastattn.reference as reference
from conftest import mentions_shape

SENTINEL = -12345.0
QS, KS, VS, OS = (2, 3, 4), (2, 5, 4), (2, 5, 6), (2, 3, 6)


def _qkv(dtype=np.float64, qs=QS, ks=KS, vs=VS, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))


def _raises(exc, names=(), shapes=(), *args, call=fastattn.attention, out_shape=OS,
            out_dtype=np.float64, **kwargs):
    """call(*args, **kwargs) with a sentinel out must raise exc, name every
    name, show every shape, and leave out alone."""
    out = None
    if out_shape is not None and "out" not in kwargs:
        out = kwargs["out"] = np.full(out_shape, SENTINEL, out_dtype)
    with pytest.raises(exc) as info:
        call(*args, **kwargs)
    msg = str(info.value)
    for n in names:
        assert n in msg, f"the message does not name {n!r}: {msg!r}"
    for s in shapes:
        assert mentions_shape(msg, s), f"the message does not show {s}: {msg!r}"
    if out is not None:
        assert np.all(out == SENTINEL), "out was written before the error"
    return msg


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
# shapes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_one_dimensional_input_raises_value_error(which):
    args = dict(zip(("query", "key", "value"), _qkv()))
    args[which] = args[which][0, 0]
    _raises(ValueError, [which], [args[which].shape], args["query"], args["key"], args["value"])


def test_scalar_query_raises_value_error():
    q, k, v = _qkv()
    _raises(ValueError, ["query", "()"], [], 1.0, k, v)


def test_key_feature_dim_mismatch_raises_value_error():
    q, k, v = _qkv()
    _raises(ValueError, ["key", "query"], [QS, (2, 5, 3)], q, k[..., :3], v)


def test_value_row_count_mismatch_raises_value_error():
    q, k, v = _qkv()
    _raises(ValueError, ["value", "key"], [KS, (2, 4, 6)], q, k, v[:, :4])


def test_batch_dims_do_not_broadcast_raises_value_error():
    q, k, v = _qkv()
    k3, v3 = np.concatenate([k, k[:1]]), np.concatenate([v, v[:1]])
    _raises(ValueError, ["query", "key"], [QS, (3, 5, 4), (3, 5, 6)], q, k3, v3)


def test_too_many_leading_dims_raises_value_error():
    nd = _core.MAX_BATCH_DIMS + 1
    q = np.ones((1,) * nd + (3, 4))
    k, v = np.ones((5, 4)), np.ones((5, 6))
    _raises(ValueError, ["dimensions"], [], q, k, v, out_shape=None)


def test_ragged_nested_list_raises_value_error():
    q, k, v = _qkv()
    with pytest.raises(ValueError):
        fastattn.attention([[1.0, 2.0], [3.0]], k, v)


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("bad", ["complex128", "complex64", "object", "U3", "S3",
                                 "datetime64[s]", "timedelta64[s]"])
def test_unsupported_input_dtype_raises_type_error(which, bad):
    args = dict(zip(("query", "key", "value"), _qkv()))
    args[which] = np.zeros(args[which].shape, dtype=bad)
    msg = _raises(TypeError, [which], [], args["query"], args["key"], args["value"])
    assert str(np.dtype(bad)) in msg


def test_complex_query_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["query", "complex128"], [], q + 1j, k, v)


def test_str_list_query_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["query"], [], [["a", "b", "c", "d"]] * 3, k, v)


def test_none_query_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["query"], [], None, k, v)


# ---------------------------------------------------------------------------
# out
# ---------------------------------------------------------------------------

def test_out_read_only_raises_value_error():
    q, k, v = _qkv()
    out = np.full(OS, SENTINEL)
    out.flags.writeable = False
    _raises(ValueError, ["out", "read-only"], [], q, k, v, out=out)
    assert np.all(out == SENTINEL)


def test_out_broadcast_view_raises_value_error():
    q, k, v = _qkv()
    base = np.full((1, 3, 6), SENTINEL)
    _raises(ValueError, ["out"], [], q, k, v, out=np.broadcast_to(base, OS))
    assert np.all(base == SENTINEL)


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_out_overlapping_input_raises_value_error(which):
    q, k, v = _qkv(qs=(2, 3, 6), ks=(2, 5, 6))
    args = {"query": q, "key": k, "value": v}
    buf = args[which].copy()
    args[which] = buf
    out = buf[:, :3, :]     # shares memory with the input
    before = buf.copy()
    _raises(ValueError, ["out", which], [], args["query"], args["key"], args["value"], out=out)
    assert np.array_equal(buf, before)


def test_out_overlapping_attn_mask_raises_value_error():
    q, k, v = _qkv(vs=(2, 5, 5))
    buf = np.zeros((2, 3, 5))
    _raises(ValueError, ["out", "attn_mask"], [], q, k, v, buf[0], out=buf)


def test_out_overlapping_key_padding_mask_raises_value_error():
    """A bool key_padding_mask viewing out's bytes: the kernel would read
    padding flags it has itself overwritten (rows computed after the first
    chunk see a different mask)."""
    rng = np.random.default_rng(1)
    L, S = 2000, 300
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((L, 16), (S, 16), (S, 24)))
    out = np.zeros((L, 24), np.float32)
    kpm = out.reshape(-1).view(np.uint8)[:S].view(bool)   # all False for now
    _raises(ValueError, ["out", "key_padding_mask"], [], q, k, v, key_padding_mask=kpm,
            out=out, num_threads=1)
    assert np.all(out == 0)


def test_out_overlapping_attn_mask_given_as_memoryview_raises_value_error():
    """An attn_mask that is not an ndarray but still views out's memory."""
    rng = np.random.default_rng(2)
    L, S = 2000, 300
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((L, 16), (S, 16), (S, S)))
    out = np.zeros((L, S), np.float32)
    # a (1, S) mask broadcast to every row, viewing out's first row: rows
    # computed after the first chunk would see the values written there
    _raises(ValueError, ["out", "attn_mask"], [], q, k, v, memoryview(out[:1]), out=out,
            num_threads=1)
    assert np.all(out == 0)


def test_out_wrong_dtype_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["out", "float32", "float64"], [], q, k, v,
            out=np.full(OS, SENTINEL, np.float32))


def test_out_float16_for_float32_inputs_raises_type_error():
    q, k, v = _qkv(np.float32)
    _raises(TypeError, ["out", "float16"], [], q, k, v, out=np.zeros(OS, np.float16))


def test_out_wrong_shape_raises_value_error():
    q, k, v = _qkv()
    _raises(ValueError, ["out"], [(2, 3, 5), OS], q, k, v, out=np.full((2, 3, 5), SENTINEL))


def test_out_not_an_array_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["out", "list"], [], q, k, v, out=[[0.0] * 6] * 3)


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


@pytest.mark.parametrize("scale", [np.inf, -np.inf, np.nan, np.float32(np.inf), "inf"])
def test_scale_not_finite_raises_value_error(scale):
    q, k, v = _qkv()
    _raises(ValueError, ["scale must be finite"], [], q, k, v, scale=scale)


def test_scale_overflowing_float32_raises_value_error():
    """1e300 is finite as a Python float but inf in float32, the dtype the
    scores are computed in: it must be refused like inf (the kernels would
    otherwise compute (inf * q) . k, which is not the reference's
    inf * (q . k))."""
    q, k, v = _qkv(np.float32)
    _raises(ValueError, ["scale"], [], q, k, v, scale=1e300, out_dtype=np.float32)


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


@pytest.mark.parametrize("scale", ["abc", 1j, None.__class__, [1.0]])
def test_scale_not_a_number_raises_type_error(scale):
    q, k, v = _qkv()
    _raises(TypeError, ["scale"], [], q, k, v, scale=scale)


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


# ---------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["int64", "uint8", "complex128", "object", "U1"])
def test_attn_mask_unsupported_dtype_raises_type_error(bad):
    q, k, v = _qkv()
    _raises(TypeError, ["attn_mask", str(np.dtype(bad))], [], q, k, v, np.zeros((3, 5), bad))


def test_int_attn_mask_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["attn_mask", "int64"], [], q, k, v, np.ones((3, 5), np.int64))


@pytest.mark.parametrize("bad", ["float64", "int64", "uint8"])
def test_key_padding_mask_not_bool_raises_type_error(bad):
    q, k, v = _qkv()
    _raises(TypeError, ["key_padding_mask", str(np.dtype(bad))], [], q, k, v,
            key_padding_mask=np.zeros(5, bad))


def test_float_key_padding_mask_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["key_padding_mask", "float64"], [], q, k, v,
            key_padding_mask=np.zeros(5))


@pytest.mark.parametrize("mshape", [(3, 4), (4, 5), (3, 2, 5), (1, 2, 3, 5), (4,)])
def test_attn_mask_wrong_shape_raises_value_error(mshape):
    q, k, v = _qkv()
    _raises(ValueError, ["attn_mask"], [mshape, (2, 3, 5)], q, k, v, np.ones(mshape, bool))


@pytest.mark.parametrize("kshape", [(4,), (6,), (3, 5), (2, 4), (2, 1, 5), ()])
def test_key_padding_mask_wrong_shape_raises_value_error(kshape):
    q, k, v = _qkv()
    _raises(ValueError, ["key_padding_mask"], [kshape], q, k, v,
            key_padding_mask=np.zeros(kshape, bool))


def test_nan_in_float_attn_mask_as_reference():
    q, k, v = _qkv()
    m = np.zeros((3, 5))
    m[1, 2] = np.nan
    o, _ = _check_reference(q, k, v, m)
    assert np.isnan(o[:, 1]).all() and np.isfinite(o[:, [0, 2]]).all()


# ---------------------------------------------------------------------------
# num_threads, is_causal, enable_gqa
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -1, -(2**40)])
def test_num_threads_below_one_raises_value_error(n):
    q, k, v = _qkv()
    _raises(ValueError, ["num_threads", str(n)], [], q, k, v, num_threads=n)


@pytest.mark.parametrize("n", [1.5, 2.0, "2", True, False, np.True_, [2], np.float64(2)])
def test_num_threads_not_an_int_raises_type_error(n):
    q, k, v = _qkv()
    _raises(TypeError, ["num_threads"], [], q, k, v, num_threads=n)


def test_num_threads_huge_is_clamped_and_works():
    q, k, v = _qkv()
    assert np.array_equal(fastattn.attention(q, k, v, num_threads=10**12),
                          fastattn.attention(q, k, v, num_threads=1))


@pytest.mark.parametrize("c", ["diagonal", "True", "UPPER_LEFT", 2, 1.0, "lower right"])
def test_is_causal_unknown_raises_value_error(c):
    q, k, v = _qkv()
    _raises(ValueError, ["is_causal", repr(c)], [], q, k, v, is_causal=c)


@pytest.mark.parametrize("hq,hkv", [(3, 2), (4, 3), (2, 4), (5, 0)])
def test_enable_gqa_non_dividing_heads_raises_value_error(hq, hkv):
    q, k, v = _qkv(qs=(1, hq, 3, 4), ks=(1, hkv, 5, 4), vs=(1, hkv, 5, 6))
    _raises(ValueError, ["enable_gqa", "heads"], [(1, hq, 3, 4), (1, hkv, 5, 4)], q, k, v,
            enable_gqa=True, out_shape=(1, hq, 3, 6))


def test_enable_gqa_without_head_dimension_raises_value_error():
    q, k, v = _qkv(qs=(3, 4), ks=(5, 4), vs=(5, 6))
    _raises(ValueError, ["enable_gqa"], [(3, 4)], q, k, v, enable_gqa=True, out_shape=(3, 6))


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------

def _sm_raises(exc, names, shapes, x, **kw):
    return _raises(exc, names, shapes, x, call=fastattn.softmax, out_shape=None, **kw)


@pytest.mark.parametrize("bad", ["complex128", "object", "U3", "datetime64[s]"])
def test_softmax_unsupported_dtype_raises_type_error(bad):
    _sm_raises(TypeError, [str(np.dtype(bad))], [], np.zeros((3, 4), bad))


def test_softmax_none_raises_type_error():
    _sm_raises(TypeError, ["object"], [], None)


def test_softmax_int_mask_raises_type_error():
    _sm_raises(TypeError, ["mask", "int64"], [], np.zeros((3, 4)), mask=np.ones(4, np.int64))


def test_softmax_mask_wrong_shape_raises_value_error():
    _sm_raises(ValueError, ["mask"], [(3,), (3, 4)], np.zeros((3, 4)), mask=np.ones(3, bool))


def test_softmax_out_read_only_raises_value_error():
    x = np.zeros((3, 4))
    out = np.full((3, 4), SENTINEL)
    out.flags.writeable = False
    _sm_raises(ValueError, ["out", "read-only"], [], x, out=out)


def test_softmax_out_wrong_dtype_raises_type_error():
    out = np.full((3, 4), SENTINEL, np.float32)
    _sm_raises(TypeError, ["out", "float32"], [], np.zeros((3, 4)), out=out)
    assert np.all(out == SENTINEL)


def test_softmax_out_wrong_shape_raises_value_error():
    out = np.full((4, 3), SENTINEL)
    _sm_raises(ValueError, ["out"], [(4, 3), (3, 4)], np.zeros((3, 4)), out=out)
    assert np.all(out == SENTINEL)


def test_softmax_out_overlapping_mask_raises_value_error():
    out = np.zeros((3, 8))
    mask = out.view(np.uint8)[:, :8].view(bool)
    _sm_raises(ValueError, ["out", "mask"], [], np.zeros((3, 8)), out=out, mask=mask)


@pytest.mark.parametrize("axis,exc", [(2, np.exceptions.AxisError), (-3, np.exceptions.AxisError),
                                      (1.0, TypeError), ((0, -2), ValueError),
                                      ("0", TypeError)])
def test_softmax_bad_axis(axis, exc):
    _sm_raises(exc, [], [], np.zeros((3, 4)), axis=axis)


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


def test_error_messages_do_not_leak_internal_names():
    """The message is about the caller's arguments, not _core internals."""
    q, k, v = _qkv()
    with pytest.raises(ValueError) as info:
        fastattn.attention(q, k, v, np.ones((3, 4), bool))
    assert not re.search(r"_core|fa_attention|status \d", str(info.value))
