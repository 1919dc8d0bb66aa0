"""Hostile input to attention_paged and paged_append: each error names its
argument, and nothing is written (out= and the caches keep their bytes)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import fastattn
from fastattn import _testing
from paged_common import make_batch


@pytest.fixture
def args(rng):
    return make_batch(rng, [40, 7, 20], [3, 2, 1], block_size=8)


def _call(a, **kw):
    return fastattn.attention_paged(a["query"], a["key_cache"], a["value_cache"],
                                    a["block_table"], a["seq_lens"],
                                    cu_seqlens_q=a["cu_seqlens_q"], layout=a["layout"], **kw)


def _refused(a, exc, match, **kw):
    out = np.full((a["query"].shape[0], a["query"].shape[1], a["value_cache"].shape[-1]),
                  7.0, np.float32)
    with pytest.raises(exc, match=match):
        _call(a, out=out, **kw)
    assert (out == 7.0).all()


def test_block_id_outside_the_pool(args):
    args["block_table"][1, 0] = args["key_cache"].shape[0]
    _refused(args, ValueError, r"block_table\[1, 0\] = .* outside the pool")


def test_negative_block_id(args):
    args["block_table"][0, 2] = -1
    _refused(args, ValueError, r"block_table\[0, 2\]")


def test_block_ids_past_a_sequence_are_not_read(args):
    args["block_table"][1, 1:] = 10**6       # sequence 1 (7 keys) uses one block of 8
    assert np.isfinite(_call(args)).all()


def test_seq_lens_beyond_the_table_row(args):
    args["seq_lens"][0] = args["block_table"].shape[1] * 8 + 1
    _refused(args, ValueError, "seq_lens must be in 0 .. max_blocks")


def test_negative_seq_len(args):
    args["seq_lens"][2] = -1
    _refused(args, ValueError, "seq_lens")


def test_seq_lens_of_the_wrong_shape(args):
    args["seq_lens"] = args["seq_lens"][:2]
    _refused(args, ValueError, r"seq_lens must have shape \(B,\)")


def test_more_queries_than_keys(args):
    args["seq_lens"][1] = 1
    _refused(args, ValueError, "sequence 1 has 2 queries but seq_lens")


def test_cu_seqlens_q_not_ending_at_the_queries(args):
    args["cu_seqlens_q"] = np.array([0, 3, 5, 5], np.int32)
    _refused(args, ValueError, "cu_seqlens_q must start at 0 and end at 6")


def test_cu_seqlens_q_of_the_wrong_length(args):
    args["cu_seqlens_q"] = np.array([0, 5, 6], np.int32)
    _refused(args, ValueError, "cu_seqlens_q must have B \\+ 1 = 4")


def test_cu_seqlens_q_decreasing(args):
    args["cu_seqlens_q"] = np.array([0, 4, 3, 6], np.int32)
    _refused(args, ValueError, "non-decreasing")


def test_no_cu_seqlens_q_needs_one_query_per_sequence(args):
    args["cu_seqlens_q"] = None
    _refused(args, ValueError, "one query")


def test_float_block_table(args):
    args["block_table"] = args["block_table"].astype(np.float64)
    _refused(args, TypeError, "block_table must be int32 or int64")


def test_mismatched_cache_dtypes(args):
    args["value_cache"] = args["value_cache"].astype(np.float64)
    _refused(args, TypeError, "key_cache and value_cache must have one dtype")


def test_mismatched_cache_shapes(args):
    args["value_cache"] = args["value_cache"][:-1]
    _refused(args, ValueError, "must agree on num_blocks")


def test_query_dtype_against_the_caches(args):
    args["query"] = args["query"].astype(np.float64)
    _refused(args, TypeError, "query has dtype float64; with float32 caches it must be float32")


def test_query_head_dim_and_heads(args):
    bad = dict(args, query=args["query"][..., :4])
    _refused(bad, ValueError, r"query must have shape \(total_q, Hq, E\) with E = 8")
    bad = dict(args, query=args["query"][:, :3])
    _refused(bad, ValueError, r"query heads \(3\) must be a positive multiple")


def test_cache_rank_and_dtype(args):
    bad = dict(args, key_cache=args["key_cache"][0])
    _refused(bad, ValueError, "key_cache must be 4-D")
    bad = dict(args, key_cache=args["key_cache"].astype(np.int32),
               value_cache=args["value_cache"].astype(np.int32))
    _refused(bad, TypeError, "key_cache has dtype int32")


def test_layout_name(args):
    args["layout"] = "NDH"
    _refused(args, ValueError, "layout must be 'NHD' or 'HND'")


def test_a_pool_passed_in_the_other_layout_names_the_layout(args):
    args["layout"] = "HND"   # the pools are NHD: (12, 8, 2, 8) read as Hkv = 8
    _refused(args, ValueError, r"kv heads \(8: key_cache read as layout='HND', "
                               r"\(num_blocks, Hkv, block_size, E\)\)")


def test_int8_caches_need_their_scales(args):
    q8 = dict(args, key_cache=args["key_cache"].astype(np.int8),
              value_cache=args["value_cache"].astype(np.int8))
    _refused(q8, ValueError, "key_scales is required with int8 caches")
    scales = np.ones(q8["key_cache"].shape[:3], np.float32)
    _refused(q8, ValueError, "value_scales must be float32 of shape", key_scales=scales,
             value_scales=scales[:, :4])
    _refused(q8, ValueError, "key_scales must be float32", key_scales=scales.astype(np.float64),
             value_scales=scales)


def test_scales_with_float_caches(args):
    _refused(args, ValueError, "key_scales is for int8 caches",
             key_scales=np.ones(args["key_cache"].shape[:3], np.float32))


def test_score_options_named(args):
    _refused(args, ValueError, "alibi_slopes", alibi_slopes=np.ones(3))
    _refused(args, ValueError, "sinks", sinks=np.array([np.nan, 0, 0, 0]))
    _refused(args, ValueError, "softcap", softcap=-1.0)
    _refused(args, ValueError, "window sizes must be >= 0", window=(-1, 0))
    _refused(args, TypeError, "is_causal must be a bool", is_causal="lower_right")
    _refused(args, ValueError, "scale must be finite", scale=np.inf)


def test_out_of_the_wrong_shape_or_overlapping(args):
    with pytest.raises(ValueError, match="out has shape"):
        _call(args, out=np.zeros((6, 4, 7), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        _call(args, out=np.zeros((6, 4, 8), np.float64))
    flat = args["key_cache"].reshape(-1)[: 6 * 4 * 8].reshape(6, 4, 8)
    before = args["key_cache"].copy()
    with pytest.raises(ValueError, match="out overlaps key_cache"):
        _call(args, out=flat)
    np.testing.assert_array_equal(args["key_cache"], before)


def _append_refused(kc, vc, exc, match, *a, **kw):
    before = kc.copy(), vc.copy()
    with pytest.raises(exc, match=match):
        fastattn.paged_append(kc, vc, *a, **kw)
    np.testing.assert_array_equal(kc, before[0])
    np.testing.assert_array_equal(vc, before[1])


def test_paged_append_refuses_bad_slots_writing_nothing():
    kc, vc = np.zeros((2, 4, 1, 3), np.float32), np.zeros((2, 4, 1, 3), np.float32)
    rows = np.ones((2, 1, 3), np.float32)
    _append_refused(kc, vc, ValueError, "slots >= num_blocks", np.array([1, 8]), rows, rows)
    _append_refused(kc, vc, ValueError, "names a slot twice", np.array([3, 3]), rows, rows)
    _append_refused(kc, vc, ValueError, "one entry per token", np.array([3]), rows, rows)
    _append_refused(kc, vc, TypeError, "slot_mapping must be int32", np.array([0., 1.]), rows,
                    rows)
    _append_refused(kc, vc, ValueError, r"key must have shape \(tokens, 1, 3\)", np.array([0, 1]),
                    rows[..., :2], rows)
    _append_refused(kc, vc, ValueError, "one row per token", np.array([0, 1]), rows, rows[:1])


def test_paged_append_int8_refuses_non_finite_rows_writing_nothing():
    kc, vc = np.zeros((2, 4, 1, 3), np.int8), np.zeros((2, 4, 1, 3), np.int8)
    ks, vs = np.zeros((2, 4, 1), np.float32), np.zeros((2, 4, 1), np.float32)
    rows = np.ones((2, 1, 3), np.float32)
    bad = rows.copy()
    bad[1, 0, 2] = np.nan
    _append_refused(kc, vc, ValueError, "value .* not finite in float32", np.array([0, 5]), rows,
                    bad, key_scales=ks, value_scales=vs)
    assert not ks.any() and not vs.any()
    huge = rows.astype(np.float64)
    huge[1, 0, 2] = 1e39  # finite, but past float32's range (its scales'): inf there
    _append_refused(kc, vc, ValueError, r"value .* not finite in float32 .* beyond \+-3.4e38",
                    np.array([0, 5]), rows, huge, key_scales=ks, value_scales=vs)
    assert not ks.any() and not vs.any()
    _append_refused(kc, vc, ValueError, "key_scales is required", np.array([0, 5]), rows, rows)


def test_paged_append_read_only_cache():
    kc = np.zeros((2, 4, 1, 3), np.float32)
    kc.flags.writeable = False
    with pytest.raises(ValueError, match="key_cache is read-only"):
        fastattn.paged_append(kc, np.zeros_like(kc), np.array([0]), np.ones((1, 1, 3)),
                              np.ones((1, 1, 3)))


def test_each_failed_allocation_raises_memory_error_writing_nothing(rng):
    a = make_batch(rng, [1300, 40, 300], [1, 1, 12], block_size=16)   # splits and partials
    kw = dict(cu_seqlens_q=a["cu_seqlens_q"], num_threads=2, sinks=np.ones(4))
    want = fastattn.attention_paged(a["query"], a["key_cache"], a["value_cache"],
                                    a["block_table"], a["seq_lens"], **kw)
    failed = 0
    for n in range(20):
        out = np.full(want.shape, 7.0, np.float32)
        try:
            _testing.fail_alloc_after(n)
            fastattn.attention_paged(a["query"], a["key_cache"], a["value_cache"],
                                     a["block_table"], a["seq_lens"], out=out, **kw)
        except MemoryError:
            failed += 1
            assert (out == 7.0).all()
            continue
        finally:
            _testing.fail_alloc_after(-1)
        assert out.tobytes() == want.tobytes()
        break
    else:
        raise AssertionError("the call never succeeded within 20 allocations")
    assert failed >= 3                 # the entries, the partials, the threads' scratch


# One wrong argument in an otherwise valid call, drawn at random: the name
# its error must give, and how to make it wrong (a, r: the call's arguments
# and a random generator; returns the changed arguments or options).
def _bad_block_id(a, r):      # a block a sequence reads, outside the pool
    t, pool = a["block_table"].copy(), a["key_cache"].shape[0]
    b = int(r.integers(0, t.shape[0]))
    j = int(r.integers(0, -(-a["seq_lens"][b] // 8)))
    t[b, j] = int(r.choice([-1, -2**31, pool, 2**31 - 1]))
    return dict(block_table=t), {}


def _bad_seq_len(a, r):       # negative, or beyond its row of blocks
    s = a["seq_lens"].copy()
    s[int(r.integers(0, 3))] = int(r.choice([-1, a["block_table"].shape[1] * 8 + 1, 2**40]))
    return dict(seq_lens=s), {}


def _bad_cu(a, r):   # [0, 3, 5, 6]: not from 0, not to 6, or going back
    c = a["cu_seqlens_q"].copy()
    k = int(r.integers(0, 4))
    if k == 0:
        c[0] = 1
    elif k == 3:
        c[1] = c[2] + 1
    else:
        c[-1] += int(r.choice([-1, 1, 10**9]))
    return dict(cu_seqlens_q=c), {}


_MUTATIONS = {
    "block_table": _bad_block_id,
    "seq_lens": _bad_seq_len,
    "cu_seqlens_q": _bad_cu,
    "query": lambda a, r: (dict(query=a["query"][:, : int(r.choice([1, 3]))]), {}),
    "value_cache": lambda a, r: (dict(value_cache=a["value_cache"][: int(r.integers(1, 12))]), {}),
    "window": lambda a, r: ({}, dict(window=(int(r.integers(-9, 0)), 0))),
    "softcap": lambda a, r: ({}, dict(softcap=float(r.choice([-1.0, 0.0, np.nan, np.inf])))),
    "scale": lambda a, r: ({}, dict(scale=float(r.choice([np.nan, np.inf, -np.inf, 1e300])))),
    "sinks": lambda a, r: ({}, dict(sinks=np.zeros(int(r.choice([2, 3, 5])), np.float32))),
    "alibi_slopes": lambda a, r: ({}, dict(alibi_slopes=np.zeros(int(r.choice([3, 5])),
                                                                 np.float32))),
    "num_threads": lambda a, r: ({}, dict(num_threads=int(r.choice([0, -1, -2**40])))),
    "key_scales": lambda a, r: ({}, dict(key_scales=np.ones((12, 8, 2), np.float32))),
}


@given(name=st.sampled_from(sorted(_MUTATIONS)), seed=st.integers(0, 2**32 - 1),
       layout=st.sampled_from(["NHD", "HND"]), decode=st.booleans())
def test_any_one_wrong_argument_is_named_and_nothing_written(name, seed, layout, decode):
    r = np.random.default_rng(seed)
    a = make_batch(r, [40, 7, 20], None if decode else [3, 2, 1], block_size=8, layout=layout)
    if name == "cu_seqlens_q" and decode:
        name = "seq_lens"
    changed, options = _MUTATIONS[name](a, r)
    a.update(changed)
    _refused(a, (ValueError, TypeError), name, **options)


@pytest.mark.parametrize("name", ["block_table", "seq_lens", "key_scales"])
def test_out_sharing_memory_with_an_index_or_scale_array_is_refused(args, name):
    """The kernel checks the block ids and lengths, then writes out: an out
    over them would change what it reads after its checks."""
    a = dict(args)
    q, ev = a["query"], a["value_cache"].shape[-1]
    n_out = q.shape[0] * q.shape[1] * ev
    kw = {}
    if name == "key_scales":
        a["key_cache"] = a["key_cache"].astype(np.int8)
        a["value_cache"] = a["value_cache"].astype(np.int8)
        shape = a["key_cache"].shape[:3]
        buf = np.ones(max(n_out, int(np.prod(shape))), np.float32)
        kw = {"key_scales": buf[:int(np.prod(shape))].reshape(shape),
              "value_scales": np.ones(shape, np.float32)}
    else:
        src = a[name]
        buf = np.zeros(max(src.size * 2, n_out), np.int64)
        buf[:src.size] = src.ravel()
        a[name] = buf[:src.size].reshape(src.shape)
        buf = buf.view(np.float32)
    out = buf[:n_out].reshape(q.shape[0], q.shape[1], ev)
    before = buf.copy()
    with pytest.raises(ValueError, match=f"out overlaps {name}"):
        _call(a, out=out, **kw)
    assert np.array_equal(buf, before)


def test_paged_append_rows_read_from_the_pool_itself_move_as_if_copied_first():
    kc = np.arange(32, dtype=np.float32).reshape(4, 4, 1, 2)
    vc = kc.copy()
    rows = kc.reshape(16, 1, 2)[0:4]
    want = rows.copy()
    fastattn.paged_append(kc, vc, np.array([1, 2, 3, 4]), rows, want)
    assert np.array_equal(kc.reshape(16, 1, 2)[1:5], want)
    assert np.array_equal(vc.reshape(16, 1, 2)[1:5], want)
