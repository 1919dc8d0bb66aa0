"""softcap, alibi_slopes, sinks and return_lse against fastattn.reference.

Every option alone and in every combination, with masks, both causal
alignments, grouped-query heads, ``out=``, the weights path, decoding
(L = 1..8 against long S: the direct and key-split paths), every dtype and
ISA path, and thread counts (bitwise equal); a hypothesis property; the
named edge cases.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from conftest import assert_close, examples, finite_absmax, reference_attention

OPTS = ("softcap", "alibi_slopes", "sinks")


def _qkv(rng, dt, B, H, L, S, E, Hkv=None, Ev=None):
    Hkv = H if Hkv is None else Hkv
    q = (rng.standard_normal((B, H, L, E)) * 2).astype(dt)
    k = (rng.standard_normal((B, Hkv, S, E)) * 2).astype(dt)
    v = rng.standard_normal((B, Hkv, S, E if Ev is None else Ev)).astype(dt)
    return q, k, v


def _options(rng, names, H):
    kw = {}
    if "softcap" in names:
        kw["softcap"] = 2.5
    if "alibi_slopes" in names:
        kw["alibi_slopes"] = rng.uniform(0.01, 0.5, H)
    if "sinks" in names:
        kw["sinks"] = rng.standard_normal(H) * 2
    return kw


def _check(got, want, dtype, factor=1.0):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        assert_close(g, w, dtype, magnitude=finite_absmax(w), factor=factor)


COMBOS = [c for n in range(4) for c in itertools.combinations(OPTS, n)]


@pytest.mark.parametrize("names", COMBOS, ids=["+".join(c) or "none" for c in COMBOS])
@pytest.mark.parametrize("causal", [False, True, "lower_right"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_every_combination(isa, rng, names, causal, return_weights):
    for dt in (np.float32, np.float64):
        q, k, v = _qkv(rng, dt, 2, 3, 37, 150, 24, Ev=20)
        kw = dict(_options(rng, names, 3), is_causal=causal, return_lse=True,
                  return_weights=return_weights)
        _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)


@pytest.mark.parametrize("names", COMBOS[1:], ids=["+".join(c) for c in COMBOS[1:]])
@pytest.mark.parametrize("mask", ["bool", "additive", "padding"])
def test_with_masks(isa, rng, names, mask):
    dt = np.float32
    q, k, v = _qkv(rng, dt, 2, 2, 70, 140, 16)
    kw = _options(rng, names, 2)
    if mask == "bool":
        kw["attn_mask"] = rng.random((70, 140)) < 0.7
    elif mask == "additive":
        kw["attn_mask"] = np.where(rng.random((2, 1, 70, 140)) < 0.2, -np.inf,
                                   rng.standard_normal((2, 1, 70, 140))).astype(dt)
    else:
        kw["key_padding_mask"] = rng.random((2, 140)) < 0.3
    for causal in (False, "lower_right"):
        kw.update(is_causal=causal, return_lse=True)
        _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)


@pytest.mark.parametrize("L", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("causal", [False, "lower_right"])
def test_decoding_direct_and_key_split(isa, rng, L, causal):
    """L <= 8 reads K and V in place; S > 1024 splits the keys (merged once,
    then the sink and lse)."""
    for dt in (np.float32, np.float64):
        q, k, v = _qkv(rng, dt, 1, 2, L, 3000, 32)
        kw = dict(_options(rng, OPTS, 2), is_causal=causal, return_lse=True)
        _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)
        for name in OPTS:
            kw1 = dict(_options(rng, (name,), 2), is_causal=causal, return_lse=True)
            _check(fastattn.attention(q, k, v, **kw1), reference_attention(q, k, v, **kw1), dt)


@pytest.mark.parametrize("L", [1, 4, 100])
def test_grouped_query_heads(isa, rng, L):
    dt = np.float32
    q, k, v = _qkv(rng, dt, 2, 6, L, 1500, 16, Hkv=2)
    kw = dict(_options(rng, OPTS, 6), is_causal="lower_right", return_lse=True,
              enable_gqa=True)
    _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)
    # per (batch, head) values
    kw.update(alibi_slopes=rng.uniform(0, 0.3, (2, 6)), sinks=rng.standard_normal((2, 6)))
    _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)
    kw["return_weights"] = True
    _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt)


def test_out_is_filled_and_returned_with_lse(rng):
    for dt in (np.float32, np.float64, np.float16):
        q, k, v = _qkv(rng, dt, 1, 2, 20, 50, 8)
        out = np.empty((1, 2, 50, 8), dt)[:, :, :20]
        kw = dict(_options(rng, OPTS, 2), return_lse=True, is_causal=True)
        res, lse = fastattn.attention(q, k, v, out=out, **kw)
        assert res is out
        want, wlse = reference_attention(q, k, v, **kw)
        cdt = np.float64 if dt == np.float64 else np.float32
        assert lse.dtype == cdt and wlse.dtype == cdt and lse.shape == (1, 2, 20)
        _check((res, lse), (want, wlse), dt)


def test_float16_input_lse_is_float32(rng):
    q, k, v = _qkv(rng, np.float16, 1, 2, 10, 30, 8)
    out, w, lse = fastattn.attention(q, k, v, return_weights=True, return_lse=True, softcap=3.0)
    assert out.dtype == np.float16 and w.dtype == np.float16 and lse.dtype == np.float32
    _check((out, w, lse), reference_attention(q, k, v, return_weights=True, return_lse=True,
                                              softcap=3.0), np.float16)


@pytest.mark.parametrize("shape", [(1, 2, 3, 3000, 16), (2, 2, 150, 300, 32), (1, 4, 1, 700, 8)])
def test_thread_counts_bitwise_equal(isa, rng, shape):
    B, H, L, S, E = shape
    q, k, v = _qkv(rng, np.float32, B, H, L, S, E)
    kw = dict(_options(rng, OPTS, H), is_causal="lower_right", return_lse=True)
    first = fastattn.attention(q, k, v, num_threads=1, **kw)
    for nt in (2, 3):
        again = fastattn.attention(q, k, v, num_threads=nt, **kw)
        for a, b in zip(first, again):
            assert np.array_equal(a, b, equal_nan=True)


def test_options_off_match_plain_call_bitwise(isa, rng):
    """return_lse alone changes nothing in the output."""
    for L in (1, 5, 70):
        q, k, v = _qkv(rng, np.float32, 1, 2, L, 2000, 16)
        plain = fastattn.attention(q, k, v, is_causal="lower_right")
        out, lse = fastattn.attention(q, k, v, is_causal="lower_right", return_lse=True)
        assert np.array_equal(plain, out)


def test_lse_merges_over_a_key_split(isa, rng):
    """merge_attention of two real calls over disjoint keys equals the whole."""
    q, k, v = _qkv(rng, np.float64, 2, 3, 9, 400, 16)
    kw = dict(softcap=4.0, alibi_slopes=None)
    whole, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
    parts = [fastattn.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True, **kw)
             for a, b in ((0, 150), (150, 400))]
    out, mlse = fastattn.merge_attention([p[0] for p in parts], [p[1] for p in parts])
    _check((out, mlse), (whole, lse), np.float64)


# ---------------------------------------------------------------------------
# named edge cases
# ---------------------------------------------------------------------------

def test_all_hidden_rows_with_sinks_give_zeros_and_minus_inf_lse(isa, rng):
    q, k, v = _qkv(rng, np.float32, 1, 2, 6, 40, 8)
    mask = np.ones((6, 40), bool)
    mask[2] = False
    for rw in (False, True):
        res = fastattn.attention(q, k, v, attn_mask=mask, sinks=[5.0, -1.0], return_lse=True,
                                 return_weights=rw)
        assert np.all(res[0][:, :, 2] == 0) and np.all(res[-1][:, :, 2] == -np.inf)
        _check(res, reference_attention(q, k, v, attn_mask=mask, sinks=[5.0, -1.0],
                                        return_lse=True, return_weights=rw), np.float32)


def test_sink_far_above_the_scores_does_not_overflow(isa, rng):
    q, k, v = _qkv(rng, np.float32, 1, 2, 5, 300, 8)
    for L in (5, 1):
        kw = dict(sinks=[80.0, 1e30], return_lse=True)
        out, lse = fastattn.attention(q[:, :, :L], k, v, **kw)
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
        _check((out, lse), reference_attention(q[:, :, :L], k, v, **kw), np.float32)


def test_minus_inf_sink_is_no_sink(isa, rng):
    q, k, v = _qkv(rng, np.float64, 1, 2, 7, 60, 8)
    a = fastattn.attention(q, k, v, sinks=[-np.inf, -np.inf], return_lse=True)
    b = fastattn.attention(q, k, v, return_lse=True)
    _check(a, b, np.float64)


def test_softcap_with_minus_inf_additive_mask(isa, rng):
    q, k, v = _qkv(rng, np.float32, 1, 2, 9, 50, 8)
    m = np.where(rng.random((9, 50)) < 0.3, -np.inf, 0.5).astype(np.float32)
    m[4] = -np.inf
    kw = dict(attn_mask=m, softcap=1.5, return_lse=True)
    for rw in (False, True):
        res = fastattn.attention(q, k, v, return_weights=rw, **kw)
        _check(res, reference_attention(q, k, v, return_weights=rw, **kw), np.float32)
        assert np.all(res[-1][:, :, 4] == -np.inf)


def test_softcap_bounds_the_logits(isa, rng):
    """Huge scores: every logit within [-cap, cap], so lse <= cap + log(S)."""
    q, k, v = _qkv(rng, np.float32, 1, 1, 4, 30, 8)
    out, lse = fastattn.attention(q * 1e4, k, v, softcap=2.0, return_lse=True)
    assert np.all(lse <= 2.0 + np.log(30) + 1e-5)
    _check((out, lse), reference_attention(q * 1e4, k, v, softcap=2.0, return_lse=True),
           np.float32)


def test_nan_score_row_gives_nan_lse(isa, rng):
    q, k, v = _qkv(rng, np.float32, 1, 1, 4, 30, 8)
    q[0, 0, 1, 0] = np.nan
    for rw in (False, True):
        res = fastattn.attention(q, k, v, sinks=[0.5], return_lse=True, return_weights=rw)
        assert np.isnan(res[-1][0, 0, 1]) and np.all(np.isfinite(res[-1][0, 0, [0, 2, 3]]))


# ---------------------------------------------------------------------------
# a property over shapes, options and paths
# ---------------------------------------------------------------------------

@settings(max_examples=examples(60))
@given(data=st.data())
def test_property_matches_reference(isa, data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    dt = d(st.sampled_from([np.float32, np.float64]))
    H = d(st.integers(1, 3))
    L = d(st.integers(1, 40))
    S = d(st.integers(0, 300))
    E = d(st.integers(1, 20))
    q, k, v = _qkv(rng, dt, 1, H, L, S, E)
    kw = dict(is_causal=d(st.sampled_from([False, True, "lower_right"])),
              return_lse=d(st.booleans()), return_weights=d(st.booleans()))
    if d(st.booleans()):
        kw["softcap"] = d(st.floats(0.1, 50))
    if d(st.booleans()):
        kw["alibi_slopes"] = rng.uniform(0, 1, H)
    if d(st.booleans()):
        kw["sinks"] = rng.standard_normal(H) * 3
    _check(fastattn.attention(q, k, v, **kw), reference_attention(q, k, v, **kw), dt,
           factor=2.0)


# ---------------------------------------------------------------------------
# multi_head_attention and KVCache decoding pass the options through
# ---------------------------------------------------------------------------

def _mha_weights(rng, d_model, heads, kv_heads, d_k, dt):
    return (rng.standard_normal((d_model, heads * d_k)).astype(dt) / 4,
            rng.standard_normal((d_model, kv_heads * d_k)).astype(dt) / 4,
            rng.standard_normal((d_model, kv_heads * d_k)).astype(dt) / 4,
            rng.standard_normal((heads * d_k, d_model)).astype(dt) / 4)


def test_multi_head_attention_passes_the_options(rng):
    from fastattn.mha import multi_head_attention
    n, L, d_model, heads, kv_heads, d_k = 2, 7, 16, 4, 2, 4
    x = rng.standard_normal((n, L, d_model))
    w_q, w_k, w_v, w_o = _mha_weights(rng, d_model, heads, kv_heads, d_k, np.float64)
    kw = dict(_options(rng, OPTS, heads), is_causal=True)
    out, w, lse = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, num_kv_heads=kv_heads,
                                       return_weights=True, return_lse=True, **kw)
    q = (x @ w_q).reshape(n, L, heads, d_k).transpose(0, 2, 1, 3)
    k = (x @ w_k).reshape(n, L, kv_heads, d_k).transpose(0, 2, 1, 3)
    v = (x @ w_v).reshape(n, L, kv_heads, d_k).transpose(0, 2, 1, 3)
    ho, hw, hl = reference_attention(q, k, v, enable_gqa=True, return_weights=True,
                                     return_lse=True, **kw)
    want = ho.transpose(0, 2, 1, 3).reshape(n, L, heads * d_k) @ w_o
    assert lse.shape == (n, heads, L)
    _check((out, w, lse), (want, hw, hl), np.float64)
    # unbatched input: (num_heads, L)
    o1, l1 = multi_head_attention(x[0], w_q, w_k, w_v, w_o, heads, num_kv_heads=kv_heads,
                                  return_lse=True, **kw)
    assert l1.shape == (heads, L)
    _check((o1, l1), (out[0], lse[0]), np.float64)


def test_kv_cache_decoding_equals_the_full_causal_call(isa, rng):
    from fastattn.mha import KVCache, multi_head_attention
    n, T, d_model, heads, kv_heads, d_k = 2, 9, 16, 4, 2, 4
    x = rng.standard_normal((n, T, d_model)).astype(np.float32)
    ws = _mha_weights(rng, d_model, heads, kv_heads, d_k, np.float32)
    kw = _options(rng, OPTS, heads)
    full, lse = multi_head_attention(x, *ws, heads, num_kv_heads=kv_heads, is_causal=True,
                                     return_lse=True, **kw)
    cache = KVCache(n, kv_heads, d_k, max_len=T, dtype=np.float32)
    steps = [multi_head_attention(x[:, :4], *ws, heads, num_kv_heads=kv_heads, kv_cache=cache,
                                  return_lse=True, **kw)]
    for t in range(4, T):
        steps.append(multi_head_attention(x[:, t:t + 1], *ws, heads, num_kv_heads=kv_heads,
                                          kv_cache=cache, return_lse=True, **kw))
    _check((np.concatenate([s[0] for s in steps], axis=1),
            np.concatenate([s[1] for s in steps], axis=2)), (full, lse), np.float32, factor=5.0)


def test_kv_cache_left_unchanged_on_a_bad_option(rng):
    from fastattn.mha import KVCache, multi_head_attention
    x = rng.standard_normal((1, 3, 16))
    ws = _mha_weights(rng, 16, 4, 2, 4, np.float64)
    cache = KVCache(1, 2, 4, max_len=8, dtype=np.float64)
    with pytest.raises(ValueError, match="sinks"):
        multi_head_attention(x, *ws, 4, num_kv_heads=2, kv_cache=cache, sinks=[np.nan] * 4)
    assert len(cache) == 0


def test_allocation_failure_leaves_out_untouched(rng):
    """Every scratch allocation comes before any output (out, lse) is written."""
    import fastattn._testing as _testing
    q, k, v = _qkv(rng, np.float32, 1, 2, 3, 3000, 16)      # decoding: key split
    kw = dict(_options(rng, OPTS, 2), return_lse=True)
    want = fastattn.attention(q, k, v, **kw)
    for n in range(0, 40):
        out = np.full((1, 2, 3, 16), -7.0, np.float32)
        _testing.fail_alloc_after(n)
        try:
            res = fastattn.attention(q, k, v, out=out, **kw)
        except MemoryError:
            assert np.all(out == -7.0)
            continue
        finally:
            _testing.fail_alloc_after(-1)
        assert np.array_equal(res[0], want[0]) and np.array_equal(res[1], want[1])
        break
    else:
        raise AssertionError("never succeeded")
