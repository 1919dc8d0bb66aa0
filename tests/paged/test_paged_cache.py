"""PagedKVCache: sequences added, appended per layer, forked (sharing full
blocks), freed; out of blocks leaves every sequence as it was; attend
against the reference over each sequence's own rows."""

import numpy as np
import pytest

import fastattn
from fastattn import reference


def _rows(rng, n, h=2, e=4):
    return rng.standard_normal((n, h, e)).astype(np.float32)


def _state(cache, ids, layers=1):
    return ([cache.block_table(ids).tolist(), cache.num_free_blocks] +
            [cache.seq_lens(ids, layer).tolist() for layer in range(layers)] +
            [cache.key_cache(layer).copy() for layer in range(layers)])


def _same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, "int8"])
def test_append_and_attend_match_the_reference(rng, layout, dtype):
    cache = fastattn.PagedKVCache(16, 4, 2, 4, dtype=dtype, layout=layout)
    seqs, kept = [cache.add(), cache.add()], []
    for sid, chunks in zip(seqs, ([5, 1, 3], [2, 7])):
        ks, vs = [], []
        for n in chunks:
            k, v = _rows(rng, n), _rows(rng, n)
            cache.append(sid, k, v)
            ks.append(k), vs.append(v)
        kept.append((np.concatenate(ks), np.concatenate(vs)))
    assert cache.seq_lens(seqs).tolist() == [9, 9]
    q = rng.standard_normal((2, 4, 4)).astype(np.float32)
    out = cache.attend(q, seqs)
    for b, (k, v) in enumerate(kept):
        ref = reference.attention(q[b].reshape(2, 2, 4), k.swapaxes(0, 1), v.swapaxes(0, 1))
        tol = 2e-2 if dtype == "int8" else 1e-5     # int8: the quantisation's error
        np.testing.assert_allclose(out[b].reshape(2, 2, 4), ref, rtol=tol, atol=tol)


def test_fork_shares_full_blocks_and_copies_the_partial_one(rng):
    cache = fastattn.PagedKVCache(8, 4, 2, 4)
    a = cache.add()
    cache.append(a, _rows(rng, 6), _rows(rng, 6))
    b = cache.fork(a)
    ta, tb = cache.block_table([a]), cache.block_table([b])
    assert ta[0, 0] == tb[0, 0] and ta[0, 1] != tb[0, 1]
    assert cache.num_free_blocks == 5
    q = np.repeat(rng.standard_normal((1, 2, 4)).astype(np.float32), 2, axis=0)
    out = cache.attend(q, [a, b])
    np.testing.assert_array_equal(out[0], out[1])
    cache.append(b, _rows(rng, 1), _rows(rng, 1))      # b's own block: a unchanged
    np.testing.assert_array_equal(cache.attend(q[:1], [a]), out[:1])
    cache.free(a)
    assert cache.num_free_blocks == 6                  # the shared block is b's still
    cache.free(b)
    assert cache.num_free_blocks == 8


def test_layers_hold_the_same_blocks_with_their_own_rows(rng):
    cache = fastattn.PagedKVCache(6, 4, 2, 4, num_layers=2)
    s = cache.add()
    r0, r1 = _rows(rng, 5), _rows(rng, 5)
    cache.append(s, r0, r0, layer=0)
    cache.append(s, r1, r1, layer=1)
    assert cache.num_free_blocks == 4
    q = rng.standard_normal((1, 2, 4)).astype(np.float32)
    o0, o1 = cache.attend(q, [s], layer=0), cache.attend(q, [s], layer=1)
    ref = reference.attention(q[0][:, None], r1.swapaxes(0, 1), r1.swapaxes(0, 1))
    np.testing.assert_allclose(o1[0], ref[:, 0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(o0, o1)


def test_out_of_blocks_leaves_every_sequence_as_it_was(rng):
    cache = fastattn.PagedKVCache(3, 4, 2, 4)
    a, b = cache.add(), cache.add()
    cache.append(a, _rows(rng, 6), _rows(rng, 6))
    cache.append(b, _rows(rng, 3), _rows(rng, 3))
    before = _state(cache, [a, b])
    with pytest.raises(MemoryError, match="out of blocks: appending 6 tokens needs 2, 0 are free"):
        cache.append(b, _rows(rng, 6), _rows(rng, 6))
    _same(_state(cache, [a, b]), before)
    with pytest.raises(MemoryError, match="forking"):
        cache.fork(b)
    _same(_state(cache, [a, b]), before)


def test_failed_append_returns_its_blocks(rng):
    cache = fastattn.PagedKVCache(4, 4, 2, 4, dtype="int8")
    a = cache.add()
    bad = _rows(rng, 5)
    bad[4, 0, 0] = np.inf
    with pytest.raises(ValueError, match="not finite in float32"):
        cache.append(a, bad, bad)
    assert cache.num_free_blocks == 4 and cache.seq_lens([a]).tolist() == [0]


@pytest.mark.parametrize("key_shape, value_shape, match", [
    ((5, 1, 4), (5, 2, 4), r"key must have shape \(tokens, num_kv_heads=2, head_dim=4\), got \(5, 1, 4\)"),
    ((5, 2, 4), (5, 2, 3), r"value must have shape \(tokens=5, num_kv_heads=2, value_dim=4\)"),
    ((5, 2, 4), (4, 2, 4), r"value must have shape \(tokens=5, .* got \(4, 2, 4\)"),
])
def test_append_of_the_wrong_shape_is_a_value_error_even_with_no_block_free(
        rng, key_shape, value_shape, match):
    cache = fastattn.PagedKVCache(1, 4, 2, 4)
    a, b = cache.add(), cache.add()
    cache.append(a, _rows(rng, 4), _rows(rng, 4))
    before = _state(cache, [a, b])
    k, v = rng.standard_normal(key_shape), rng.standard_normal(value_shape)
    with pytest.raises(ValueError, match=match):
        cache.append(b, k, v)
    _same(_state(cache, [a, b]), before)


def test_unknown_sequence_and_layer():
    cache = fastattn.PagedKVCache(2, 4, 1, 4)
    with pytest.raises(KeyError, match="no sequence 5"):
        cache.free(5)
    seq = cache.add()
    with pytest.raises(KeyError, match="no sequence True"):  # not sequence 1
        cache.free(True)
    assert cache.length(seq) == 0
    with pytest.raises(ValueError, match="layer must be < num_layers = 1"):
        cache.key_cache(1)
    with pytest.raises(TypeError, match="dtype must be"):
        fastattn.PagedKVCache(2, 4, 1, 4, dtype=np.int32)


@pytest.mark.parametrize("num_blocks", [2**62, 2**40])
def test_pools_too_large_to_allocate_are_a_memory_error_naming_the_arguments(num_blocks):
    # 2**62 blocks: more bytes than NumPy can index; 2**40: more than any machine holds
    with pytest.raises(MemoryError, match=f"num_blocks={num_blocks}, block_size=16, .* needs "):
        fastattn.PagedKVCache(num_blocks, 16, 8, 128, num_layers=2)
