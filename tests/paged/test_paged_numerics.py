"""attention_paged against the reference per sequence: decoding steps,
prefill chunks and both mixed, both layouts, block sizes, shared prefixes,
grouped-query heads, every score option, every cache dtype, lse, out=,
strided pools and thread counts."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastattn
from fastattn import _half
from conftest import assert_close, examples, finite_absmax, q8_query
from paged_common import (bf16_weights_bound, call_paged, check_int8, gather, make_batch,
                          reference_paged)

LENS = [1, 37, 300, 1300, 16, 129]        # 1300: a long context, split over items


def _call(args, **kw):
    return call_paged(args, **kw)


def _check(args, dtype=np.float32, factor=1.0, **opts):
    out, lse = _call(args, return_lse=True, **opts)
    ref, ref_lse = reference_paged(args, **opts)
    assert out.dtype == args["query"].dtype
    assert_close(out, ref, dtype, finite_absmax(ref), factor=factor)
    assert_close(lse, ref_lse, np.float32 if dtype != np.float64 else dtype, factor=factor * 10)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 16, 128, 5])
def test_decode_step_matches_reference_per_sequence(isa, rng, layout, block_size):
    lens = LENS if block_size > 1 else LENS[:3]
    _check(make_batch(rng, lens, block_size=block_size, layout=layout))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_prefill_chunks_and_decodes_mixed(isa, rng, layout):
    lens, nq = [300, 40, 1300, 9, 70], [300, 1, 1, 9, 20]   # a whole prefill, decodes, chunks
    _check(make_batch(rng, lens, nq, block_size=16, layout=layout))


def test_prefill_chunk_longer_than_a_work_item(rng):
    # 600 queries: several query chunks of one sequence, each its own keys
    _check(make_batch(rng, [700], [600], block_size=32, hq=2, hkv=1))


def test_shared_prefix_blocks(isa, rng):
    args = make_batch(rng, [100, 80, 130], block_size=16, shared=4)
    assert (args["block_table"][1, :4] == args["block_table"][0, :4]).all()
    _check(args)


@pytest.mark.parametrize("hq,hkv", [(1, 1), (8, 2), (6, 6), (8, 1)])
def test_grouped_query_heads(isa, rng, hq, hkv):
    _check(make_batch(rng, [50, 600], [1, 12], hq=hq, hkv=hkv))


OPTIONS = {
    "window": dict(window=(20, 0)),
    "window_left_only_long_context": dict(window=(700, None)),
    "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=np.array([0.0, 1.5, -2.0, 3.0])),
    "not_causal": dict(is_causal=False),
    "not_causal_window_alibi": dict(is_causal=False, window=(10, 3),
                                    alibi_slopes=np.array([0.5, 0.25, 0.1, 0.3])),
    "scale": dict(scale=0.7),
    "everything": dict(window=(64, 0), alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4]),
                       softcap=5.0, sinks=np.array([1.0, -1.0, 0.5, 2.0])),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_score_options_decode_and_prefill(isa, rng, name):
    args = make_batch(rng, [1300, 90, 33, 200], [1, 30, 1, 5], block_size=16)
    _check(args, **OPTIONS[name])


def test_float64_caches(isa, rng):
    _check(make_batch(rng, LENS, [1, 20, 3, 1, 16, 2], dtype=np.float64), np.float64)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("query_16_bit", [False, True])
def test_16_bit_caches(isa, rng, dtype, query_16_bit):
    # E = 32: bfloat16 decoding steps on the bfloat16 tiers' kernels where the
    # ISA path has them (on VDPBF16PS the weights rounded to bfloat16:
    # bf16_weights_bound)
    args = make_batch(rng, [1300, 60, 17], [1, 20, 1], dtype=dtype, e=32)
    kdt = _half.as_storage_dtype(dtype)
    if query_16_bit:
        args["query"] = args["query"].astype(kdt)
    out, lse = _call(args, return_lse=True)
    ref, ref_lse = reference_paged(args)
    # float32 arithmetic on the 16-bit values; a 16-bit result is rounded once
    ulp = 2.0 ** -(11 if kdt == np.float16 else 8) if query_16_bit else 0.0
    bound = bf16_weights_bound(args, ref) if kdt != np.float16 else 1e-5 * finite_absmax(ref)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=ulp + 1e-5,
                               atol=ulp * finite_absmax(ref) + bound)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


def _int8_pools(args):
    """args with its pools quantised to int8 per row; (args, key_scales, value_scales)."""
    layout, scales = args["layout"], []
    for name in ("key_cache", "value_cache"):
        pool = args[name] if layout == "NHD" else args[name].swapaxes(1, 2)
        sc = np.abs(pool).max(-1) / 127
        levels = np.rint(pool / np.maximum(sc, 1e-30)[..., None]).astype(np.int8)
        scales.append(sc.astype(np.float32))
        args[name] = levels if layout == "NHD" else levels.swapaxes(1, 2)
    return args, scales[0], scales[1]


def _int8_batch(rng, layout="NHD"):
    return _int8_pools(make_batch(rng, [1300, 64, 5], [1, 10, 1], dtype=np.float32,
                                  layout=layout))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_int8_caches_match_the_dequantised_reference(isa, rng, layout):
    args, ks, vs = _int8_batch(rng, layout)
    check_int8(isa, args, ks, vs)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_int8_decoding_steps_with_score_options_and_long_contexts_split(isa, rng, name):
    # 3000 keys: split and merged; 1..8 queries per sequence (the int8
    # kernel's rows), a prefill chunk of 30 (the copy) with them
    args, ks, vs = _int8_pools(make_batch(rng, [3000, 90, 33, 200], [1, 30, 8, 3],
                                          block_size=16))
    check_int8(isa, args, ks, vs, **OPTIONS[name])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 5, 64])
@pytest.mark.parametrize("hq,hkv", [(1, 1), (4, 2), (16, 1)])
def test_int8_decoding_steps_for_block_sizes_layouts_and_groups(isa, rng, layout, block_size,
                                                               hq, hkv):
    # a group of 16 query heads: two passes of the int8 kernel's 8 rows
    args, ks, vs = _int8_pools(make_batch(rng, [700, 129, 1], [1, 2, 1], block_size=block_size,
                                          hq=hq, hkv=hkv, e=24, ev=40, layout=layout))
    check_int8(isa, args, ks, vs)


@pytest.mark.parametrize("block_size", [1, 3, 16, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 8, 9])
def test_int8_block_sizes_and_gqa_groups_with_every_option(isa, rng, block_size, group):
    # D = 128 (the serving shape); groups of 1..8 rows in one tile of the
    # integer P.V, 9: a full tile and one more row; contexts of one key, of
    # a block tail (odd: an unpaired last key), and of several key blocks
    args, ks, vs = _int8_pools(make_batch(rng, [1, 201, 300], [1, 1, 2], block_size=block_size,
                                          hq=2 * group, hkv=2, e=128))
    opts = dict(OPTIONS["everything"], alibi_slopes=np.linspace(0.05, 0.4, 2 * group),
                sinks=np.linspace(-1, 2, 2 * group))
    check_int8(isa, args, ks, vs, **opts)


@pytest.mark.parametrize("e,ev", [(32, 31), (256, 33), (257, 100), (5, 256)])
def test_int8_head_dims_at_the_integer_paths_limits(isa, rng, e, ev):
    # E = 256: the largest with exact int32 sums of Q.K^T; 257 runs the
    # float Q.K^T; column tails of the value chunks (31, 33, 100)
    args, ks, vs = _int8_pools(make_batch(rng, [150, 7], [1, 3], block_size=16, hq=4, hkv=1,
                                          e=e, ev=ev))
    check_int8(isa, args, ks, vs)


@pytest.mark.parametrize("tiny", [1e-30, 1e-35])
def test_int8_tiny_value_scales_keep_relative_accuracy(isa, rng, tiny):
    # weights p_j v_scale[j] below 2^-113 (1e-35): the integer P.V's 32767 / b
    # would overflow, so that block runs the float P.V; 1e-30 stays integer
    args, ks, vs = _int8_pools(make_batch(rng, [300, 40], [1, 2], block_size=16, hq=4, hkv=2,
                                          e=64))
    vs = (vs * np.float32(tiny)).astype(np.float32)
    assert (vs[vs > 0] >= np.finfo(np.float32).tiny).all()
    out = _call(args, key_scales=ks, value_scales=vs)
    q = args["query"].astype(np.float64).copy()
    q[:] = q8_query(isa, args["query"])
    ref, _ = reference_paged(dict(args, query=q), key_scales=ks, value_scales=vs)
    m = float(np.abs(ref).max())
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * m)


def test_lse_merges_two_halves_of_the_keys_exactly(rng):
    args = make_batch(rng, [256, 160], block_size=16)
    full = _call(args, is_causal=False)
    tab, lens = args["block_table"], args["seq_lens"]
    parts = []
    for cols, n in ((slice(0, 5), [80, 80]), (slice(5, None), lens - 80)):
        sub = dict(args, block_table=np.ascontiguousarray(tab[:, cols]), seq_lens=np.array(n))
        o, lse = _call(sub, is_causal=False, return_lse=True)
        parts.append((o.swapaxes(0, 1), lse))
    merged, _ = fastattn.merge_attention([p[0] for p in parts], [p[1] for p in parts])
    assert_close(merged.swapaxes(0, 1), full, np.float32, finite_absmax(full))


def test_out_is_written_in_place_and_returned(rng):
    args = make_batch(rng, [40, 7], [3, 2])
    out = np.full((5, 4, 8), np.nan, np.float32)
    got = _call(args, out=out)
    assert got is out
    np.testing.assert_array_equal(out, _call(args))


def test_strided_pools_and_query_are_read_in_place(isa, rng):
    args = make_batch(rng, [300, 1300, 20], [4, 1, 20], hkv=2, e=8)
    ref = _call(args)
    wide = {}
    for name in ("key_cache", "value_cache"):
        a = args[name]
        big = np.zeros(a.shape[:3] + (2 * a.shape[3],), a.dtype)
        big[..., ::2] = a                       # column stride 2
        wide[name] = big[..., ::2]
    q = np.zeros((args["query"].shape[0], 4, 16), np.float32)
    q[..., 1::2] = args["query"]
    strided = dict(args, query=q[..., 1::2], **wide)
    np.testing.assert_array_equal(_call(strided), ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("e", [36, 64], ids=["E36_vector_tail", "E64"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6, 8])
def test_decoding_step_is_bitwise_attention_on_the_gathered_keys(isa, rng, dtype, e, group):
    """Each score is its own dot product whatever Q.K^T tile it falls in:
    a paged decoding step of 1..8 query heads per KV head gives the bits of
    attention() on each sequence's keys and values in place (float32
    queries; the lengths leave every tile remainder)."""
    args = make_batch(rng, [37, 300, 129, 1], block_size=16, hq=2 * group, hkv=2, e=e,
                      dtype=dtype)
    out = _call(args)
    kdt = args["key_cache"].dtype
    for b, n in enumerate(args["seq_lens"]):
        tab = args["block_table"][b]
        k, v = (gather(args[c], tab, n, "NHD").astype(kdt).swapaxes(0, 1)[None]
                for c in ("key_cache", "value_cache"))
        q = args["query"][b][None, :, None, :]
        want = fastattn.attention(q, k, v, enable_gqa=True)[0, :, 0]
        assert out[b].tobytes() == want.tobytes()


@pytest.mark.parametrize("opts", [{}, {"sinks": np.ones(4)}], ids=["grouped_heads", "sinks"])
def test_bitwise_identical_for_any_thread_count(isa, rng, opts):
    args = make_batch(rng, [1300, 2100, 40, 500], [1, 1, 20, 3], block_size=16)
    one = _call(args, num_threads=1, return_lse=True, **opts)
    two = _call(args, num_threads=2, return_lse=True, **opts)
    three = _call(args, num_threads=3, return_lse=True, **opts)
    for a, b, c in zip(one, two, three):
        assert a.tobytes() == b.tobytes() == c.tobytes()


@pytest.mark.parametrize("cache", ["float32", "bfloat16", "int8"])
def test_bitwise_identical_for_any_thread_count_with_long_contexts_split(isa, rng, cache):
    # decoding steps of 3000..6000 keys: each split over several items and
    # merged after the barrier; a prefill chunk and GQA groups of 4 with them
    args = make_batch(rng, [6000, 3000, 4100, 300], [1, 1, 1, 30], hq=8, hkv=2, block_size=16,
                      dtype=np.float32 if cache == "int8" else cache)
    opts = {}
    if cache == "int8":
        args, ks, vs = _int8_pools(args)
        opts = dict(key_scales=ks, value_scales=vs)
    runs = [_call(args, num_threads=t, return_lse=True, **opts) for t in (1, 2, 3)]
    for got in runs[1:]:
        for a, b in zip(runs[0], got):
            assert a.tobytes() == b.tobytes()
    if cache == "int8":
        check_int8(isa, args, ks, vs)
        return
    ref, ref_lse = reference_paged(args, **opts)
    assert_close(runs[0][0], ref, np.float32, finite_absmax(ref))


def test_empty_batch_and_sequences_without_queries(rng):
    args = make_batch(rng, [30, 20], [0, 2])
    _check(args)
    empty = make_batch(rng, [], [])
    empty["query"] = np.zeros((0, 4, 8), np.float32)
    empty["block_table"] = np.zeros((0, 1), np.int32)
    assert _call(empty).shape == (0, 4, 8)


@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_random_batches_match_reference(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nseq = data.draw(st.integers(1, 5))
    lens = data.draw(st.lists(st.integers(1, 400), min_size=nseq, max_size=nseq))
    nq = [data.draw(st.integers(0, min(n, 24))) for n in lens]
    bs = data.draw(st.sampled_from([1, 3, 16, 64]))
    hkv = data.draw(st.sampled_from([1, 2]))
    layout = data.draw(st.sampled_from(["NHD", "HND"]))
    args = make_batch(rng, lens, nq, block_size=bs, hq=2 * hkv, hkv=hkv, layout=layout)
    opts = {}
    if data.draw(st.booleans()):
        opts["window"] = (data.draw(st.integers(0, 50)), 0)
    if data.draw(st.booleans()):
        opts["softcap"] = 3.0
    _check(args, **opts)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_positions_past_each_sequence_are_never_read(isa, rng, layout, dtype):
    # NaN in every slot no sequence holds (spare blocks, the tail of each
    # last block): a read of one would poison a row
    args = make_batch(rng, [37, 1300, 5, 16], [1, 1, 3, 16], block_size=16, layout=layout,
                      dtype=dtype)
    clean = _call(args)
    bs, used = 16, np.zeros(args["key_cache"].shape[0] * 16, bool)
    for b, n in enumerate(args["seq_lens"]):
        p = np.arange(n)
        used[args["block_table"][b, p // bs] * bs + p % bs] = True
    blk, off = np.divmod(np.flatnonzero(~used), bs)
    for name in ("key_cache", "value_cache"):
        pool = args[name] if layout == "NHD" else args[name].swapaxes(1, 2)   # a view
        pool[blk, off] = np.nan
        assert np.isnan(args[name].astype(np.float32)).sum() == blk.size * pool[0, 0].size
    dirty = _call(args)
    np.testing.assert_array_equal(dirty, clean)


def _field(a):
    """a as a field of a structured array: strides that are not a whole
    number of elements, data that is not aligned."""
    rec = np.zeros(a.shape, dtype=[("pad", np.int16), ("x", a.dtype)])
    rec["x"] = a
    return rec["x"]


@pytest.mark.parametrize("name", ["query", "key_cache", "out"])
def test_views_of_odd_byte_strides_are_read_and_written_as_elements(rng, name):
    args = make_batch(rng, [40, 7, 20], [3, 2, 1], block_size=8)
    want = _call(args)
    if name == "out":
        rec = np.zeros(want.shape, dtype=[("pad", np.int16), ("x", np.float32)])
        out = rec["x"]
        assert _call(args, out=out) is out
        assert np.array_equal(out, want) and not rec["pad"].any()
    else:
        args[name] = _field(args[name])
        assert np.array_equal(_call(args), want)
