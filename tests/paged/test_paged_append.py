"""paged_append: rows land in their slots (either layout), negative slots
are skipped, rows are rounded once to the caches' dtype (float32 rows into
16-bit pools by the C writer as NumPy casts), pools of any strides get the
same bits, int8 caches quantise as KVCache does, and one call of many tokens
(spread over threads) writes what one call per token writes."""

import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn import _half


def _at(cache, layout, slot, bs):
    blk, off = divmod(slot, bs)
    return cache[blk, off] if layout == "NHD" else cache[blk, :, off]


@pytest.mark.parametrize("rows", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
def test_rows_land_in_their_slots_and_negative_slots_skip(rng, layout, dtype, rows):
    dt = _half.as_storage_dtype(dtype)
    bs, hkv = 4, 2
    shape = (3, bs, hkv, 5) if layout == "NHD" else (3, hkv, bs, 5)
    kc, vc = np.zeros(shape, dt), np.zeros(shape, dt)
    key = rng.standard_normal((4, hkv, 5)).astype(rows)
    value = rng.standard_normal((4, hkv, 5)).astype(rows)
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


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_float32_rows_round_once_into_16bit_pools_ties_overflow_subnormals_nan(isa, dtype):
    dt = _half.as_storage_dtype(dtype)
    one = np.float32(1.0).view(np.uint32)
    ties = (one + np.array([0x8000, 0x18000, 0x1000, 0x3000], np.uint32)).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 65519.0, 65520.0,
                        1e-45, 6e-8, 3e-8, 2.9e-8, 1e-40, 1.0, -2.5], np.float32)
    x = np.concatenate([ties, -ties, special, np.zeros(12, np.float32)]).reshape(3, 1, 12)
    kc, vc = np.zeros((2, 4, 1, 12), dt), np.zeros((2, 4, 1, 12), dt)
    fastattn.paged_append(kc, vc, np.array([5, 0, 2]), x, -x)
    with np.errstate(over="ignore"):  # the overflow to infinity is one of the cases
        want, neg = x.astype(dt), (-x).astype(dt)
    for got, w in ((kc[1, 1], want[0]), (kc[0, 0], want[1]), (kc[0, 2], want[2]),
                   (vc[0, 2], neg[2])):
        nan = np.isnan(w.astype(np.float32))
        assert (np.isnan(got.astype(np.float32)) == nan).all()
        assert (got.view(np.uint16)[~nan] == w.view(np.uint16)[~nan]).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16", "int8"])
def test_pools_of_any_strides_get_the_same_bits(rng, layout, dtype):
    # a pool whose columns are 2 elements apart is written by NumPy indexing,
    # a contiguous one by the C writer: the same rows, the same bits
    dt = np.dtype(np.int8) if dtype == "int8" else _half.as_storage_dtype(dtype)
    shape = (3, 4, 2, 6) if layout == "NHD" else (3, 2, 4, 6)
    wide = shape[:3] + (12,)
    pools = [np.zeros(shape, dt), np.zeros(shape, dt)]
    strided = [np.zeros(wide, dt)[..., ::2], np.zeros(wide, dt)[..., ::2]]
    scales = {}
    if dtype == "int8":
        sshape = (3, 4, 2)
        scales = [dict(key_scales=np.zeros(sshape, np.float32),
                       value_scales=np.zeros(sshape, np.float32)) for _ in range(2)]
    key = (rng.standard_normal((5, 2, 6)) * 3).astype(np.float32)
    value = (rng.standard_normal((5, 2, 6)) * 3).astype(np.float32)
    slots = np.array([3, 11, -1, 0, 6])
    fastattn.paged_append(*pools, slots, key, value, layout=layout, **(scales[0] if scales else {}))
    fastattn.paged_append(*strided, slots, key, value, layout=layout,
                          **(scales[1] if scales else {}))
    for a, b in zip(pools, strided):
        assert a.tobytes() == np.ascontiguousarray(b).tobytes()
    if scales:
        for name in ("key_scales", "value_scales"):
            assert scales[0][name].tobytes() == scales[1][name].tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_many_tokens_in_one_call_match_one_token_per_call(rng, dtype):
    # enough rows that the C writer spreads the tokens over threads
    dt = np.dtype(np.int8) if dtype == "int8" else _half.as_storage_dtype(dtype)
    T, hkv, e = 3000, 4, 64
    key = rng.standard_normal((T, hkv, e)).astype(np.float32)
    value = rng.standard_normal((T, hkv, e)).astype(np.float32)
    slots = rng.permutation(200 * 16)[:T]
    out = []
    for per_call in (T, 1):
        kc, vc = np.zeros((200, 16, hkv, e), dt), np.zeros((200, 16, hkv, e), dt)
        kw = {}
        if dtype == "int8":
            kw = dict(key_scales=np.zeros((200, 16, hkv), np.float32),
                      value_scales=np.zeros((200, 16, hkv), np.float32))
        for t0 in range(0, T if per_call == T else 40, per_call):
            sl = slots.copy()
            if per_call == 1:   # one token written, every other slot skipped
                sl[:] = -1
                sl[t0] = slots[t0]
            fastattn.paged_append(kc, vc, sl, key, value, **kw)
        out.append((kc, vc, kw))
    (k1, v1, s1), (k2, v2, s2) = out
    blk, off = slots[:40] // 16, slots[:40] % 16
    assert k1[blk, off].tobytes() == k2[blk, off].tobytes()
    assert v1[blk, off].tobytes() == v2[blk, off].tobytes()
    for name in s1:
        assert s1[name][blk, off].tobytes() == s2[name][blk, off].tobytes()


