"""The paged decoding step's kernels: one call per key block over its rows'
pointers whatever the page size (the bits do not depend on it), the
grouped query heads as the rows, and bfloat16 pools on the bfloat16 tiers'
kernels (avx512_bf16: VDPBF16PS, within the error bound of its bfloat16
weights; amx: the rows widened to float32).  Head sizes are multiples of 32
(those kernels' case) unless a test says otherwise."""

import numpy as np
import pytest

import fastattn
from fastattn import _half
from conftest import assert_close, finite_absmax
from paged_common import bf16_weights_bound, make_batch, reference_paged

LENS = [1, 5, 130, 700, 257, 1300]
CACHES = ["float32", "bfloat16", "float16"]
# the pool's dtype as a parameter, so that the bfloat16 tiers (whose
# kernels these tests are about) run the tests too (conftest.py)
BF16_POOL = pytest.mark.parametrize("pool", ["bfloat16"])


def _call(args, **kw):
    return fastattn.attention_paged(args["query"], args["key_cache"], args["value_cache"],
                                    args["block_table"], args["seq_lens"],
                                    cu_seqlens_q=args["cu_seqlens_q"], layout=args["layout"],
                                    **kw)


def _batch(lens, block_size, cache, *, query_16_bit=False, hq=8, hkv=2, e=64, ev=64,
           layout="HND"):
    """make_batch with the same keys, values and queries at every block size:
    each sequence's rows drawn from one generator and written to its pages."""
    args = make_batch(np.random.default_rng(5), lens, block_size=block_size, hq=hq, hkv=hkv,
                      e=e, ev=ev, layout=layout, dtype=cache)
    kdt = _half.as_storage_dtype(cache)
    draw = np.random.default_rng(6)
    for name, width in (("key_cache", e), ("value_cache", ev)):
        pool = args[name] if layout == "NHD" else args[name].swapaxes(1, 2)
        for b, n in enumerate(lens):
            rows = draw.standard_normal((n, hkv, width)).astype(kdt)
            for p in range(n):
                pool[args["block_table"][b, p // block_size], p % block_size] = rows[p]
    q = draw.standard_normal(args["query"].shape)
    args["query"] = q.astype(kdt if query_16_bit else args["query"].dtype)
    return args


def _check(args, cache, **opts):
    out, lse = _call(args, return_lse=True, **opts)
    ref, ref_lse = reference_paged(args, **opts)
    if cache == "float32":
        assert_close(out, ref, np.float32, finite_absmax(ref))
    else:
        # one rounding of a 16-bit result; the weights' bound (16-bit pools
        # read in float32 meet it too)
        ulp = 2.0 ** -(11 if cache == "float16" else 8) if out.dtype.itemsize == 2 else 0.0
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=ulp + 1e-5,
                                   atol=bf16_weights_bound(args, ref))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache,query_16_bit",
                         [("float32", False)] + [(c, q) for c in CACHES[1:] for q in (False, True)],
                         ids=["float32", "bfloat16", "bfloat16_query", "float16", "float16_query"])
def test_bits_identical_for_block_sizes_1_3_16_128_and_thread_counts(isa, cache, query_16_bit):
    runs = {}
    for bs in (1, 3, 16, 128):
        args = _batch(LENS, bs, cache, query_16_bit=query_16_bit)
        for t in (1, 2, 3):
            runs[bs, t] = _call(args, num_threads=t, return_lse=True)
    first = runs[16, 1]
    for key, got in runs.items():
        for a, b in zip(first, got):
            assert a.tobytes() == b.tobytes(), key


def test_float32_pages_of_64_kib_per_head_give_the_bits_of_small_pages(isa):
    # pages of 128 float32 keys of 128 elements in the HND layout: their
    # value rows run on for 64 KiB, which the avx2 tier reads while it
    # computes Q.K^T rather than prefetching them (the other layouts and
    # page sizes prefetch); the same sums, so the same bits
    lens = [1, 129, 300]
    runs = {}
    for bs, layout in ((128, "HND"), (128, "NHD"), (16, "HND")):
        args = _batch(lens, bs, "float32", e=128, ev=128, layout=layout)
        for t in (1, 2):
            runs[bs, layout, t] = _call(args, num_threads=t, return_lse=True)
    _check(_batch(lens, 128, "float32", e=128, ev=128), "float32")
    first = runs[128, "HND", 1]
    for key, got in runs.items():
        for a, b in zip(first, got):
            assert a.tobytes() == b.tobytes(), key


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("block_size", [1, 3, 16, 128])
@pytest.mark.parametrize("group", [1, 4, 8, 16], ids=lambda g: f"group{g}")
def test_groups_and_block_sizes_match_reference(isa, cache, block_size, group):
    # group 16 is past the direct kernels' rows (8): the copied keys' path
    args = _batch(LENS[:-1], block_size, cache, hq=2 * group, hkv=2, ev=96)
    _check(args, cache)


