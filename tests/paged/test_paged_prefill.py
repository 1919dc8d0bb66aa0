"""attention_paged on prefill chunks (more queries than a decoding step):
chunk lengths around the tile and the decoding bound against contexts of
their own length and longer, mixed with decoding steps, query-head groups
larger and smaller than the heads a chunk streams at once, every score
option, every cache dtype; the bits independent of the thread count and the
page size, and those of the forward (fastattn.attention) over the gathered
keys."""

import numpy as np
import pytest

import fastattn
from conftest import ISAS, assert_close, finite_absmax, using_isa
from paged_common import bf16_weights_bound, check_int8, gather, make_batch, reference_paged

CHUNKS = [1, 9, 15, 16, 17, 64, 65, 512]
MATRIX_ISAS = [n for n in ISAS if n in ("amx", "avx512_bf16", "neon_bf16")]


def _call(args, **kw):
    return fastattn.attention_paged(args["query"], args["key_cache"], args["value_cache"],
                                    args["block_table"], args["seq_lens"],
                                    cu_seqlens_q=args["cu_seqlens_q"], layout=args["layout"],
                                    **kw)


def _check(args, dtype=np.float32, **opts):
    out, lse = _call(args, return_lse=True, **opts)
    ref, ref_lse = reference_paged(args, **opts)
    assert_close(out, ref, dtype, finite_absmax(ref))
    assert_close(lse, ref_lse, np.float32 if dtype != np.float64 else dtype, factor=10)


@pytest.mark.parametrize("nq", CHUNKS)
@pytest.mark.parametrize("extra", [0, 1, 300], ids=["context_of_the_chunk", "one_more_key",
                                                    "longer_context"])
def test_chunk_lengths_against_contexts_shorter_and_longer(isa, rng, nq, extra):
    # the chunk at the end of its sequence, with decoding steps beside it
    args = make_batch(rng, [nq + extra, 200, 40], [nq, 1, 1], block_size=16, hq=4, hkv=2,
                      e=32)
    _check(args)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (12, 1), (6, 1), (32, 8)],
                         ids=["no_groups", "group_of_4", "group_of_12", "group_of_6",
                              "serving_heads"])
def test_head_groups_above_and_below_one_pass(isa, rng, hq, hkv):
    # a chunk streams up to 4 heads of a group over each key block at once
    args = make_batch(rng, [300, 700, 60], [270, 1, 1], block_size=16, hq=hq, hkv=hkv, e=16)
    _check(args)


@pytest.mark.parametrize("e,ev", [(24, 40), (40, 8), (1, 3)])
def test_value_widths_other_than_the_key_width(isa, rng, e, ev):
    args = make_batch(rng, [400, 90], [150, 1], block_size=16, hq=8, hkv=2, e=e, ev=ev)
    _check(args)


def test_several_chunks_of_one_sequence_and_two_prefills(rng):
    # 600 queries: chunks of 256 rows, each with the keys it sees; two
    # prefilling sequences and decoding steps in one call
    args = make_batch(rng, [700, 90, 1000, 33], [600, 1, 257, 1], block_size=32, hq=4, hkv=2,
                      e=16)
    _check(args)


OPTIONS = {
    "window": dict(window=(40, 0)),
    "window_left_beyond_a_key_block": dict(window=(300, None)),
    "window_both_sides_not_causal": dict(is_causal=False, window=(50, 20)),
    "not_causal": dict(is_causal=False),
    "softcap": dict(softcap=3.0),
    "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])),
    "sinks": dict(sinks=np.array([0.0, 1.5, -2.0, 3.0])),
    "everything": dict(window=(100, 0), alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4]),
                       softcap=5.0, sinks=np.array([1.0, -1.0, 0.5, 2.0])),
}


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("nq", [17, 300])
def test_score_options_on_chunks(isa, rng, name, nq):
    args = make_batch(rng, [nq + 200, 90, 400], [nq, 1, 1], block_size=16, hq=4, hkv=1, e=24)
    _check(args, **OPTIONS[name])


def test_float64_chunks(isa, rng):
    args = make_batch(rng, [400, 30], [130, 1], dtype=np.float64, hq=4, hkv=2, e=16)
    _check(args, np.float64, window=(90, 0))


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_16_bit_pools_chunks(isa, rng, dtype):
    # float32 queries over 16-bit keys and values, widened when packed (the
    # decoding step beside the chunk may round its weights: bf16_weights_bound)
    args = make_batch(rng, [500, 30], [200, 1], dtype=dtype, hq=4, hkv=2, e=32)
    out = _call(args)
    ref, _ = reference_paged(args)
    np.testing.assert_allclose(out[:200], ref[:200], rtol=1e-5, atol=1e-5 * finite_absmax(ref))
    bound = bf16_weights_bound(args, ref) if dtype == "bfloat16" else 1e-5 * finite_absmax(ref)
    np.testing.assert_allclose(out[200:], ref[200:], rtol=1e-5, atol=bound)


def test_int8_pools_chunks_dequantised_when_staged(isa, rng):
    args = make_batch(rng, [600, 30], [300, 1], hq=8, hkv=2, e=32)
    scales = []
    for name in ("key_cache", "value_cache"):
        sc = np.abs(args[name]).max(-1) / 127
        args[name] = np.rint(args[name] / sc[..., None]).astype(np.int8)
        scales.append(sc.astype(np.float32))
    check_int8(isa, args, scales[0], scales[1])