@pytest.mark.parametrize("which", ["key_cache", "key_scales"])
def test_a_pool_or_scales_whose_elements_overlap_are_refused_unwritten(which):
    # a writeable as_strided view (an expanded tensor's NumPy view): slots 1
    # and 5 were one place, the last write winning
    def one_block(shape, dt):
        base = np.zeros((1,) + shape[1:], dt)
        return base, np.lib.stride_tricks.as_strided(base, shape, (0,) + base.strides[1:],
                                                     writeable=True)
    int8 = which == "key_scales"
    dt = np.int8 if int8 else np.float32
    kbase, kc = one_block((2, 4, 1, 2), dt) if not int8 else (None, np.zeros((2, 4, 1, 2), dt))
    vc = np.zeros((2, 4, 1, 2), dt)
    scales = {}
    if int8:
        kbase, ks = one_block((2, 4, 1), np.float32)
        scales = dict(key_scales=ks, value_scales=np.zeros((2, 4, 1), np.float32))
    rows = np.arange(4, dtype=np.float32).reshape(2, 1, 2) + 1
    with pytest.raises(ValueError, match=f"{which}'s strides .* same memory"):
        fastattn.paged_append(kc, vc, np.array([1, 5]), rows, rows, **scales)
    assert not kbase.any() and not vc.any()


@pytest.mark.parametrize("case", ["same_pool", "overlapping_views", "same_scales", "scales_in_pool"])
def test_key_and_value_targets_sharing_memory_are_refused_unwritten(case):
    # the second write would replace the first: keys lost to values
    f32, i8 = np.float32, np.int8
    rows = np.ones((1, 1, 4), f32)
    scales = {}
    if case == "same_pool":
        kc = vc = np.zeros((2, 4, 1, 4), f32)
        names, watched = ("key_cache", "value_cache"), kc
    elif case == "overlapping_views":
        buf = np.zeros((3, 4, 1, 4), f32)
        kc, vc = buf[:2], buf[1:]
        names, watched = ("key_cache", "value_cache"), buf
    else:
        kc, vc = np.zeros((2, 4, 1, 4), i8), np.zeros((2, 4, 1, 4), i8)
        if case == "same_scales":
            s = np.zeros((2, 4, 1), f32)
            scales = dict(key_scales=s, value_scales=s)
            names, watched = ("key_scales", "value_scales"), s
        else:  # value_scales a float32 view of the value pool's bytes
            scales = dict(key_scales=np.zeros((2, 4, 1), f32),
                          value_scales=vc.reshape(-1)[:32].view(f32).reshape(2, 4, 1))
            names, watched = ("value_cache", "value_scales"), vc
    with pytest.raises(ValueError, match=f"{names[0]} .* and {names[1]} .* share memory"):
        fastattn.paged_append(kc, vc, np.array([0]), rows, 2 * rows, **scales)
    assert not watched.any() and not kc.any()


def test_key_and_value_halves_of_one_buffer_are_accepted():
    # (num_blocks, 2, block_size, Hkv, E): interleaved, no element shared
    buf = np.zeros((2, 2, 4, 1, 4), np.float32)
    rows = np.ones((1, 1, 4), np.float32)
    fastattn.paged_append(buf[:, 0], buf[:, 1], np.array([5]), rows, 2 * rows)
    assert buf[1, 0, 1, 0].tolist() == [1.0] * 4 and buf[1, 1, 1, 0].tolist() == [2.0] * 4
    assert buf.sum() == 12.0


@pytest.mark.parametrize("name", ["key", "value", "slot_mapping"])
def test_ragged_nested_list_raises_value_error_naming_the_argument(name):
    kc, vc = np.zeros((2, 4, 1, 2), np.float32), np.zeros((2, 4, 1, 2), np.float32)
    args = dict(key=np.ones((1, 1, 2), np.float32), value=np.ones((1, 1, 2), np.float32),
                slot_mapping=np.array([0]))
    args[name] = [[1, 2], [3]] if name == "slot_mapping" else [[[1.0, 2.0]], [[1.0]]]
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        fastattn.paged_append(kc, vc, args["slot_mapping"], args["key"], args["value"])
    assert not kc.any() and not vc.any()
