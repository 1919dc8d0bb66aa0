"""paged_append: rows land in their slots (either layout), negative slots
are skipped, rows are rounded once to the caches' dtype, and int8 caches
quantise as KVCache does."""

import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn import _half


def _at(cache, layout, slot, bs):
    blk, off = divmod(slot, bs)
    return cache[blk, off] if layout == "NHD" else cache[blk, :, off]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
def test_rows_land_in_their_slots_and_negative_slots_skip(rng, layout, dtype):
    dt = _half.as_storage_dtype(dtype)
    bs, hkv = 4, 2
    shape = (3, bs, hkv, 5) if layout == "NHD" else (3, hkv, bs, 5)
    kc, vc = np.zeros(shape, dt), np.zeros(shape, dt)
    key = rng.standard_normal((4, hkv, 5))
    value = rng.standard_normal((4, hkv, 5))
    slots = np.array([9, -1, 0, 11], np.int32)
    fastattn.paged_append(kc, vc, slots, key, value, layout=layout)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        np.testing.assert_array_equal(_at(kc, layout, s, bs), key[t].astype(dt))
        np.testing.assert_array_equal(_at(vc, layout, s, bs), value[t].astype(dt))
    assert np.count_nonzero(kc.astype(np.float32)) == 3 * hkv * 5


def test_int8_rows_quantised_as_kvcache_does(rng):
    bs, hkv = 4, 2
    kc, vc = np.zeros((3, bs, hkv, 6), np.int8), np.zeros((3, bs, hkv, 6), np.int8)
    ks, vs = np.zeros((3, bs, hkv), np.float32), np.zeros((3, bs, hkv), np.float32)
    key = rng.standard_normal((5, hkv, 6)).astype(np.float32)
    value = rng.standard_normal((5, hkv, 6)).astype(np.float32)
    key[2] = 0                                   # a row of zeros: scale 0
    slots = np.arange(5) + 3
    fastattn.paged_append(kc, vc, slots, key, value, key_scales=ks, value_scales=vs)
    ref = fastattn.KVCache(1, hkv, 6, 5, dtype="int8")
    ref.append(key.swapaxes(0, 1)[None], value.swapaxes(0, 1)[None])
    blk, off = slots // bs, slots % bs
    np.testing.assert_array_equal(kc[blk, off], ref.keys[0].swapaxes(0, 1))
    np.testing.assert_array_equal(vc[blk, off], ref.values[0].swapaxes(0, 1))
    np.testing.assert_array_equal(ks[blk, off], ref.key_scales[0].swapaxes(0, 1))
    np.testing.assert_array_equal(vs[blk, off], ref.value_scales[0].swapaxes(0, 1))


def test_appended_rows_attend_like_the_reference(rng):
    kc, vc = np.zeros((4, 8, 1, 4), np.float32), np.zeros((4, 8, 1, 4), np.float32)
    key, value = rng.standard_normal((2, 11, 1, 4)).astype(np.float32)
    table = np.array([[3, 1]], np.int32)
    slots = table[0, np.arange(11) // 8] * 8 + np.arange(11) % 8
    fastattn.paged_append(kc, vc, slots, key, value)
    q = rng.standard_normal((1, 1, 4)).astype(np.float32)
    out = fastattn.attention_paged(q, kc, vc, table, np.array([11]))
    ref = reference.attention(q[0], key[:, 0], value[:, 0])
    np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-6)