def _repaged(args, block_size, rng):
    """args' sequences (NHD) in new pools of pages of block_size keys,
    shuffled: the same rows, other places."""
    lens = args["seq_lens"]
    need = [-(-int(n) // block_size) for n in lens]
    ids = rng.permutation(sum(need) + 2)
    table = np.zeros((len(lens), max(need)), np.int32)
    pools = {}
    for name in ("key_cache", "value_cache"):
        old = args[name]
        pools[name] = np.zeros((len(ids), block_size) + old.shape[2:], old.dtype)
    at = 0
    for b, n in enumerate(lens):
        table[b, :need[b]] = ids[at:at + need[b]]
        at += need[b]
        p = np.arange(n)
        for name, pool in pools.items():
            rows = gather(args[name], args["block_table"][b], int(n), "NHD").astype(pool.dtype)
            pool[table[b, p // block_size], p % block_size] = rows
    return dict(args, block_table=table, **pools)


@pytest.mark.parametrize("opts", [{}, {"window": (70, 0), "softcap": 4.0}],
                         ids=["causal", "window_softcap"])
def test_bits_identical_for_thread_counts_and_block_sizes(isa, rng, opts):
    args = make_batch(rng, [700, 300, 50], [520, 1, 17], block_size=16, hq=8, hkv=2, e=32)
    first = _call(args, num_threads=1, return_lse=True, **opts)
    for bs in (1, 3, 16, 128):
        paged = _repaged(args, bs, rng)
        for t in (1, 2, 3):
            for a, b in zip(first, _call(paged, num_threads=t, return_lse=True, **opts)):
                assert a.tobytes() == b.tobytes()
    ref, _ = reference_paged(args, **opts)
    assert_close(first[0], ref, np.float32, finite_absmax(ref))


@pytest.mark.parametrize("opts", [{}, {"softcap": 4.0, "sinks": np.array([0.5, -1.0, 2.0, 0.0])},
                                  {"alibi_slopes": np.array([0.3, 0.2, 0.1, 0.05])}],
                         ids=["causal", "softcap_sinks", "alibi"])
@pytest.mark.parametrize("nq,n", [(17, 300), (520, 700), (100, 100)])
def test_chunk_bits_are_the_forwards_over_the_gathered_keys(isa, rng, opts, nq, n):
    # no window: the chunk's keys then start at key 0, on the forward's key blocks
    args = make_batch(rng, [n, 50], [nq, 1], block_size=16, hq=4, hkv=2, e=32)
    out = _call(args, **opts)
    k, v = (np.ascontiguousarray(gather(args[x], args["block_table"][0], n, "NHD")
                                 .astype(np.float32).swapaxes(0, 1))
            for x in ("key_cache", "value_cache"))
    q = np.ascontiguousarray(args["query"][:nq].swapaxes(0, 1))
    fwd = fastattn.attention(q, k, v, is_causal="lower_right", enable_gqa=True, **opts)
    assert fwd.swapaxes(0, 1).tobytes() == np.ascontiguousarray(out[:nq]).tobytes()



@pytest.fixture(params=MATRIX_ISAS, ids=[f"isa={n}" for n in MATRIX_ISAS])
def matrix_isa(request):
    """The ISA paths of this build with the 16-bit matrix driver."""
    with using_isa(request.param):
        yield request.param


@pytest.mark.parametrize("opts", [{}, {"is_causal": False}], ids=["causal", "not_causal"])
@pytest.mark.parametrize("nq,n", [(16, 16), (17, 300), (520, 700)])
def test_bfloat16_chunk_bits_are_the_forwards_on_the_matrix_tiers(matrix_isa, rng, opts, nq, n):
    # bfloat16 queries over bfloat16 pools: each head of a chunk runs on the
    # 16-bit matrix driver, as the forward does, over the same keys from key 0
    args = make_batch(rng, [n, 50], [nq, 1], block_size=16, hq=8, hkv=2, e=32,
                      dtype="bfloat16")
    args["query"] = args["query"].astype(args["key_cache"].dtype)
    out = _call(args, **opts)
    k, v = (np.ascontiguousarray(gather(args[x], args["block_table"][0], n, "NHD")
                                 .astype(args[x].dtype).swapaxes(0, 1))
            for x in ("key_cache", "value_cache"))
    q = np.ascontiguousarray(args["query"][:nq].swapaxes(0, 1))
    causal = "lower_right" if opts.get("is_causal", True) else False
    fwd = fastattn.attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert fwd.swapaxes(0, 1).tobytes() == np.ascontiguousarray(out[:nq]).tobytes()


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("opts", [{}, {"window": (70, 0)},
                                  {"window": (40, 30), "is_causal": False}],
                         ids=["causal", "window", "window_both_sides_not_causal"])
def test_16_bit_queries_chunks_bits_identical_for_thread_counts_and_block_sizes(isa, rng, dtype,
                                                                              opts):
    # 16-bit queries over pools of their type (on the matrix tiers the
    # chunks' heads run on the 16-bit matrix driver, each on one thread)
    args = make_batch(rng, [700, 300, 50], [520, 40, 1], block_size=16, hq=8, hkv=2, e=32,
                      dtype=dtype)
    args["query"] = args["query"].astype(args["key_cache"].dtype)
    first = _call(args, num_threads=1, return_lse=True, **opts)
    for bs in (3, 128):
        paged = _repaged(args, bs, rng)
        for t in (1, 2, 3):
            for a, b in zip(first, _call(paged, num_threads=t, return_lse=True, **opts)):
                assert a.tobytes() == b.tobytes()
    ref, ref_lse = reference_paged(args, **opts)
    # float32 arithmetic on the 16-bit values, the result rounded once
    ulp = 2.0 ** -(11 if args["key_cache"].dtype == np.float16 else 8)
    np.testing.assert_allclose(first[0].astype(np.float64), ref, rtol=ulp + 1e-5,
                               atol=ulp * finite_absmax(ref) + bf16_weights_bound(args, ref))
    np.testing.assert_allclose(first[1], ref_lse, rtol=1e-4, atol=1e-4)
