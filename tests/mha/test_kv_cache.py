"""fastattn.mha.KVCache: prefill then decode equals one causal call, chunked
appends, masks, views without copies, and a cache left unchanged by a failed
call or an overflow."""

import numpy as np
import pytest

from fastattn.mha import KVCache, multi_head_attention
from mha_common import F16_REL, make


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 3e-5), (np.float64, 1e-11)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cache_prefill_then_decode_matches_one_causal_call(rng, dtype, tol, kv_heads):
    T, prefill = 11, 4
    x, _, w_q, w_k, w_v, w_o = make(rng, n=2, L=T, heads=4, kv_heads=kv_heads, d_k=4,
                                    d_v=3, dtype=dtype)
    full = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, num_kv_heads=kv_heads,
                                is_causal=True)
    cache = KVCache(2, kv_heads, 4, max_len=16, dtype=dtype, value_dim=3)
    parts = [multi_head_attention(x[:, :prefill], w_q, w_k, w_v, w_o, 4,
                                  num_kv_heads=kv_heads, kv_cache=cache)]
    assert len(cache) == prefill
    for t in range(prefill, T):
        parts.append(multi_head_attention(x[:, t:t + 1], w_q, w_k, w_v, w_o, 4,
                                          num_kv_heads=kv_heads, kv_cache=cache))
        assert len(cache) == t + 1
    steps = np.concatenate(parts, axis=1)
    assert steps.dtype == dtype
    np.testing.assert_allclose(steps, full, rtol=tol, atol=tol)
    # the cache holds exactly the keys/values of the whole sequence
    d_k = 4
    for g in range(kv_heads):
        k_g = x.astype(np.float64) @ w_k[:, g * d_k:(g + 1) * d_k].astype(np.float64)
        np.testing.assert_allclose(cache.keys[:, g], k_g, rtol=tol, atol=tol)


def test_cache_chunks_and_2d_input_and_weights(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=0, L=9)
    full, w_full = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, is_causal=True,
                                        return_weights=True)
    cache = KVCache(1, 4, 3, max_len=9, dtype=np.float64)
    outs = []
    for a, b in [(0, 3), (3, 5), (5, 6), (6, 9)]:
        o, w = multi_head_attention(x[a:b], w_q, w_k, w_v, w_o, 4, kv_cache=cache,
                                    is_causal=True, return_weights=True)
        assert o.shape == (b - a, 7) and w.shape == (4, b - a, b)
        np.testing.assert_allclose(w, w_full[:, a:b, :b], rtol=1e-11, atol=1e-13)
        outs.append(o)
    np.testing.assert_allclose(np.concatenate(outs), full, rtol=1e-11, atol=1e-11)
    assert len(cache) == cache.max_len == 9


def test_cache_with_masks(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=2, L=6)
    kpm = np.zeros((2, 6), bool)
    kpm[0, 1] = True
    full = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, is_causal=True,
                                key_padding_mask=kpm)
    cache = KVCache(2, 4, 3, max_len=6, dtype=np.float64)
    outs = [multi_head_attention(x[:, :3], w_q, w_k, w_v, w_o, 4, kv_cache=cache,
                                 key_padding_mask=kpm[:, :3])]
    for t in range(3, 6):
        outs.append(multi_head_attention(x[:, t:t + 1], w_q, w_k, w_v, w_o, 4,
                                         kv_cache=cache, key_padding_mask=kpm[:, :t + 1]))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-11, atol=1e-11)


def test_decode_step_uses_cache_views_without_copies(rng, spy):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=2, L=8, kv_heads=2, dtype=np.float32)
    cache = KVCache(2, 2, 3, max_len=64, dtype=np.float32)
    multi_head_attention(x[:, :7], w_q, w_k, w_v, w_o, 4, num_kv_heads=2, kv_cache=cache)
    spy.clear()
    multi_head_attention(x[:, 7:], w_q, w_k, w_v, w_o, 4, num_kv_heads=2, kv_cache=cache)
    (args, kwargs), = spy
    q, k, v = args[:3]
    causal = args[4] if len(args) > 4 else kwargs.get("is_causal")
    assert causal == "lower_right"
    assert q.shape == (2, 4, 1, 3)                 # only the new token was projected
    assert k.shape == (2, 2, 8, 3) and v.shape == (2, 2, 8, 3)
    assert np.shares_memory(k, cache.keys) and np.shares_memory(v, cache.values)
    assert k.base is not None and v.base is not None   # views of the preallocated storage


