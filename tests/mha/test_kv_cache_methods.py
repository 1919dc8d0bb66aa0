"""KVCache.truncate and KVCache.check_room: what multi_head_attention uses to
check a step and to put the cache back after a failed one."""

from __future__ import annotations

import numpy as np
import pytest

from fastattn.mha import KVCache, multi_head_attention
from mha_common import make


def _rows(rng, n, dim=3):
    return rng.standard_normal((1, 2, n, dim)), rng.standard_normal((1, 2, n, dim))


@pytest.mark.parametrize("dtype", [np.float32, "int8"])
def test_truncate_keeps_the_first_positions_and_appends_after_them(rng, dtype):
    cache = KVCache(1, 2, 3, max_len=8, dtype=dtype)
    k1, v1 = _rows(rng, 3)
    cache.append(k1, v1)
    first_k, first_v = cache.keys[:, :, :2].copy(), cache.values[:, :, :2].copy()
    cache.append(*_rows(rng, 2))
    cache.truncate(2)
    assert len(cache) == 2 and cache.keys.shape == (1, 2, 2, 3)
    np.testing.assert_array_equal(cache.keys, first_k)
    np.testing.assert_array_equal(cache.values, first_v)
    if dtype == "int8":
        assert cache.key_scales.shape == cache.value_scales.shape == (1, 2, 2)
    k2, v2 = _rows(rng, 4)
    cache.append(k2, v2)
    assert len(cache) == 6
    fresh = KVCache(1, 2, 3, max_len=8, dtype=dtype)
    fresh.append(np.concatenate([k1[:, :, :2], k2], axis=2),
                 np.concatenate([v1[:, :, :2], v2], axis=2))
    np.testing.assert_array_equal(cache.keys, fresh.keys)
    np.testing.assert_array_equal(cache.values, fresh.values)


@pytest.mark.parametrize("length, error", [(-1, ValueError), (4, ValueError),
                                           (True, TypeError), (1.0, TypeError)])
def test_truncate_rejects_a_length_outside_the_filled_part(rng, length, error):
    cache = KVCache(1, 2, 3, max_len=8)
    cache.append(*_rows(rng, 3))
    keys = cache.keys.copy()
    with pytest.raises(error, match="length"):
        cache.truncate(length)
    assert len(cache) == 3
    np.testing.assert_array_equal(cache.keys, keys)


def test_truncate_to_the_length_itself_and_to_zero(rng):
    cache = KVCache(1, 2, 3, max_len=8)
    cache.append(*_rows(rng, 3))
    cache.truncate(3)
    assert len(cache) == 3
    cache.truncate(0)
    assert len(cache) == 0 and cache.keys.shape == (1, 2, 0, 3)


def test_check_room_raises_exactly_past_max_len(rng):
    cache = KVCache(1, 2, 3, max_len=5)
    cache.append(*_rows(rng, 3))
    cache.check_room(2)                      # exactly full is fine
    with pytest.raises(ValueError, match="holds 3 of max_len=5 .* cannot take 3 more"):
        cache.check_room(3)
    assert len(cache) == 3


@pytest.mark.parametrize("n,exc", [(-5, ValueError), (2.5, TypeError), ("a", TypeError),
                                   (True, TypeError)], ids=["negative", "float", "str", "bool"])
def test_check_room_refuses_what_is_not_a_count(n, exc):
    with pytest.raises(exc, match="n_new"):
        KVCache(1, 2, 3, max_len=5).check_room(n)


def test_failed_int8_step_leaves_the_cache_as_it_was(rng, monkeypatch):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=1, L=3, dtype=np.float32)
    cache = KVCache(1, 4, 3, max_len=8, dtype="int8")
    multi_head_attention(x[:, :2], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    keys, scales = cache.keys.copy(), cache.key_scales.copy()

    def broken(self, *args, **kwargs):
        raise RuntimeError("kernel failure")

    monkeypatch.setattr(KVCache, "attend", broken)
    with pytest.raises(RuntimeError):
        multi_head_attention(x[:, 2:3], w_q, w_k, w_v, w_o, 4, kv_cache=cache)
    assert len(cache) == 2
    np.testing.assert_array_equal(cache.keys, keys)
    np.testing.assert_array_equal(cache.key_scales, scales)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "int8"])
@pytest.mark.parametrize("shape", [(3, 4, 1, 8), (1, 4, 1, 8), (4, 1, 8), (2, 3, 1, 8),
                                   (2, 4, 1, 6)],
                         ids=["other_batch", "batch_of_one", "three_dims", "heads_not_a_multiple",
                              "other_head_dim"])
def test_attend_query_of_another_shape_is_refused_alike_for_every_dtype(rng, dtype, shape):
    # the float caches broadcast a query of another batch or rank, the int8
    # one refused it: the documented shape (batch, Hq, L, head_dim) for all
    cache = KVCache(2, 2, 8, 6, dtype=dtype)
    rows = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    cache.append(rows, rows)
    with pytest.raises(ValueError, match=r"query must have shape \(batch_size=2, Hq, L, "
                                         r"head_dim=8\) with Hq a multiple of num_kv_heads=2"):
        cache.attend(rng.standard_normal(shape).astype(np.float32))
