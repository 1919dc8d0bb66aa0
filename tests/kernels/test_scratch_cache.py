"""The kernels' cache of freed scratch (src_c/runtime/alloc.c): a call that
reuses another call's scratch gives the bits of a call on fresh memory, even
when every cached byte was set to NaN first; the cache stays within its
32 MiB; calls from several Python threads at once share it safely."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastattn
import fastattn._testing as _testing

CACHE_LIMIT = 32 << 20  # FA_CACHE_TOTAL


def _qkv(dtype, shape=(4, 256, 64), seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(3))


def _attention(dtype, nt):
    q, k, v = _qkv(dtype)
    return fastattn.attention(q, k, v, is_causal=True, return_lse=True, num_threads=nt)


def _backward(dtype, nt):
    q, k, v = _qkv(dtype)
    out, lse = fastattn.attention(q, k, v, window=(40, 3), return_lse=True, num_threads=nt)
    g = np.random.default_rng(1).standard_normal(out.shape, dtype=np.float32).astype(dtype)
    return fastattn.attention_backward(g, q, k, v, out, lse, window=(40, 3), num_threads=nt)


def _softmax(dtype, nt):
    # strided rows: the kernel gathers each into its thread's scratch
    x = np.random.default_rng(2).standard_normal((32768, 8), dtype=np.float32).astype(dtype)
    return (fastattn.softmax(x, axis=0),)


def _paged(dtype, nt):
    rng = np.random.default_rng(3)
    kc = rng.standard_normal((64, 16, 2, 64), dtype=np.float32)
    if dtype == "int8":
        scales = dict(key_scales=np.full((64, 16, 2), 0.01, np.float32),
                      value_scales=np.full((64, 16, 2), 0.02, np.float32))
        kc = np.clip(np.rint(kc * 40), -127, 127).astype(np.int8)
    else:
        scales = {}
        kc = kc.astype(dtype)
    table = rng.permutation(64).astype(np.int32).reshape(4, 16)
    lens = np.array([250, 7, 256, 129])
    cu = np.array([0, 1, 2, 66, 67])
    q = rng.standard_normal((67, 8, 64), dtype=np.float32)
    return fastattn.attention_paged(q, kc, kc[::-1], table, lens, cu_seqlens_q=cu,
                                    return_lse=True, num_threads=nt, **scales)


CALLS = {"attention": _attention, "backward": _backward, "softmax": _softmax,
         "paged": _paged}


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("nt", [1, 2])
def test_scratch_reused_from_the_cache_holds_no_stale_values(isa, name, dtype, nt):
    call = CALLS[name]
    if dtype == "bfloat16":
        dtype = fastattn._half.as_storage_dtype("bfloat16")
    _testing.release_cached()
    want = call(dtype, nt)
    assert _testing.cached_bytes() > 0  # the call left its scratch for the next
    _testing.poison_cached(0xFF)  # every cached float a NaN
    got = call(dtype, nt)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("nt", [1, 2])
def test_int8_paged_decode_reuses_poisoned_scratch_bitwise(isa, nt):
    _testing.release_cached()
    want = _paged("int8", nt)
    _testing.poison_cached(0xFF)
    got = _paged("int8", nt)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_cache_stays_within_its_limit_and_can_be_emptied():
    _testing.release_cached()
    assert _testing.cached_bytes() == 0
    rng = np.random.default_rng(4)
    for n in (64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048):
        q = rng.standard_normal((8, n, 64), dtype=np.float32)
        out, lse = fastattn.attention(q, q, q, return_lse=True, num_threads=2)
        fastattn.attention_backward(out, q, q, q, out, lse, num_threads=2)
        assert 0 < _testing.cached_bytes() <= CACHE_LIMIT
    _testing.release_cached()
    assert _testing.cached_bytes() == 0


def test_calls_from_several_python_threads_share_the_cache_safely():
    shapes = [(4, n, 64) for n in (96, 128, 200, 256)] * 4
    inputs = [_qkv(np.float32, s, seed=i) for i, s in enumerate(shapes)]

    def run(qkv):
        q, k, v = qkv
        out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True, num_threads=1)
        return (out, lse) + fastattn.attention_backward(out, q, k, v, out, lse, None, True,
                                                        num_threads=1)

    _testing.release_cached()
    want = [run(x) for x in inputs]
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(run, inputs))
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                np.testing.assert_array_equal(a, b)
