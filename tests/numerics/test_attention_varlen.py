"""fastattn.attention_varlen against fastattn.reference.attention_varlen.

Packed sequences of different lengths (flash-attn's layout), dtypes, GQA,
both causal alignments, empty sequences, ``out=`` of any strides, thread
counts, the window, ALiBi, soft-capping, sink and lse options (each
sequence's bits against its own :func:`fastattn.attention` call:
test_varlen_driver.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.varlen
from conftest import assert_close, examples, finite_absmax
from fastattn import reference

def _packed(lq, lk, H=4, Hkv=2, D=8, Dv=6, dtype=np.float64, cu_dtype=np.int32, seed=0):
    rng = np.random.default_rng(seed)
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(cu_dtype)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(cu_dtype)
    q = rng.standard_normal((int(cq[-1]), H, D)).astype(dtype)
    k = rng.standard_normal((int(ck[-1]), Hkv, D)).astype(dtype)
    v = rng.standard_normal((int(ck[-1]), Hkv, Dv)).astype(dtype)
    return q, k, v, cq, ck


def _check(q, k, v, cq, ck, **kwargs):
    got = fastattn.attention_varlen(q, k, v, cq, ck, **kwargs)
    kwargs.pop("num_threads", None)
    kwargs.pop("out", None)
    want = reference.attention_varlen(q, k, v, cq, ck, **kwargs)
    if kwargs.get("return_lse"):
        (got, got_lse), (want, want_lse) = got, want
        assert got_lse.shape == want_lse.shape == (q.shape[1], q.shape[0])
        assert got_lse.dtype == want_lse.dtype
        assert_close(got_lse, want_lse, got_lse.dtype, finite_absmax(want_lse))
    assert got.shape == want.shape == (q.shape[0], q.shape[1], v.shape[2])
    assert got.dtype == want.dtype
    assert_close(got, want, got.dtype, finite_absmax(want))
    return got


LENGTHS = [
    pytest.param([5, 1, 9, 3], [5, 1, 9, 3], id="self"),
    pytest.param([2, 7, 1], [6, 7, 11], id="cross"),
    pytest.param([3, 0, 4, 2], [3, 5, 0, 2], id="empty-q-and-empty-k"),
    pytest.param([70, 3, 130], [70, 300, 130], id="longer"),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("causal", [False, True, "lower_right"])
@pytest.mark.parametrize("lq, lk", LENGTHS)
def test_matches_reference(dtype, causal, lq, lk):
    _check(*_packed(lq, lk, dtype=dtype), is_causal=causal)


@pytest.mark.parametrize("H, Hkv", [(1, 1), (3, 3), (6, 2), (4, 1)])
def test_heads_and_gqa(H, Hkv):
    _check(*_packed([4, 6, 2], [4, 9, 2], H=H, Hkv=Hkv, dtype=np.float32), is_causal=True,
           scale=0.7)


@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_cu_seqlens_dtypes(cu_dtype):
    _check(*_packed([3, 2], [1, 4], cu_dtype=cu_dtype))


def test_empty_sequences_give_zero_rows():
    q, k, v, cq, ck = _packed([0, 3, 2, 0], [4, 0, 3, 0])
    out = fastattn.attention_varlen(q, k, v, cq, ck)
    np.testing.assert_array_equal(out[0:3], 0)     # sequence 1 has queries but no key
    assert np.all(out[3:5] != 0)


def test_everything_empty():
    q, k, v, cq, ck = _packed([0, 0], [0, 0])
    assert fastattn.attention_varlen(q, k, v, cq, ck).shape == (0, 4, 6)
    q, k, v, cq, ck = _packed([], [])
    assert fastattn.attention_varlen(q, k, v, cq, ck).shape == (0, 4, 6)


@pytest.mark.parametrize("causal", [False, True, "lower_right"])
def test_single_sequence_equals_attention(causal):
    q, k, v, cq, ck = _packed([7], [11], dtype=np.float32)
    got = fastattn.attention_varlen(q, k, v, cq, ck, is_causal=causal)
    whole = fastattn.attention(q.transpose(1, 0, 2), k.transpose(1, 0, 2),
                               v.transpose(1, 0, 2), is_causal=causal, enable_gqa=True)
    np.testing.assert_array_equal(got, whole.transpose(1, 0, 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_out(dtype, layout):
    q, k, v, cq, ck = _packed([3, 0, 5], [4, 2, 5], dtype=dtype)
    shape = (q.shape[0], q.shape[1], v.shape[2])
    if layout == "contiguous":
        out = np.full(shape, np.nan, dtype)
    else:
        buf = np.full((shape[1], shape[0], 2 * shape[2]), np.nan, dtype)
        out = buf[:, :, ::2].transpose(1, 0, 2)
        assert not out.flags.c_contiguous and not out.flags.f_contiguous
    res = fastattn.attention_varlen(q, k, v, cq, ck, is_causal=True, out=out)
    assert res is out
    np.testing.assert_array_equal(out, fastattn.attention_varlen(q, k, v, cq, ck,
                                                                 is_causal=True))
    if layout == "strided":
        assert np.all(np.isnan(buf[:, :, 1::2]))    # the gaps are never written


def test_strided_inputs():
    q, k, v, cq, ck = _packed([3, 5], [4, 6], H=2, Hkv=2)
    qs = np.repeat(q, 2, axis=2)[:, :, ::2]
    ks = np.asfortranarray(k)
    vs = v[::-1][::-1]
    _check(qs, ks, vs, cq, ck, is_causal="lower_right")


def test_threads_bitwise_equal():
    q, k, v, cq, ck = _packed([300, 17, 600, 1], [300, 700, 600, 1300], H=4, Hkv=2, D=64,
                              Dv=64, dtype=np.float32)
    one = fastattn.attention_varlen(q, k, v, cq, ck, is_causal="lower_right", num_threads=1)
    two = fastattn.attention_varlen(q, k, v, cq, ck, is_causal="lower_right", num_threads=2)
    assert np.array_equal(one, two)


def test_threads_bitwise_equal_many_sequences():
    lengths = [40, 120, 75, 90, 64, 110, 50, 100, 85, 70, 128, 60]
    q, k, v, cq, ck = _packed(lengths, lengths, H=4, Hkv=2, D=64, Dv=64, dtype=np.float32)
    one = fastattn.attention_varlen(q, k, v, cq, ck, is_causal=True, num_threads=1)
    for nt in (2, 3, None):
        assert np.array_equal(one, fastattn.attention_varlen(q, k, v, cq, ck, is_causal=True,
                                                             num_threads=nt))
    _check(q, k, v, cq, ck, is_causal=True, num_threads=2)
    out = np.full((q.shape[0], 4, 128), np.nan, np.float32)[:, :, ::2]
    res = fastattn.attention_varlen(q, k, v, cq, ck, is_causal=True, num_threads=2, out=out)
    assert res is out and np.array_equal(out, one)


def _packed_from(lengths, heads, dims, **kwargs):
    """_packed from hypothesis' draws: (len_q, len_k) pairs, (H_kv, groups), (D, Dv)."""
    lq, lk = ([a for a, _ in lengths], [b for _, b in lengths])
    return _packed(lq, lk, H=heads[0] * heads[1], Hkv=heads[0], D=dims[0], Dv=dims[1], **kwargs)


