"""fastattn.attention(window=...) against fastattn.reference.attention.

Query ``i`` at key position ``p(i)`` (``i``, or ``i + S - L`` lower-right)
sees the keys ``p(i) - left <= j <= p(i) + right``.  Every test runs on every
ISA path (the ``isa`` fixture); the kernels skip the key blocks outside a
tile's window and band the tiles its edges cross, so the shapes straddle the
tile and block sizes, the decoding shapes take the key-split path, and the
windows cover whole splits, partial blocks, zero and more than ``S``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from conftest import _randn, assert_close, check_against_reference, examples, finite_absmax

WINDOWS = {
    "zero": 0, "one": 1, "w17": 17, "w128": 128, "left_100_right_0": (100, 0),
    "left_0_right_100": (0, 100), "right_only_50": (None, 50), "left_only_50": (50, None),
    "wider_than_S": (1000, 1000), "left_129_right_3": (129, 3),
}
CAUSAL = {"noncausal": False, "upper_left": True, "lower_right": "lower_right"}


def _window_hidden(L, S, window, is_causal):
    left, right = (window, window) if not isinstance(window, tuple) else window
    p = np.arange(L)[:, None] + (S - L if is_causal == "lower_right" else 0)
    j = np.arange(S)[None, :]
    hidden = np.zeros((L, S), bool)
    if left is not None:
        hidden |= j < p - left
    if right is not None:
        hidden |= j > p + right
    if is_causal:
        hidden |= j > p
    return hidden


def _inputs(rng, dtype, qs, ks, ev):
    return _randn(rng, qs, dtype), _randn(rng, ks, dtype), _randn(rng, ks[:-1] + (ev,), dtype)


@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
@pytest.mark.parametrize("is_causal", CAUSAL.values(), ids=CAUSAL.keys())
@pytest.mark.parametrize("L, S", [(200, 330), (330, 200), (64, 64)],
                         ids=["L_lt_S", "L_gt_S_rows_see_nothing", "one_tile"])
def test_window_matches_reference(isa, dtype, rng, window, is_causal, L, S):
    q, k, v = _inputs(rng, dtype, (2, L, 40), (2, S, 40), 24)
    _, w = check_against_reference(q, k, v, window=window, is_causal=is_causal)
    assert np.all(w[:, _window_hidden(L, S, window, is_causal)] == 0)
    check_against_reference(q, k, v, window=window, is_causal=is_causal, return_weights=False)


def test_window_float16_input(isa, rng):
    q, k, v = _inputs(rng, np.float16, (2, 150, 32), (2, 300, 32), 32)
    o = fastattn.attention(q, k, v, window=(40, 5), is_causal="lower_right")
    assert o.dtype == np.float16
    want = reference.attention(q, k, v, window=(40, 5), is_causal="lower_right")
    assert_close(o, want, np.float16)


@pytest.mark.parametrize("L", [1, 5, 90])
def test_window_grouped_query_heads(isa, dtype, rng, L):
    q, k, v = _inputs(rng, dtype, (2, 8, L, 32), (2, 2, 700, 32), 32)
    for window in ((100, 0), 3, (None, 0)):
        check_against_reference(q, k, v, window=window, is_causal="lower_right",
                                enable_gqa=True)


def test_window_out_is_filled_and_returned(isa, dtype, rng):
    q, k, v = _inputs(rng, dtype, (2, 3, 100, 16), (2, 3, 260, 16), 12)
    out = np.full((2, 3, 100, 12), 7, dtype)[..., ::-1]  # any strides
    got = fastattn.attention(q, k, v, window=(30, 2), out=out)
    assert got is out
    assert_close(out, reference.attention(q, k, v, window=(30, 2)), dtype,
                 magnitude=finite_absmax(v))


@pytest.mark.parametrize("L", [1, 2, 3, 5, 8])
def test_window_decode_long_keys_key_split(isa, dtype, rng, L):
    # S > 2 * FA_SPLIT_KC: the keys are split; windows cover a split, part of
    # one, or lie wholly in the last one (the others cost nothing)
    S = 4133
    q, k, v = _inputs(rng, dtype, (1, 2, L, 64), (1, 2, S, 64), 64)
    for window in ((0, 0), (100, 0), (1500, 0), (700, None), (None, 0), 5000):
        check_against_reference(q, k, v, window=window, is_causal="lower_right",
                                return_weights=L % 2 == 1)
    check_against_reference(q, k, v, window=(20, 3000))  # upper-left: rows near key 0


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "padding", "all"])
def test_window_combined_with_masks(isa, dtype, rng, mask_kind):
    L, S = 150, 400
    q, k, v = _inputs(rng, dtype, (2, 2, L, 32), (2, 2, S, 32), 32)
    kw = {}
    mask = None
    if mask_kind in ("bool", "all"):
        mask = rng.random((2, 1, L, S)) < 0.6
    if mask_kind == "additive":
        mask = rng.standard_normal((L, S)).astype(dtype)
        mask[rng.random((L, S)) < 0.1] = -np.inf
    if mask_kind in ("padding", "all"):
        pad = rng.random((2, S)) < 0.2
        pad[1, 200:] = True
        kw["key_padding_mask"] = pad
    for window in ((60, 0), 10, (0, 130)):
        for is_causal in (False, "lower_right"):
            check_against_reference(q, k, v, mask, window=window, is_causal=is_causal, **kw)


def test_window_hides_nonfinite_keys_and_values(isa, dtype, rng):
    L, S = 100, 300
    q, k, v = _inputs(rng, dtype, (L, 16), (S, 16), 16)
    k[:150] = np.nan  # left of every row's window below (rows sit at 200 ..)
    v[:150] = np.inf
    o, w = check_against_reference(q, k, v, window=(49, 0), is_causal="lower_right")
    assert np.all(np.isfinite(o)) and np.all(w[:, :150] == 0)


def test_window_zero_is_the_diagonal(isa, dtype, rng):
    q, k, v = _inputs(rng, dtype, (3, 70, 8), (3, 70, 8), 8)
    o = fastattn.attention(q, k, v, window=0)
    assert_close(o, v, dtype, magnitude=finite_absmax(v))


def test_window_rows_seeing_nothing_give_zeros(isa, dtype, rng):
    # lower-right with L > S: the first L - S rows sit before key 0
    q, k, v = _inputs(rng, dtype, (2, 90, 16), (2, 40, 16), 16)
    o = fastattn.attention(q, k, v, window=(0, 0), is_causal="lower_right")
    assert np.all(o[:, :50] == 0)
    check_against_reference(q, k, v, window=(0, 0), is_causal="lower_right")


@pytest.mark.parametrize("window", [(511, 0), (64, 64), (None, 300), 0])
def test_window_bitwise_equal_across_thread_counts(isa, rng, window):
    q, k, v = _inputs(rng, np.float32, (2, 2, 700, 32), (2, 2, 900, 32), 32)
    res = [fastattn.attention(q, k, v, window=window, is_causal="lower_right", num_threads=nt)
           for nt in (1, 2, 3)]
    assert all(np.array_equal(res[0], r) for r in res[1:])
    qd = q[:, :, :3]
    kd, vd = (np.concatenate([x] * 5, axis=-2) for x in (k, v))  # decoding: the key split
    res = [fastattn.attention(qd, kd, vd, window=window, is_causal="lower_right",
                              num_threads=nt) for nt in (1, 2, 3)]
    assert all(np.array_equal(res[0], r) for r in res[1:])


def test_window_none_is_bitwise_the_plain_call(isa, rng):
    q, k, v = _inputs(rng, np.float32, (2, 130, 32), (2, 260, 32), 32)
    for c in (False, True, "lower_right"):
        assert np.array_equal(fastattn.attention(q, k, v, is_causal=c, window=None),
                              fastattn.attention(q, k, v, is_causal=c))
        assert np.array_equal(fastattn.attention(q, k, v, is_causal=c, window=(None, None)),
                              fastattn.attention(q, k, v, is_causal=c))


def test_window_through_multi_head_attention_and_kv_cache(rng):
    d, h, hkv = 32, 4, 2
    x = rng.standard_normal((2, 30, d))
    wq, wo = rng.standard_normal((d, d)) / 6, rng.standard_normal((d, d)) / 6
    wk = rng.standard_normal((d, d // h * hkv)) / 6
    full = fastattn.multi_head_attention(x, wq, wk, wk, wo, h, num_kv_heads=hkv,
                                         is_causal=True, window=(6, 0))
    cache = fastattn.KVCache(2, hkv, d // h, max_len=40, dtype=np.float64)
    parts = [fastattn.multi_head_attention(x[:, :12], wq, wk, wk, wo, h, num_kv_heads=hkv,
                                           kv_cache=cache, window=(6, 0))]
    for t in range(12, 30):
        parts.append(fastattn.multi_head_attention(x[:, t:t + 1], wq, wk, wk, wo, h,
                                                   num_kv_heads=hkv, kv_cache=cache,
                                                   window=(6, 0)))
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-12, atol=1e-12)


_side = st.one_of(st.none(), st.integers(0, 300))


@settings(max_examples=examples(60))
@given(L=st.integers(1, 140), S=st.integers(1, 300), left=_side, right=_side,
       is_causal=st.sampled_from([False, True, "lower_right"]), heads=st.integers(1, 3),
       threads=st.integers(1, 3), weights=st.booleans())
def test_window_property(isa, L, S, left, right, is_causal, heads, threads, weights):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = _inputs(rng, np.float64, (heads, L, 8), (heads, S, 8), 5)
    res = fastattn.attention(q, k, v, window=(left, right), is_causal=is_causal,
                             num_threads=threads, return_weights=weights)
    want = reference.attention(q, k, v, window=(left, right), is_causal=is_causal,
                               return_weights=weights)
    for got, exp in zip(res if weights else (res,), want if weights else (want,)):
        np.testing.assert_allclose(got, exp, rtol=1e-11, atol=1e-11)

