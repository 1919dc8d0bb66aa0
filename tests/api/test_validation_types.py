"""Argument validation of fastattn.attention: dtypes, ``out=``,
``num_threads``, ``scale`` and ``is_causal``.

Every error is raised before anything is written (a given ``out`` keeps its
sentinel); its message names the argument (and the dtypes or the shapes).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from api_common import OS, SENTINEL, _qkv, _raises


# ---------------------------------------------------------------------------
# dtypes of the inputs and masks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("bad", ["complex128", "complex64", "object", "U3", "U3_numeric", "S3",
                                 "datetime64[s]", "timedelta64[s]"])
def test_unsupported_input_dtype_raises_type_error(which, bad):
    """U3_numeric: strings that spell numbers ('0.1') are refused too, not parsed."""
    args = dict(zip(("query", "key", "value"), _qkv()))
    if bad == "U3_numeric":
        bad = "U3"
        args[which] = args[which].astype(str).astype(bad)
    else:
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


@pytest.mark.parametrize("fill", [0, 1], ids=["zeros", "ones"])
@pytest.mark.parametrize("bad", ["int64", "uint8", "complex128", "object", "U1"])
def test_attn_mask_unsupported_dtype_raises_type_error(bad, fill):
    """Integer masks are refused even when they hold only 0 and 1."""
    q, k, v = _qkv()
    _raises(TypeError, ["attn_mask", str(np.dtype(bad))], [], q, k, v, np.full((3, 5), fill, bad))


@pytest.mark.parametrize("bad", ["float64", "int64", "uint8"])
def test_key_padding_mask_not_bool_raises_type_error(bad):
    q, k, v = _qkv()
    _raises(TypeError, ["key_padding_mask", str(np.dtype(bad))], [], q, k, v,
            key_padding_mask=np.zeros(5, bad))


# ---------------------------------------------------------------------------
# out
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 6), (3, 6), (1, 3, 6), (2, 2, 3, 6)])
def test_out_wrong_shape_raises_value_error(shape):
    q, k, v = _qkv()
    _raises(ValueError, ["out"], [shape, OS], q, k, v, out=np.full(shape, SENTINEL))


@pytest.mark.parametrize("in_dtype,out_dtype", [
    ("float64", "float32"), ("float64", "float16"), ("float64", "int64"), ("float64", "complex128"),
    ("float32", "float64"), ("float32", "float16"), ("float16", "float32")])
def test_out_wrong_dtype_raises_type_error(in_dtype, out_dtype):
    q, k, v = _qkv(np.dtype(in_dtype))
    _raises(TypeError, ["out", out_dtype, in_dtype], [], q, k, v,
            out=np.full(OS, SENTINEL).astype(out_dtype))


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


@pytest.mark.parametrize("call", ["attention", "softmax", "attention_varlen"])
def test_out_whose_elements_share_memory_raises_value_error(call):
    """A writeable view that maps two elements to one address (as_strided,
    or a torch tensor expanded and passed as an array) would be written
    twice: refused, nothing written."""
    q, k, v = _qkv()
    base = np.full(64, SENTINEL)
    if call == "attention":
        out = np.lib.stride_tricks.as_strided(base, OS, (0, 8, 8))
        args, kw = (q, k, v), {}
    elif call == "softmax":
        out = np.lib.stride_tricks.as_strided(base, q[0].shape, (8, 0))
        args, kw = (q[0],), {"axis": -1}
    else:
        out = np.lib.stride_tricks.as_strided(base, (3, 2, 6), (48, 0, 8))
        cu = np.array([0, 3])
        args, kw = (q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), cu, np.array([0, 5])), {}
    assert out.flags.writeable
    _raises(ValueError, ["out", "same memory"], [out.shape], *args,
            call=getattr(fastattn, call), out=out, **kw)
    assert np.all(base == SENTINEL)


def test_out_not_an_array_raises_type_error():
    q, k, v = _qkv()
    _raises(TypeError, ["out", "list"], [], q, k, v, out=[[0.0] * 6] * 3)


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


def test_out_error_beats_other_work_with_return_weights():
    q, k, v = _qkv()
    out = np.full((2, 3, 5), SENTINEL)
    with pytest.raises(ValueError, match="out"):
        fastattn.attention(q, k, v, out=out, return_weights=True, is_causal=True)
    assert np.all(out == SENTINEL)


# ---------------------------------------------------------------------------
# num_threads, scale, is_causal
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -1, -8, -(2**40)])
def test_num_threads_below_one_raises_value_error(n):
    q, k, v = _qkv()
    _raises(ValueError, ["num_threads", str(n)], [], q, k, v, num_threads=n)


@pytest.mark.parametrize("n", [1.5, 2.0, "2", True, False, np.True_, [2], np.float64(2)])
def test_num_threads_not_an_int_raises_type_error(n):
    q, k, v = _qkv()
    _raises(TypeError, ["num_threads"], [], q, k, v, num_threads=n)


@pytest.mark.parametrize("scale", [np.inf, -np.inf, np.nan, np.float32(np.inf),
                                   10**400, -10**400], ids=lambda s: repr(s)[:12])
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


@pytest.mark.parametrize("scale", ["abc", 1j, None.__class__, [1.0], "1", "inf", b"0.5", True,
                                   np.bool_(True), np.str_("2")], ids=repr)
def test_scale_not_a_number_raises_type_error_strings_and_bools_included(scale):
    q, k, v = _qkv()
    _raises(TypeError, ["scale"], [], q, k, v, scale=scale)


@pytest.mark.parametrize("c", ["diagonal", "True", "UPPER_LEFT", 2, 1.0, "lower right"])
def test_is_causal_unknown_raises_value_error(c):
    q, k, v = _qkv()
    _raises(ValueError, ["is_causal", repr(c)], [], q, k, v, is_causal=c)
