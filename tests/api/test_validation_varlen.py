"""fastattn.attention_varlen: every bad input raises, names the argument (and
its shape), and leaves ``out`` untouched."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import fastattn
from api_common import SENTINEL, _raises

# Two sequences: 2 + 3 query rows, 4 + 1 key rows; 4 query heads on 2 key/value heads.
TQ, TK, H, HKV, D, DV = 5, 5, 4, 2, 3, 2
CQ = np.array([0, 2, 5], np.int32)
CK = np.array([0, 4, 5], np.int64)
OS = (TQ, H, DV)


def _qkv(qs=(TQ, H, D), ks=(TK, HKV, D), vs=(TK, HKV, DV), dtype=np.float64):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))


_vraises = partial(_raises, call=fastattn.attention_varlen, out_shape=OS)


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, shapes", [
    ("query", dict(qs=(TQ, H * D))),
    ("query", dict(qs=(1, TQ, H, D))),
    ("key", dict(ks=(TK, D))),
    ("value", dict(vs=(1, TK, HKV, DV))),
])
def test_not_three_dimensional(name, shapes):
    q, k, v = _qkv(**shapes)
    bad = {"query": q, "key": k, "value": v}[name]
    _vraises(ValueError, [name], [bad.shape], q, k, v, CQ, CK)


@pytest.mark.parametrize("shapes", [
    dict(vs=(TK + 1, HKV, DV)),           # value rows != key rows
    dict(vs=(TK, HKV + 1, DV)),           # value heads != key heads
    dict(ks=(TK, HKV, D + 1)),            # key dim != query dim
])
def test_shapes_do_not_fit(shapes):
    q, k, v = _qkv(**shapes)
    _vraises(ValueError, ["query", "key", "value"], [q.shape, k.shape, v.shape], q, k, v,
             CQ, np.array([0, 4, k.shape[0]], np.int64))


@pytest.mark.parametrize("h, hkv", [(3, 2), (4, 0)])
def test_heads_not_a_multiple(h, hkv):
    q, k, v = _qkv(qs=(TQ, h, D), ks=(TK, hkv, D), vs=(TK, hkv, DV))
    _vraises(ValueError, ["heads", "multiple"], [q.shape, k.shape], q, k, v, CQ, CK,
             out_shape=(TQ, h, DV))


# ---------------------------------------------------------------------------
# cu_seqlens
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("cq, ck, name", [
    pytest.param([0, 3, 2, 5], [0, 1, 2, 5], "cu_seqlens_q", id="q-not-monotone"),
    pytest.param([0, 2, 5], [0, 4, 3, 5], "cu_seqlens_k", id="k-not-monotone"),
    pytest.param([1, 2, 5], [0, 4, 5], "cu_seqlens_q", id="q-not-starting-at-0"),
    pytest.param([0, 2, 5], [2, 4, 5], "cu_seqlens_k", id="k-not-starting-at-0"),
    pytest.param([0, 2, 6], [0, 4, 5], "cu_seqlens_q", id="q-wrong-end"),
    pytest.param([0, 2, 5], [0, 4, 4], "cu_seqlens_k", id="k-wrong-end"),
    pytest.param([0, 2, 5], [0, 1, 4, 5], "cu_seqlens_q and cu_seqlens_k",
                 id="length-mismatch"),
    pytest.param(np.array([0, 2, 5], np.float64), [0, 4, 5], "cu_seqlens_q", id="float"),
    pytest.param([0, 2, 5], np.array([0, 4, 5], np.uint32), "cu_seqlens_k", id="uint32"),
    pytest.param([0, 2, 5], np.array([0, 4, 5], np.int16), "cu_seqlens_k", id="int16"),
    pytest.param(np.array([[0, 2, 5]], np.int32), [0, 4, 5], "cu_seqlens_q", id="2-D"),
    pytest.param(np.array(5, np.int32), [0, 4, 5], "cu_seqlens_q", id="0-D"),
    pytest.param(np.array([], np.int32), [0, 4, 5], "cu_seqlens_q", id="empty"),
])
def test_bad_cu_seqlens(cq, ck, name):
    cq = cq if isinstance(cq, np.ndarray) else np.array(cq, np.int32)
    ck = ck if isinstance(ck, np.ndarray) else np.array(ck, np.int64)
    _vraises(ValueError, [name], [], *_qkv(), cq, ck)


# ---------------------------------------------------------------------------
# dtypes and the arguments attention() checks
# ---------------------------------------------------------------------------

def test_complex_input():
    q, k, v = _qkv()
    _vraises(TypeError, ["key", "complex"], [], q, k.astype(complex), v, CQ, CK)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(is_causal="both"), ValueError, "is_causal"),
    (dict(scale=np.inf), ValueError, "scale"),
    (dict(scale="big"), TypeError, "scale"),
    (dict(num_threads=0), ValueError, "num_threads"),
    (dict(num_threads=1.5), TypeError, "num_threads"),
])
def test_bad_options(kwargs, exc, name):
    _vraises(exc, [name], [], *_qkv(), CQ, CK, **kwargs)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(is_causal="both"), ValueError, "is_causal"),
    (dict(scale=np.nan), ValueError, "scale"),
])
def test_bad_options_without_any_row(kwargs, exc, name):
    q, k, v = _qkv(qs=(0, H, D), ks=(0, HKV, D), vs=(0, HKV, DV))
    with pytest.raises(exc, match=name):
        fastattn.attention_varlen(q, k, v, np.zeros(3, np.int32), np.zeros(3, np.int32),
                                  **kwargs)


# ---------------------------------------------------------------------------
# out
# ---------------------------------------------------------------------------

def test_out_wrong_shape():
    out = np.full((TQ, H, DV + 1), SENTINEL)
    _vraises(ValueError, ["out"], [out.shape, OS], *_qkv(), CQ, CK, out=out)


def test_out_wrong_dtype():
    out = np.full(OS, SENTINEL, np.float32)
    _vraises(TypeError, ["out", "float32", "float64"], [], *_qkv(), CQ, CK, out=out)


def test_out_read_only():
    out = np.full(OS, SENTINEL)
    out.flags.writeable = False
    _vraises(ValueError, ["out", "read-only"], [], *_qkv(), CQ, CK, out=out)


def test_out_not_an_array():
    _vraises(TypeError, ["out"], [], *_qkv(), CQ, CK, out=[[0.0]], out_shape=None)


def test_out_overlaps_query():
    q, k, v = _qkv(vs=(TK, HKV, D), qs=(TQ, H, D))
    _vraises(ValueError, ["out", "query"], [], q, k, v, CQ, CK, out=q)


# ---------------------------------------------------------------------------
# per-head options: checked up front, whatever sequence they would reach
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
def test_per_head_wrong_shape(name):
    _vraises(ValueError, [name], [(3,), (2, H)], *_qkv(), CQ, CK, **{name: np.ones(3)})


@pytest.mark.parametrize("name, bad", [("alibi_slopes", np.inf), ("alibi_slopes", np.nan),
                                       ("sinks", np.inf), ("sinks", np.nan)])
def test_per_head_bad_value_in_the_last_sequence(name, bad):
    values = np.zeros((2, H))
    values[1, 3] = bad
    _vraises(ValueError, [name], [], *_qkv(), CQ, CK, **{name: values})


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
def test_per_head_not_real(name):
    _vraises(TypeError, [name], [], *_qkv(), CQ, CK, **{name: np.ones(H, bool)})


@pytest.mark.parametrize("kwargs, exc", [(dict(window=-1), ValueError),
                                         (dict(window=True), TypeError),
                                         (dict(softcap=0.0), ValueError),
                                         (dict(softcap=True), TypeError)])
def test_bad_window_and_softcap(kwargs, exc):
    (name,) = kwargs
    _vraises(exc, [name], [], *_qkv(), CQ, CK, **kwargs)