# Up to 5 sequences of 0..20 queries and 0..20 keys, GQA or not, odd sizes.
packed = st.builds(_packed_from,
                   st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=5),
                   st.tuples(st.integers(1, 2), st.integers(1, 3)),
                   st.tuples(st.integers(1, 9), st.integers(1, 5)),
                   dtype=st.sampled_from([np.float32, np.float64]),
                   cu_dtype=st.sampled_from([np.int32, np.int64]),
                   seed=st.integers(0, 2**32 - 1))


@settings(max_examples=examples(80))
@given(packed, st.sampled_from([False, True, "lower_right"]))
def test_property_random_lengths(pk, causal):
    _check(*pk, is_causal=causal)


# ---------------------------------------------------------------------------
# the options attention() gains separately: run once it has them
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("window", [2, (3, 0), (None, 1)])
@pytest.mark.parametrize("causal", [False, "lower_right"])
def test_window(window, causal):
    _check(*_packed([5, 9, 0, 4], [7, 9, 3, 1], dtype=np.float32), window=window,
           is_causal=causal)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_alibi_slopes(per_sequence):
    pk = _packed([5, 9, 4], [7, 9, 1])
    slopes = np.linspace(0.1, 0.8, 12).reshape(3, 4) if per_sequence else [0.5, 0.25, 0.1, 0.0]
    _check(*pk, alibi_slopes=slopes, is_causal="lower_right")


def test_softcap():
    _check(*_packed([5, 9, 4], [7, 9, 1]), softcap=1.5, scale=3.0)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_sinks(per_sequence):
    pk = _packed([5, 9, 4], [7, 0, 1])
    sinks = np.linspace(-1, 1, 12).reshape(3, 4) if per_sequence else [0.0, -np.inf, 1.0, 2.0]
    _check(*pk, sinks=sinks)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_return_lse(dtype):
    _check(*_packed([5, 0, 9, 4], [7, 3, 0, 1], dtype=dtype), return_lse=True, is_causal=True)


@settings(max_examples=examples(40))
@given(packed, st.sampled_from([None, 1, (2, 0), (None, 3)]), st.booleans(), st.booleans())
def test_property_all_options(pk, window, use_cap, use_sinks):
    q, k, v, cq, ck = pk
    n, H = len(cq) - 1, q.shape[1]
    rng = np.random.default_rng(n)
    _check(q, k, v, cq, ck, is_causal="lower_right", window=window,
           alibi_slopes=rng.uniform(0, 1, (n, H)), softcap=2.0 if use_cap else None,
           sinks=rng.uniform(-1, 1, H) if use_sinks else None, return_lse=True)