def test_cache_overflow_leaves_cache_unchanged(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=2, L=6)
    cache = KVCache(2, 4, 3, max_len=5, dtype=np.float64)
    multi_head_attention(x[:, :4], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    keys, values = cache.keys.copy(), cache.values.copy()
    storage = cache._keys.copy(), cache._values.copy()
    with pytest.raises(ValueError, match="max_len=5"):
        multi_head_attention(x[:, 4:6], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    with pytest.raises(ValueError, match="max_len"):
        cache.append(np.zeros((2, 4, 2, 3)), np.zeros((2, 4, 2, 3)))
    assert len(cache) == 4
    np.testing.assert_array_equal(cache.keys, keys)
    np.testing.assert_array_equal(cache.values, values)
    np.testing.assert_array_equal(cache._keys, storage[0])
    np.testing.assert_array_equal(cache._values, storage[1])
    # exactly full is fine
    multi_head_attention(x[:, 4:5], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    assert len(cache) == 5


def test_failed_call_leaves_cache_unchanged(rng, monkeypatch):
    import fastattn._api as api

    x, _, w_q, w_k, w_v, w_o = make(rng, n=2, L=4)
    cache = KVCache(2, 4, 3, max_len=8, dtype=np.float64)
    multi_head_attention(x[:, :2], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    keys = cache.keys.copy()
    with pytest.raises(ValueError, match="attn_mask"):
        multi_head_attention(x[:, 2:3], w_q, w_k, w_v, w_o, 4, kv_cache=cache,
                             attn_mask=np.ones((1, 2), bool))   # S must be 3
    with pytest.raises(ValueError, match="key_padding_mask"):
        multi_head_attention(x[:, 2:3], w_q, w_k, w_v, w_o, 4, kv_cache=cache,
                             key_padding_mask=np.zeros((2, 2), bool))

    def broken(*args, **kwargs):
        raise RuntimeError("kernel failure")

    monkeypatch.setattr(api, "attention", broken)
    with pytest.raises(RuntimeError):
        multi_head_attention(x[:, 2:3], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    assert len(cache) == 2
    np.testing.assert_array_equal(cache.keys, keys)


def test_cache_views_are_read_only_and_reset(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=1, L=4)
    cache = KVCache(1, 4, 3, max_len=8, dtype=np.float64, value_dim=3)
    assert len(cache) == 0 and cache.keys.shape == (1, 4, 0, 3)
    first = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    k, v = cache.keys, cache.values
    assert k.shape == (1, 4, 4, 3) and v.shape == (1, 4, 4, 3)
    assert not k.flags.writeable and not v.flags.writeable
    with pytest.raises(ValueError):
        k[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError):
        v[...] = 0.0
    assert (cache.batch_size, cache.num_kv_heads, cache.head_dim, cache.value_dim,
            cache.max_len, cache.dtype) == (1, 4, 3, 3, 8, np.float64)
    assert "len=4" in repr(cache)
    cache.reset()
    assert len(cache) == 0 and cache.keys.shape == (1, 4, 0, 3)
    again = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    np.testing.assert_array_equal(again, first)
    assert len(cache) == 4


def test_cache_append_validates(rng):
    cache = KVCache(2, 3, 4, max_len=5, value_dim=2)
    assert cache.dtype == np.float32 and cache.value_dim == 2
    with pytest.raises(ValueError, match="keys"):
        cache.append(np.zeros((2, 3, 1, 5)), np.zeros((2, 3, 1, 2)))
    with pytest.raises(ValueError, match="values"):
        cache.append(np.zeros((2, 3, 1, 4)), np.zeros((2, 3, 2, 2)))
    with pytest.raises(TypeError, match="cannot be stored"):
        cache.append(np.zeros((2, 3, 1, 4), complex), np.zeros((2, 3, 1, 2)))
    assert len(cache) == 0
    cache.append(np.ones((2, 3, 2, 4)), np.ones((2, 3, 2, 2)))
    assert len(cache) == 2 and cache.keys.dtype == np.float32


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((0, 1, 1, 1), {}, ValueError, "batch_size"),
    ((1, 1, 1, 0), {}, ValueError, "max_len"),
    ((1, 2.0, 1, 1), {}, TypeError, "num_kv_heads"),
    ((1, 1, True, 1), {}, TypeError, "head_dim"),
    ((1, 1, 1, 1), {"value_dim": -1}, ValueError, "value_dim"),
    ((1, 1, 1, 1), {"dtype": np.int32}, TypeError, "dtype"),
    ((1, 1, 1, 1), {"dtype": np.complex128}, TypeError, "dtype"),
])
def test_cache_constructor_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        KVCache(*args, **kwargs)


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
def test_float16_cache(rng, cache_dtype):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=1, L=6, d_k=4)
    x, w_q, w_k, w_v, w_o = (a.astype(np.float16) for a in (x, w_q, w_k, w_v, w_o))
    full = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, is_causal=True)
    cache = KVCache(1, 4, 4, max_len=6, dtype=cache_dtype)
    parts = [multi_head_attention(x[:, :3], w_q, w_k, w_v, w_o, 4, kv_cache=cache)]
    for t in range(3, 6):
        parts.append(multi_head_attention(x[:, t:t + 1], w_q, w_k, w_v, w_o, 4,
                                          kv_cache=cache))
    steps = np.concatenate(parts, axis=1)
    assert steps.dtype == np.float16 and cache.keys.dtype == cache_dtype
    if cache_dtype == np.float32:
        # float32 cache: the same float32 computation, rounded once
        np.testing.assert_allclose(steps.astype(np.float32), full.astype(np.float32),
                                   rtol=2 * F16_REL, atol=1e-4 * np.abs(full).max())
    else:
        # K and V are rounded to float16 in the cache: a few float16 ulps
        np.testing.assert_allclose(steps.astype(np.float32), full.astype(np.float32),
                                   rtol=4e-3, atol=4e-3 * np.abs(full).max())
    with pytest.raises(TypeError, match="dtype"):      # a float32 call, float16 cache
        multi_head_attention(x[:, :1].astype(np.float32), w_q, w_k, w_v, w_o, 4,
                             kv_cache=KVCache(1, 4, 4, max_len=6, dtype=np.float16))
    with pytest.raises(TypeError, match="dtype"):      # a float16 call, float64 cache
        multi_head_attention(x[:, :1], w_q, w_k, w_v, w_o, 4,
                             kv_cache=KVCache(1, 4, 4, max_len=6, dtype=np.float64))
