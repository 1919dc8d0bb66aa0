"""The graph of fastattn.dask.attention: pruned key chunks, one merge chain per block,
lazy construction, the same bits on every local scheduler, rechunking of
chunks that do not line up, and the errors of bad input."""

from __future__ import annotations

import numpy as np
import pytest

from dask_common import assert_matches, chain_steps, chunked, import_dask, inputs, partial_tasks

da = import_dask()

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402
from fastattn import _dask_tasks  # noqa: E402


def _qkv(L=64, S=64, chunk=16, H=1, seed=0):
    rng = np.random.default_rng(seed)
    arrays = inputs(rng, (1, H, L, 8), (1, H, S, 8), (1, H, S, 8))
    return arrays, chunked(da, arrays, ((1, H, chunk, 8),) * 3)


def test_causal_prunes_the_key_chunks_above_the_diagonal():
    _, (q, k, v) = _qkv()
    assert len(partial_tasks(fdask.attention(q, k, v))) == 16
    # 4 query chunks see 1, 2, 3, 4 key chunks
    assert len(partial_tasks(fdask.attention(q, k, v, is_causal=True))) == 10


def test_lower_right_causal_prunes_from_the_other_corner():
    _, (q, k, v) = _qkv(L=32, S=64)
    # p(i) = i + 32: query chunk 0 (rows 0..15) sees key chunks 0..2, chunk 1 all 4
    assert len(partial_tasks(fdask.attention(q, k, v, is_causal="lower_right"))) == 7


def test_window_prunes_key_chunks_outside_every_row_s_window():
    _, (q, k, v) = _qkv(L=128, S=128)
    # each query chunk of 16 sees its own key chunk and the one before
    out = fdask.attention(q, k, v, is_causal=True, window=(15, 0))
    assert len(partial_tasks(out)) == 8 + 7
    out = fdask.attention(q, k, v, window=(0, 0))       # the diagonal only
    assert len(partial_tasks(out)) == 8


def test_numpy_key_padding_mask_prunes_all_padding_chunks_and_a_dask_one_cannot():
    (qn, kn, vn), (q, k, v) = _qkv(S=64)
    kpm = np.zeros((1, 64), bool)
    kpm[:, 20:] = True                     # key chunks 2 and 3 are all padding
    assert len(partial_tasks(fdask.attention(q, k, v, key_padding_mask=kpm))) == 4 * 2
    lazy = da.from_array(kpm, chunks=(1, 16))
    out = fdask.attention(q, k, v, key_padding_mask=lazy)
    assert len(partial_tasks(out)) == 4 * 4
    want = fastattn.attention(qn, kn, vn, key_padding_mask=kpm)
    assert_matches(out.compute(scheduler="sync"), None, want, None, np.float32)


def test_block_that_sees_no_key_chunk_is_zeros_without_tasks():
    _, (q, k, v) = _qkv(L=32, S=64)
    out, lse = fdask.attention(q, k, v, window=(0, 0), key_padding_mask=np.ones(64, bool),
                               return_lse=True)
    assert partial_tasks(out) == []
    got, got_lse = da.compute(out, lse, scheduler="sync")
    assert np.all(got == 0) and np.all(got_lse == -np.inf)


def test_each_query_block_merges_its_key_chunks_in_one_chain_in_key_order():
    _, (q, k, v) = _qkv(L=16, S=8 * 37, chunk=8)
    out = fdask.attention(q, k, v)
    steps = chain_steps(out)
    assert len(steps) == 2 * 37
    for key, acc in steps.items():
        *head, kj = key
        # each step merges into the step of the previous key chunk of its block
        assert acc == (None if kj == 0 else tuple(head) + (kj - 1,))
    # so every running result has exactly one consumer, and a block one
    # partial alive at a time
    consumed = [acc for acc in steps.values() if acc is not None]
    assert len(consumed) == len(set(consumed)) == 2 * 36


def test_the_chain_skips_pruned_key_chunks():
    _, (q, k, v) = _qkv(L=64, S=64)
    steps = chain_steps(fdask.attention(q, k, v, is_causal=True, window=(20, 0)))
    # query chunk 3 (rows 48..63) sees key chunks 1 (from key 28), 2 and 3
    chain = sorted((key[-1], acc) for key, acc in steps.items() if key[-2] == 3)
    assert [kj for kj, _ in chain] == [1, 2, 3]
    assert chain[0][1] is None and chain[1][1][-1] == 1 and chain[2][1][-1] == 2


