"""Grouped-query heads folded into one problem per key/value head.

When every query row sees the same range of keys (always so for one query
row, a decoding step) the g query heads of a group run as g * L rows
against their key/value head, sliced to that range.  These tests pin where that happens, where it
must not (a causal or window bound that cuts a row, per-head ALiBi or sinks,
returned weights, query layouts whose rows cannot be merged), that the
layout of ``out`` never changes the choice (nor so the bits), and that the
result is the per-head result, on every ISA path.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import fastattn
import fastattn._gqa as gqa_mod
from conftest import assert_close, check_against_reference, finite_absmax


@pytest.fixture
def folds(monkeypatch):
    """A list that records, per grouped call, whether it ran folded."""
    seen = []
    run = gqa_mod._run_folded

    def spy(*args):
        done = run(*args)
        seen.append(done)
        return done

    monkeypatch.setattr(gqa_mod, "_run_folded", spy)
    return seen


def _qkv(rng, B, H, hk, L, S, E, Ev, dtype):
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, hk, S, E)).astype(dtype)
    v = rng.standard_normal((B, hk, S, Ev)).astype(dtype)
    return q, k, v


def _per_head(q, k, v, **kw):
    g = q.shape[-3] // k.shape[-3]
    return fastattn.attention(q, np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3), **kw)


CASES = {
    # name: (L, S, keyword arguments, folded?)
    "decode_no_mask": (1, 37, {}, True),
    "decode_lower_right_causal": (1, 37, {"is_causal": "lower_right"}, True),
    "decode_upper_left_causal_first_key_only": (1, 37, {"is_causal": True}, True),
    "decode_sliding_window_slices_keys": (1, 37, {"is_causal": "lower_right", "window": (8, 0)},
                                          True),
    "decode_window_both_sides": (1, 37, {"window": (3, 5)}, True),
    "prefill_window_cuts_rows": (5, 19, {"window": (2, 2)}, False),
    "decode_window_wider_than_cache": (1, 37, {"is_causal": "lower_right", "window": (36, 0)},
                                       True),
    "decode_key_padding": (1, 37, {"key_padding_mask": "pad"}, True),
    "decode_bool_mask_per_head": (1, 37, {"attn_mask": "bool"}, True),
    "decode_additive_mask_shared": (1, 37, {"attn_mask": "add"}, True),
    "decode_softcap": (1, 37, {"softcap": 5.0}, True),
    "decode_alibi_per_head": (1, 37, {"alibi_slopes": "alibi"}, False),
    "decode_sinks_per_head": (1, 37, {"sinks": "sinks"}, False),
    "prefill_non_causal": (5, 19, {}, True),
    "prefill_causal_cuts_rows": (5, 19, {"is_causal": True}, False),
    "one_key": (1, 1, {}, True),
}


def _materialise(kw, rng, B, H, L, S):
    kw = dict(kw)
    if kw.get("key_padding_mask") == "pad":
        pad = rng.random((B, S)) < 0.3
        pad[:, 0] = False
        kw["key_padding_mask"] = pad
    if kw.get("attn_mask") == "bool":
        m = rng.random((B, H, L, S)) < 0.7
        m[..., 0] = True
        kw["attn_mask"] = m
    elif kw.get("attn_mask") == "add":
        kw["attn_mask"] = rng.standard_normal((L, S))
    if kw.get("alibi_slopes") == "alibi":
        kw["alibi_slopes"] = 2.0 ** -np.arange(1, H + 1)
    if kw.get("sinks") == "sinks":
        kw["sinks"] = rng.standard_normal(H)
    return kw


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_heads_fold_only_when_rows_see_every_key(isa, folds, name, dtype):
    L, S, kw, folded = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    B, H, hk = 2, 8, 2
    q, k, v = _qkv(rng, B, H, hk, L, S, 16, 12, dtype)
    kw = _materialise(kw, rng, B, H, L, S)
    if "attn_mask" in kw and kw["attn_mask"].dtype != bool:
        kw["attn_mask"] = kw["attn_mask"].astype(dtype)
    got, lse = fastattn.attention(q, k, v, enable_gqa=True, return_lse=True, **kw)
    assert folds == ([True] if folded else ([False] if folds else []))
    want, want_lse = _per_head(q, k, v, return_lse=True, **kw)
    assert_close(got, want, dtype, magnitude=finite_absmax(v))
    assert_close(lse, want_lse, dtype, magnitude=float(np.max(np.abs(want_lse))))
    if "alibi_slopes" not in kw and "sinks" not in kw and "softcap" not in kw:
        mask = kw.pop("attn_mask", None)
        check_against_reference(q, k, v, mask, enable_gqa=True, return_weights=False, **kw)


def test_grouped_decode_writes_into_out(folds):
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 1, 6, 3, 1, 50, 32, 32, np.float32)
    out = np.full((1, 6, 1, 32), np.nan, np.float32)
    res = fastattn.attention(q, k, v, enable_gqa=True, is_causal="lower_right", out=out)
    assert res is out and folds == [True]
    assert_close(out, _per_head(q, k, v), np.float32, magnitude=finite_absmax(v))


def test_grouped_rows_that_cannot_merge_run_per_head(folds):
    """Queries laid out (B, L, H, E) and viewed as (B, H, L, E): the g heads
    and their L rows share no single row stride (as attention_varlen runs a
    sequence's heads)."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 5, 8, 16)).astype(np.float32).swapaxes(1, 2)
    k = rng.standard_normal((1, 2, 9, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 9, 16)).astype(np.float32)
    got = fastattn.attention(q, k, v, enable_gqa=True)
    assert folds == [False]
    assert_close(got, _per_head(q, k, v), np.float32, magnitude=finite_absmax(v))


OUT_LAYOUTS = {
    # name: a view of the output shape (B, H, L, Ev) over a buffer
    "rows_then_heads": lambda B, H, L, Ev: np.empty((B, L, H, Ev), np.float32).swapaxes(1, 2),
    "every_other_column": lambda B, H, L, Ev: np.empty((B, H, L, 2 * Ev), np.float32)[..., ::2],
    "fortran_order": lambda B, H, L, Ev: np.empty((B, H, L, Ev), np.float32, order="F"),
}


@pytest.mark.parametrize("layout", sorted(OUT_LAYOUTS))
@pytest.mark.parametrize("L", [1, 3, 17], ids=["one_row", "three_rows", "seventeen_rows"])
def test_grouped_result_bits_do_not_depend_on_the_out_layout(isa, folds, layout, L):
    """out= is where the result goes, never how it is computed: an out whose
    strides do not join a group's rows is filled from the folded result
    (the kernel's bits depend on a problem's row count, so running per head
    instead would change them)."""
    rng = np.random.default_rng(L)
    B, H, hk, Ev = 2, 6, 2, 24
    q, k, v = _qkv(rng, B, H, hk, L, 29, 16, Ev, np.float32)
    want = fastattn.attention(q, k, v, enable_gqa=True)
    out = OUT_LAYOUTS[layout](B, H, L, Ev)
    out[...] = np.nan
    got = fastattn.attention(q, k, v, enable_gqa=True, out=out)
    assert got is out and folds == [True, True]
    assert np.ascontiguousarray(out).tobytes() == want.tobytes()


def test_grouped_decode_broadcast_query_batch(folds):
    """A query that broadcasts over the batch folds as well (row stride 0)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 1, 16)).astype(np.float32)
    k = rng.standard_normal((3, 2, 11, 16)).astype(np.float32)
    v = rng.standard_normal((3, 2, 11, 16)).astype(np.float32)
    got = fastattn.attention(q, k, v, enable_gqa=True)
    assert folds == [True]
    assert_close(got, _per_head(np.broadcast_to(q, (3, 8, 1, 16)), k, v), np.float32,
                 magnitude=finite_absmax(v))


def test_grouped_decode_half_cache(folds):
    """float32 queries against a float16 key/value cache (the KV-cache decode)."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
    v = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
    got = fastattn.attention(q, k, v, enable_gqa=True, is_causal="lower_right")
    assert folds == [True]
    want = _per_head(q, k.astype(np.float32), v.astype(np.float32))
    assert_close(got, want, np.float32, magnitude=finite_absmax(v.astype(np.float32)))


@pytest.mark.parametrize("group", [4, 5, 8], ids=["four_heads", "four_and_one", "two_fours"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_decode_is_bitwise_the_per_head_decode(isa, folds, group, dtype):
    """A folded decoding step runs a group's heads as rows of one problem,
    four at a time sharing each value load in P.V; each row's sums are those
    of the head run alone, so the bits are too (value widths with a tail of
    columns past the last whole vector; a key padded out, so one P.V block
    has a zero weight)."""
    rng = np.random.default_rng(group)
    q, k, v = _qkv(rng, 2, 2 * group, 2, 1, 300, 72, 136, dtype)
    pad = np.zeros((2, 300), bool)
    pad[:, 150] = True
    got = fastattn.attention(q, k, v, enable_gqa=True, key_padding_mask=pad)
    assert folds == [True]
    want = _per_head(q, k, v, key_padding_mask=pad)
    assert got.tobytes() == want.tobytes()