@BF16_POOL
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 8], ids=lambda g: f"group{g}")
def test_bfloat16_queries_in_groups_of_1_to_8_rows_match_reference(isa, pool, group):
    # Q.K^T on those kernels takes rows by fours, then 3, 2 or 1, each over key
    # tiles of 4, 8 or 16 and the last keys one by one (LENS: 1, 5, 130, ...)
    args = _batch(LENS, 16, pool, query_16_bit=True, hq=2 * group, hkv=2, e=96, ev=64)
    _check(args, pool)


@BF16_POOL
@pytest.mark.parametrize("e,ev", [(72, 64), (64, 40), (8, 8)])
def test_head_sizes_off_the_pairs_fall_back_to_widening(isa, pool, e, ev):
    args = _batch(LENS, 16, pool, query_16_bit=True, e=e, ev=ev)
    _check(args, pool)


OPTIONS = {
    "softcap": dict(softcap=2.0),
    "window": dict(window=(40, 0)),
    "scale": dict(scale=0.3),
    "alibi": dict(alibi_slopes=np.linspace(0.05, 0.4, 8)),
    "sinks": dict(sinks=np.linspace(-2.0, 2.0, 8)),
}


@BF16_POOL
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("query_16_bit", [False, True], ids=["float32_query", "bfloat16_query"])
def test_score_options_on_bfloat16_pools(isa, pool, name, query_16_bit):
    args = _batch(LENS, 16, pool, query_16_bit=query_16_bit)
    _check(args, pool, **OPTIONS[name])


@BF16_POOL
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_shared_blocks_and_layouts_on_bfloat16_pools(isa, pool, rng, layout):
    args = make_batch(rng, [300, 200, 129, 1], block_size=16, hq=8, hkv=2, e=64,
                      layout=layout, dtype=pool, shared=5)
    args["query"] = args["query"].astype(_half.as_storage_dtype(pool))
    _check(args, pool)


@BF16_POOL
@pytest.mark.parametrize("n,bad", [(4, 1), (64, 37), (130, 129)],
                         ids=["even_block", "second_chunk", "second_block"])
def test_zero_weight_in_a_block_of_even_keys_keeps_nan_out(isa, pool, n, bad):
    # a block whose keys pair up evenly and whose only zero weight is key
    # bad's: P.V finds it while rounding the weights and tests the pairs
    args = _batch([n], 16, pool, query_16_bit=True, hq=4, hkv=1)
    q = np.zeros(args["query"].shape, np.float32)
    q[..., 0] = 8.0                           # score of key p: k[p][0]
    args["query"] = q.astype(args["query"].dtype)
    k, v = args["key_cache"], args["value_cache"]   # HND: (blocks, Hkv, bs, E)
    table = args["block_table"][0]
    k[table[: (n + 15) // 16], 0] = 0
    k[table[bad // 16], 0, bad % 16, 0] = -120.0     # its weight exp(-120): 0 in float32
    v[table[bad // 16], 0, bad % 16] = np.nan
    out = _call(args).astype(np.float64)
    keep = [p for p in range(n) if p != bad]
    rows = np.stack([v[table[p // 16], 0, p % 16].astype(np.float64) for p in keep])
    np.testing.assert_allclose(out[0], np.broadcast_to(rows.mean(0), out[0].shape),
                               rtol=2.0 ** -7, atol=1e-2)


@BF16_POOL
def test_zero_weights_keep_nan_and_inf_values_out(isa, pool):
    # key 1's score is 130 below key 0's: its weight is 0 (below float32's
    # range) and its NaN / Inf value must not reach the output; key 1 shares
    # a VDPBF16PS pair with key 0, key 2 is the block's odd last key
    for bad in (np.nan, np.inf):
        args = _batch([3], 16, pool, query_16_bit=True, hq=4, hkv=1)
        q = np.zeros(args["query"].shape, np.float32)
        q[..., 0] = 8.0                       # scores: 8 k[0] / sqrt(64) = k[0]
        args["query"] = q.astype(args["query"].dtype)
        k, v = args["key_cache"], args["value_cache"]   # HND: (blocks, Hkv, bs, E)
        blk = args["block_table"][0, 0]
        k[blk, 0, :3] = 0
        k[blk, 0, 0, 0], k[blk, 0, 1, 0], k[blk, 0, 2, 0] = 30.0, -100.0, 29.0
        v[blk, 0, 1] = bad
        out = _call(args).astype(np.float64)
        w = np.exp([0.0, -1.0])
        want = (w[0] * v[blk, 0, 0].astype(np.float64) + w[1] * v[blk, 0, 2]) / w.sum()
        for h in range(4):
            np.testing.assert_allclose(out[0, h], want, rtol=2.0 ** -7, atol=1e-2)
