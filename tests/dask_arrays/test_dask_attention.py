"""fastattn.dask.attention against the in-memory fastattn.attention and
fastattn.reference: every option, on chunkings that cut the batch, heads,
queries and keys (including chunks far from the diagonal and chunks smaller
than the window), computed with the synchronous scheduler."""

from __future__ import annotations

import doctest

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_common import assert_matches, chunked, import_dask, inputs

da = import_dask()

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402
from conftest import examples  # noqa: E402
from fastattn import reference  # noqa: E402

QS, KS = (2, 4, 70, 16), (2, 4, 90, 16)
CHUNKS = ((1, 3, 17, 16), (2, 2, 13, 16), (1, 4, 29, 8))   # q, k, v: none line up

OPTIONS = {
    "plain": {},
    "causal_upper_left": {"is_causal": True},
    "causal_lower_right": {"is_causal": "lower_right"},
    "window_both_sides": {"window": (10, 5)},
    "window_left_only_lower_right": {"window": (12, None), "is_causal": "lower_right"},
    "window_right_only": {"window": (None, 4)},
    "alibi": {"alibi_slopes": [0.1, 0.2, 0.3, 0.4]},
    "alibi_causal_lower_right": {"alibi_slopes": [0.5, 0.25, 0.125, 0.0625],
                                 "is_causal": "lower_right"},
    "alibi_window_wider_than_chunks": {"alibi_slopes": [0.1, 0.2, 0.3, 0.4],
                                       "window": (40, 30)},
    "alibi_causal_window_wider_than_chunks": {"alibi_slopes": [0.1, 0.2, 0.3, 0.4],
                                              "window": 35, "is_causal": True},
    "softcap": {"softcap": 2.0},
    "sinks": {"sinks": [0.0, 1.0, 3.0, -np.inf]},
    "sinks_causal_window": {"sinks": [0.5, 1.0, 2.0, -1.0], "is_causal": True, "window": 3},
    "scale": {"scale": 0.05},
    "everything": {"is_causal": "lower_right", "window": (25, 0), "softcap": 5.0,
                   "alibi_slopes": [0.1, 0.2, 0.3, 0.4], "sinks": [0.0, 1.0, 2.0, 3.0],
                   "scale": 0.3},
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_match_in_memory_and_reference(name):
    rng = np.random.default_rng(0)
    q, k, v = inputs(rng, QS, KS, KS[:-1] + (8,))
    opts = OPTIONS[name]
    out, lse = fdask.attention(*chunked(da, (q, k, v), CHUNKS), return_lse=True, **opts)
    assert out.chunks == ((1, 1), (3, 1), (17, 17, 17, 17, 2), (8,))
    assert lse.chunks == out.chunks[:-1]
    got, got_lse = da.compute(out, lse, scheduler="sync")
    want, want_lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    assert_matches(got, got_lse, want, want_lse, np.float32)
    ref, ref_lse = reference.attention(q.astype(np.float64), k.astype(np.float64),
                                       v.astype(np.float64), return_lse=True, **opts)
    assert_matches(got.astype(np.float64), got_lse.astype(np.float64), ref, ref_lse,
                   np.float32)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtypes_follow_the_in_memory_call(dtype):
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng, (1, 2, 40, 8), (1, 2, 50, 8), (1, 2, 50, 8), dtype)
    out, lse = fdask.attention(*chunked(da, (q, k, v), ((1, 1, 16, 8),) + ((1, 2, 12, 8),) * 2),
                               is_causal=True, return_lse=True, sinks=[0.5, -0.5])
    want, want_lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True,
                                        sinks=[0.5, -0.5])
    got, got_lse = da.compute(out, lse, scheduler="sync")
    assert out.dtype == want.dtype and lse.dtype == want_lse.dtype
    assert_matches(got, got_lse, want, want_lse, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float_mask_is_rounded_to_16_bit_inputs_dtype_as_in_memory(dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(12)
    q, k, v = inputs(rng, (1, 2, 12, 8), (1, 2, 14, 8), (1, 2, 14, 8), dt)
    mask = rng.standard_normal((12, 14)) * 3000.0   # rounding to 16 bits moves it by units
    mask[3] = -1e39                                 # -inf in 16 bits: row 3 sees nothing
    mask[5, 2:] = -np.inf
    dq, dk, dv = chunked(da, (q, k, v), ((1, 1, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    out, lse = fdask.attention(dq, dk, dv, mask, return_lse=True)
    with np.errstate(over="ignore"):                # NumPy's warning for the -1e39
        want, want_lse = fastattn.attention(q, k, v, mask, return_lse=True)
    got, got_lse = da.compute(out, lse, scheduler="sync")
    assert np.all(got[:, :, 3] == 0) and np.all(got_lse[:, :, 3] == -np.inf)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got_lse, want_lse, rtol=1e-5)


@pytest.mark.parametrize("q_head_chunk", [4, 2, 3, 1], ids=lambda c: f"q_heads_by_{c}")
@pytest.mark.parametrize("hkv", [2, 1], ids=lambda h: f"hkv_{h}")
def test_grouped_query_heads_whole_and_cut_groups(q_head_chunk, hkv):
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, (2, 8, 30, 8), (2, hkv, 40, 8), (2, hkv, 40, 4))
    dq, dk, dv = chunked(da, (q, k, v), ((1, q_head_chunk, 11, 8), (2, 1, 9, 8), (1, 1, 40, 4)))
    kw = {"is_causal": "lower_right", "alibi_slopes": np.linspace(0.1, 0.8, 8),
          "sinks": np.linspace(-1, 1, 8)}
    out, lse = fdask.attention(dq, dk, dv, enable_gqa=True, return_lse=True, **kw)
    assert out.chunks[1] == dq.chunks[1]
    got, got_lse = da.compute(out, lse, scheduler="sync")
    want, want_lse = fastattn.attention(q, k, v, enable_gqa=True, return_lse=True, **kw)
    assert_matches(got, got_lse, want, want_lse, np.float32)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy_mask", "dask_mask"])
@pytest.mark.parametrize("kind", ["bool", "float", "bool_broadcast_heads"])
def test_attn_mask_is_chunked_with_queries_and_keys(kind, lazy):
    rng = np.random.default_rng(3)
    q, k, v = inputs(rng, (2, 3, 40, 8), (2, 3, 50, 8), (2, 3, 50, 8))
    if kind == "bool":
        mask = rng.random((2, 3, 40, 50)) > 0.3
    elif kind == "float":
        mask = np.where(rng.random((40, 50)) > 0.2, rng.standard_normal((40, 50)), -np.inf)
    else:
        mask = rng.random((2, 1, 40, 50)) > 0.5
    m = da.from_array(mask, chunks=(7,) * mask.ndim) if lazy else mask
    dq, dk, dv = chunked(da, (q, k, v), ((1, 2, 15, 8), (1, 1, 13, 8), (1, 1, 13, 8)))
    out, lse = fdask.attention(dq, dk, dv, m, window=(30, 8), return_lse=True,
                               alibi_slopes=[0.1, 0.2, 0.3])
    want, want_lse = fastattn.attention(q, k, v, mask, window=(30, 8), return_lse=True,
                                        alibi_slopes=[0.1, 0.2, 0.3])
    assert_matches(*da.compute(out, lse, scheduler="sync"), want, want_lse, np.float32)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy_padding", "dask_padding"])
@pytest.mark.parametrize("shape", ["S", "N_S"])
def test_key_padding_mask(shape, lazy):
    rng = np.random.default_rng(4)
    q, k, v = inputs(rng, (3, 2, 30, 8), (3, 2, 60, 8), (3, 2, 60, 8))
    if shape == "S":
        kpm = np.arange(60) >= 35
    else:
        kpm = np.stack([np.arange(60) >= 35, np.arange(60) < 20, rng.random(60) > 0.5])
    p = da.from_array(kpm, chunks=(2, 17)[-kpm.ndim:]) if lazy else kpm
    dq, dk, dv = chunked(da, (q, k, v), ((2, 1, 13, 8), (1, 2, 11, 8), (3, 1, 11, 8)))
    out, lse = fdask.attention(dq, dk, dv, is_causal=True, key_padding_mask=p,
                               return_lse=True)
    want, want_lse = fastattn.attention(q, k, v, is_causal=True, key_padding_mask=kpm,
                                        return_lse=True)
    assert_matches(*da.compute(out, lse, scheduler="sync"), want, want_lse, np.float32)


def test_leading_dimensions_broadcast_and_differ_in_rank():
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, (2, 3, 20, 8), (3, 30, 8), (1, 30, 8))
    out = fdask.attention(*chunked(da, (q, k, v), ((1, 2, 7, 8), (1, 11, 8), (1, 7, 8))),
                          is_causal=True, window=4)
    assert out.shape == (2, 3, 20, 8)
    want = fastattn.attention(q, k, v, is_causal=True, window=4)
    assert_matches(out.compute(scheduler="sync"), None, want, None, np.float32)


def test_numpy_inputs_are_wrapped_and_the_result_is_lazy():
    rng = np.random.default_rng(6)
    q, k, v = inputs(rng, (2, 10, 4), (2, 12, 4), (2, 12, 4))
    out = fdask.attention(q, k, v)
    assert isinstance(out, da.Array)
    assert_matches(out.compute(scheduler="sync"), None, fastattn.attention(q, k, v), None,
                   np.float32)


@pytest.mark.parametrize("shape", [(2, 3, 0, 8, 20), (2, 3, 10, 8, 0), (0, 3, 10, 8, 20)],
                         ids=["no_queries", "no_keys", "empty_batch"])
def test_empty_problems(shape):
    B, H, L, E, S = shape
    rng = np.random.default_rng(7)
    q, k, v = inputs(rng, (B, H, L, E), (B, H, S, E), (B, H, S, E))
    out, lse = fdask.attention(q, k, v, return_lse=True, sinks=np.ones(3))
    want, want_lse = fastattn.attention(q, k, v, return_lse=True, sinks=np.ones(3))
    got, got_lse = da.compute(out, lse, scheduler="sync")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_lse, want_lse)


@pytest.mark.parametrize("q_chunks", [(1, 0, 5, 4), (1, 0, 2, 4)], ids=["one_chunk", "rows_split"])
def test_grouped_query_heads_with_no_query_heads_give_an_empty_result(q_chunks):
    rng = np.random.default_rng(11)
    q, k, v = inputs(rng, (1, 0, 5, 4), (1, 2, 6, 4), (1, 2, 6, 3))
    dq = da.from_array(q, chunks=q_chunks)
    out, lse = fdask.attention(dq, k, v, enable_gqa=True, is_causal=True, return_lse=True)
    want, want_lse = fastattn.attention(q, k, v, enable_gqa=True, is_causal=True,
                                        return_lse=True)
    got, got_lse = da.compute(out, lse, scheduler="sync")
    assert got.shape == want.shape == (1, 0, 5, 3) and got_lse.shape == want_lse.shape


def test_no_query_heads_with_key_padding_mask_is_empty_in_memory_and_on_dask():
    rng = np.random.default_rng(14)
    q, k, v = inputs(rng, (3, 0, 5, 4), (3, 2, 6, 4), (3, 2, 6, 3))
    kpm = np.arange(6) >= 4
    want = fastattn.attention(q, k, v, enable_gqa=True, key_padding_mask=kpm)
    out = fdask.attention(da.from_array(q, chunks=(1, 0, 2, 4)), k, v, enable_gqa=True,
                          key_padding_mask=kpm)
    assert want.shape == out.compute(scheduler="sync").shape == (3, 0, 5, 3)


def test_rows_that_see_no_key_give_zeros_and_minus_inf_with_sinks():
    rng = np.random.default_rng(8)
    q, k, v = inputs(rng, (1, 2, 12, 4), (1, 2, 12, 4), (1, 2, 12, 4))
    mask = np.ones((12, 12), bool)
    mask[3:6] = False                              # rows 3..5 see nothing
    dq, dk, dv = chunked(da, (q, k, v), ((1, 1, 4, 4), (1, 1, 5, 4), (1, 1, 5, 4)))
    out, lse = fdask.attention(dq, dk, dv, mask, sinks=[1.0, 2.0], return_lse=True)
    got, got_lse = da.compute(out, lse, scheduler="sync")
    assert np.all(got[:, :, 3:6] == 0) and np.all(got_lse[:, :, 3:6] == -np.inf)
    want, want_lse = fastattn.attention(q, k, v, mask, sinks=[1.0, 2.0], return_lse=True)
    assert_matches(got, got_lse, want, want_lse, np.float32)


@st.composite
def _problems(draw):
    L, S = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    H = draw(st.sampled_from([1, 2, 4]))
    causal = draw(st.sampled_from([False, True, "lower_right"]))
    left = draw(st.sampled_from([None, 0, 1, 3, 9, 30]))
    right = draw(st.sampled_from([None, 0, 2, 7, 30]))
    window = None if left is None and right is None else (left, right)
    kw = {"is_causal": causal, "window": window}
    if draw(st.booleans()):
        kw["alibi_slopes"] = np.linspace(0.05, 0.5, H)
    if draw(st.booleans()):
        kw["sinks"] = np.linspace(-1.0, 2.0, H)
    if draw(st.booleans()):
        kw["softcap"] = 3.0
    lc, sc = draw(st.integers(1, L)), draw(st.integers(1, S))
    sv = draw(st.integers(1, S))
    hc = draw(st.integers(1, H))
    return L, S, H, kw, (lc, sc, sv, hc), draw(st.integers(0, 2**16))


@settings(max_examples=examples(60))
@given(_problems())
def test_random_chunkings_and_options_match_in_memory(problem):
    L, S, H, kw, (lc, sc, sv, hc), seed = problem
    rng = np.random.default_rng(seed)
    q, k, v = inputs(rng, (2, H, L, 8), (2, H, S, 8), (2, H, S, 4))
    dq, dk, dv = chunked(da, (q, k, v), ((1, hc, lc, 8), (2, H, sc, 8), (1, 1, sv, 4)))
    out, lse = fdask.attention(dq, dk, dv, return_lse=True, **kw)
    want, want_lse = fastattn.attention(q, k, v, return_lse=True, **kw)
    assert_matches(*da.compute(out, lse, scheduler="sync"), want, want_lse, np.float32)


def test_docstring_example_runs():
    result = doctest.testmod(fdask, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