def test_building_the_graph_computes_nothing():
    def boom(x):
        raise AssertionError("an input block was computed while building the graph")
    _, (q, k, v) = _qkv()
    q, k = q.map_blocks(boom, dtype=q.dtype), k.map_blocks(boom, dtype=k.dtype)
    out, lse = fdask.attention(q, k, v, is_causal=True, return_lse=True)
    assert out.shape == (1, 1, 64, 8) and lse.shape == (1, 1, 64)


@pytest.mark.parametrize("causal", [False, True])
def test_bitwise_identical_on_every_local_scheduler_and_thread_count(causal):
    _, (q, k, v) = _qkv(L=96, S=200, chunk=24, H=2, seed=3)
    results = []
    for nt in (None, 1, 2):
        out, lse = fdask.attention(q, k, v, is_causal=causal, sinks=[0.0, 1.0],
                                   alibi_slopes=[0.1, 0.3], return_lse=True, num_threads=nt)
        results.append(da.compute(out, lse, scheduler="sync"))
        for workers in (1, 2, 4):
            results.append(da.compute(out, lse, scheduler="threads", num_workers=workers))
    for out, lse in results[1:]:
        assert np.array_equal(out, results[0][0], equal_nan=True)
        assert np.array_equal(lse, results[0][1], equal_nan=True)


def test_same_inputs_same_graph_names():
    _, (q, k, v) = _qkv()
    a = fdask.attention(q, k, v, is_causal=True)
    b = fdask.attention(q, k, v, is_causal=True)
    c = fdask.attention(q, k, v, is_causal="lower_right", window=3)
    assert a.name == b.name and a.name != c.name


def test_chunks_that_do_not_line_up_are_rechunked():
    rng = np.random.default_rng(9)
    qn, kn, vn = inputs(rng, (4, 6, 30, 12), (4, 6, 40, 12), (4, 6, 40, 10))
    q = da.from_array(qn, chunks=(3, 4, 11, 5))          # features split too
    k = da.from_array(kn, chunks=(1, 2, 9, 12))          # other batch and head chunks
    v = da.from_array(vn, chunks=(4, 6, 13, 3))          # other key chunks than key
    out, lse = fdask.attention(q, k, v, is_causal=True, return_lse=True)
    assert out.chunks == ((3, 1), (4, 2), (11, 11, 8), (10,))
    assert lse.chunks == out.chunks[:-1]
    for key in partial_tasks(out):                        # key chunks follow key's
        assert key[-1] < len(k.chunks[2])
    want, want_lse = fastattn.attention(qn, kn, vn, is_causal=True, return_lse=True)
    assert_matches(*da.compute(out, lse, scheduler="sync"), want, want_lse, np.float32)


def test_default_threads_are_the_distributed_worker_s(monkeypatch):
    class Worker:
        class state:
            nthreads = 3

    class Fake:
        @staticmethod
        def get_worker():
            return Worker()

    class Outside:
        @staticmethod
        def get_worker():
            raise ValueError("No worker found")

    monkeypatch.setitem(__import__("sys").modules, "distributed", Fake)
    assert _dask_tasks._worker_threads() == 3
    monkeypatch.setitem(__import__("sys").modules, "distributed", Outside)
    assert _dask_tasks._worker_threads() == 0


# ---------------------------------------------------------------------------
# bad input: the in-memory call's errors, raised when the graph is built
# ---------------------------------------------------------------------------

def _arrays():
    rng = np.random.default_rng(10)
    return chunked(da, inputs(rng, (2, 3, 20, 8), (2, 3, 30, 8), (2, 3, 30, 8)),
                   ((1, 1, 10, 8),) * 3)


BAD = {
    "value_rows_differ": (lambda q, k, v: (q, k, v[:, :, :29]), {}, ValueError, "value"),
    "features_differ": (lambda q, k, v: (q, k[..., :7], v), {}, ValueError, "key"),
    "batch_does_not_broadcast": (lambda q, k, v: (q, k[:1, :2], v[:1, :2]), {}, ValueError,
                                 "broadcast"),
    "gqa_heads_not_a_multiple": (lambda q, k, v: (q, k[:, :2], v[:, :2]),
                                 {"enable_gqa": True}, ValueError, "enable_gqa"),
    "mask_shape": (lambda q, k, v: (q, k, v), {"attn_mask": np.ones((20, 29), bool)},
                   ValueError, "attn_mask"),
    "mask_dtype": (lambda q, k, v: (q, k, v), {"attn_mask": np.ones((20, 30), np.int32)},
                   TypeError, "attn_mask"),
    "padding_dtype": (lambda q, k, v: (q, k, v), {"key_padding_mask": np.zeros(30)},
                      TypeError, "key_padding_mask"),
    "padding_shape": (lambda q, k, v: (q, k, v),
                      {"key_padding_mask": da.zeros((5, 30), dtype=bool)}, ValueError,
                      "key_padding_mask"),
    "is_causal": (lambda q, k, v: (q, k, v), {"is_causal": "diagonal"}, ValueError,
                  "is_causal"),
    "window": (lambda q, k, v: (q, k, v), {"window": -1}, ValueError, "window"),
    "sinks_nan": (lambda q, k, v: (q, k, v), {"sinks": [0.0, np.nan, 0.0]}, ValueError,
                  "sinks"),
    "slopes_shape": (lambda q, k, v: (q, k, v), {"alibi_slopes": [0.1, 0.2]}, ValueError,
                     "alibi_slopes"),
    "softcap": (lambda q, k, v: (q, k, v), {"softcap": 0.0}, ValueError, "softcap"),
    "scale": (lambda q, k, v: (q, k, v), {"scale": float("nan")}, ValueError, "scale"),
    "num_threads": (lambda q, k, v: (q, k, v), {"num_threads": 0}, ValueError,
                    "num_threads"),
    "complex_dtype": (lambda q, k, v: (q.astype(np.complex64), k, v), {}, TypeError,
                      "query"),
    "ragged_query": (lambda q, k, v: ([[1.0, 2.0], [3.0]], k, v), {}, ValueError,
                     "query cannot be made an array"),
    "ragged_mask": (lambda q, k, v: (q, k, v), {"attn_mask": [[True] * 30, [True] * 29]},
                    ValueError, "attn_mask cannot be made an array"),
    "ragged_padding": (lambda q, k, v: (q, k, v), {"key_padding_mask": [[False] * 30, [True]]},
                       ValueError, "key_padding_mask cannot be made an array"),
    "ragged_slopes": (lambda q, k, v: (q, k, v), {"alibi_slopes": [[0.1], [0.1, 0.2, 0.3]]},
                      ValueError, "alibi_slopes cannot be made an array"),
    "ragged_sinks": (lambda q, k, v: (q, k, v), {"sinks": [[0.0, 1.0], [0.0]]}, ValueError,
                     "sinks cannot be made an array"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_rejected_when_the_graph_is_built(name):
    change, kw, error, word = BAD[name]
    q, k, v = change(*_arrays())
    with pytest.raises(error, match=word):
        fdask.attention(q, k, v, **kw)


def test_unknown_chunk_sizes_are_rejected_by_name():
    q, k, v = _arrays()
    # what boolean indexing leaves: the sizes of the key chunks are not known
    unknown = k.chunks[:2] + ((np.nan,) * len(k.chunks[2]),) + k.chunks[3:]
    k = da.Array(k.dask, k.name, unknown, dtype=k.dtype)
    with pytest.raises(ValueError, match="key has unknown chunk sizes"):
        fdask.attention(q, k, v)
    mask = da.ones((20, 30), dtype=bool, chunks=10)
    mask = da.Array(mask.dask, mask.name, ((np.nan, np.nan), (10,) * 3), dtype=bool)
    with pytest.raises(ValueError, match="attn_mask has unknown chunk sizes"):
        fdask.attention(q, q, q, mask)


def test_more_dimensions_than_dask_rechunks_need_chunks_that_line_up():
    rng = np.random.default_rng(13)
    lead = (1,) * 30 + (2,)                        # 33 dimensions: Dask rechunks 32
    qn, kn, vn = inputs(rng, lead + (6, 4), lead + (7, 4), lead + (7, 4))
    q = da.from_array(qn, chunks=(1,) * 31 + (3, 4))
    k = da.from_array(kn, chunks=(1,) * 30 + (2, 7, 4))
    with pytest.raises(ValueError, match=r"key of shape .* must be rechunked .* 32 dim"):
        fdask.attention(q, k, kn, is_causal=True)
    k = da.from_array(kn, chunks=(1,) * 31 + (7, 4))
    out = fdask.attention(q, k, vn, is_causal=True)
    want = fastattn.attention(qn, kn, vn, is_causal=True)
    assert_matches(out.compute(scheduler="sync"), None, want, None, np.float32)


def test_object_dtype_input_of_more_than_32_dimensions_gets_the_dtype_error():
    shape = (1,) * 33 + (3, 4)                     # Dask cannot hash such an object array
    q = np.ones(shape, np.float32)
    with pytest.raises(TypeError, match="value has unsupported dtype object"):
        fdask.attention(q, q, np.ones(shape, object))
