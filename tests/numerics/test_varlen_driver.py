"""The packed-sequence driver (src_c/driver/varlen.c): one C call runs every
sequence of attention_varlen and its backward, the long ones on all the
threads, the short ones side by side.  Each sequence must give the bits of
its own fastattn.attention / attention_backward call, for every thread
count and however the sequences are spread over the threads."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
from fastattn._half import bfloat16

# sequence lengths (queries, keys): only short ones (all side by side); one
# long one among short ones (run alone on all the threads, the rest side by
# side), with an empty sequence, a single query row, a sequence with no key
BATCHES = {
    "short_only": ([5, 9, 1, 12, 7, 3, 8, 6], [8, 9, 4, 20, 7, 5, 8, 6]),
    "long_among_short": ([150, 0, 1, 9, 14, 3, 20], [170, 3, 9, 9, 0, 3, 20]),
}
OPTIONS = {
    "plain": {},
    "causal": {"is_causal": True},
    "lower_right_window_softcap": {"is_causal": "lower_right", "window": (9, 2), "softcap": 4.0},
    "alibi_sinks_per_sequence": {"alibi_slopes": "per_sequence", "sinks": "per_sequence"},
}
DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
          "bfloat16": bfloat16()}


def _problem(batch, heads, dtype, opts, seed=0):
    rng = np.random.default_rng(seed)
    lq, lk = BATCHES[batch]
    H, Hkv = heads
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int64)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int64)
    q = rng.standard_normal((cq[-1], H, 16)).astype(dtype)
    k = rng.standard_normal((ck[-1], Hkv, 16)).astype(dtype)
    v = rng.standard_normal((ck[-1], Hkv, 8)).astype(dtype)
    opts = dict(opts)
    for name in ("alibi_slopes", "sinks"):
        if opts.get(name) == "per_sequence":
            opts[name] = rng.uniform(0.1, 1.0, (len(lq), H))
    return q, k, v, cq, ck, opts


def _heads_first(a):
    return np.swapaxes(a, 0, 1)


def _one_call_per_sequence(q, k, v, cq, ck, opts):
    """What each sequence's own fastattn.attention call gives, packed."""
    H, n = q.shape[1], len(cq) - 1
    out = np.zeros((q.shape[0], H, v.shape[2]), q.dtype)
    lse = np.full((H, q.shape[0]), -np.inf, np.float64 if q.dtype == np.float64 else np.float32)
    for b in range(n):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if rows.start == rows.stop:
            continue
        per = {name: opts[name][b] for name in ("alibi_slopes", "sinks") if name in opts}
        rest = {key: val for key, val in opts.items() if key not in per}
        o, lse[:, rows] = fastattn.attention(
            _heads_first(q[rows]), _heads_first(k[keys]), _heads_first(v[keys]),
            enable_gqa=q.shape[1] != k.shape[1], return_lse=True, num_threads=1, **rest, **per)
        out[rows] = _heads_first(o)
    return out, lse


def _one_backward_per_sequence(d_o, q, k, v, out, lse, cq, ck, opts):
    grads = [np.zeros_like(x) for x in (q, k, v)]
    d_sinks = np.zeros((len(cq) - 1, q.shape[1]))
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if rows.start == rows.stop:
            continue
        per = {name: opts[name][b] for name in ("alibi_slopes", "sinks") if name in opts}
        rest = {key: val for key, val in opts.items() if key not in per}
        h = _heads_first
        r = fastattn.attention_backward(
            h(d_o[rows]), h(q[rows]), h(k[keys]), h(v[keys]), h(out[rows]), lse[:, rows],
            enable_gqa=q.shape[1] != k.shape[1], num_threads=1, **rest, **per)
        for grad, part, sl in zip(grads, r[:3], (rows, keys, keys)):
            grad[sl] = h(part)
        if "sinks" in opts:
            d_sinks[b] = r[3]
    return grads, d_sinks


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("opts", list(OPTIONS))
def test_each_sequence_bitwise_its_own_call_any_threads(isa, batch, heads, dtype, opts):
    q, k, v, cq, ck, kw = _problem(batch, heads, DTYPES[dtype], OPTIONS[opts])
    want_out, want_lse = _one_call_per_sequence(q, k, v, cq, ck, kw)
    d_o = np.random.default_rng(1).standard_normal(want_out.shape).astype(q.dtype)
    want_grads, want_sinks = _one_backward_per_sequence(d_o, q, k, v, want_out, want_lse,
                                                        cq, ck, kw)
    for nt in (1, 2, 3):
        out, lse = fastattn.attention_varlen(q, k, v, cq, ck, return_lse=True, num_threads=nt,
                                             **kw)
        assert _same_bits(out, want_out), f"num_threads={nt}: output"
        assert _same_bits(lse, want_lse.astype(lse.dtype)), f"num_threads={nt}: lse"
        grads = fastattn.attention_varlen_backward(d_o, q, k, v, out, lse, cq, ck,
                                                   num_threads=nt, **kw)
        for name, got, want in zip(("query", "key", "value"), grads, want_grads):
            assert _same_bits(got, want), f"num_threads={nt}: grad of {name}"
        if "sinks" in kw:
            assert _same_bits(grads[3], want_sinks), f"num_threads={nt}: grad of sinks"


def test_long_sequence_with_no_query_rows_leaves_its_keys_zero_gradient():
    q, k, v, cq, ck, _ = _problem("long_among_short", (2, 2), np.float64, {})
    cq = np.array([0, 0] + list(cq[2:] - cq[1]))   # the long sequence loses its queries
    q = q[150:]
    out, lse = fastattn.attention_varlen(q, k, v, cq, ck, return_lse=True, num_threads=2)
    dq, dk, dv = fastattn.attention_varlen_backward(np.ones_like(out), q, k, v, out, lse,
                                                    cq, ck, num_threads=2)
    assert not dk[:170].any() and not dv[:170].any()
    assert dk[170:].any() and dv[170:].any()


def _kernel_args(cq, ck):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 6, 4))
    k = rng.standard_normal((1, 5, 4))
    out = np.full((1, 6, 4), 7.0)
    return dict(q=q, k=k, v=k, out=out, cq=np.asarray(cq, np.int64), ck=np.asarray(ck, np.int64))


@pytest.mark.parametrize("cq, ck", [([0, 2, 6], [0, 5, 4]), ([0, 7, 6], [0, 2, 5]),
                                    ([1, 2, 6], [0, 2, 5]), ([0, 2, 5], [0, 2, 5]),
                                    ([0, 2, 6], [0, 2, 6])],
                         ids=["keys_decrease", "rows_decrease", "rows_not_from_0",
                              "rows_short_of_the_total", "keys_past_the_total"])
def test_driver_refuses_offsets_that_do_not_cut_the_arrays_nothing_written(cq, ck):
    a = _kernel_args(cq, ck)
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(a["q"], a["k"], a["v"], a["out"], batch=(1,), scale=1.0,
                        seqs=(a["cq"], a["ck"], False))
    assert (a["out"] == 7.0).all()


def test_driver_refuses_a_mask_with_sequences():
    a = _kernel_args([0, 2, 6], [0, 2, 5])
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(a["q"], a["k"], a["v"], a["out"], batch=(1,), scale=1.0,
                        bool_mask=np.ones((6, 5), np.uint8), seqs=(a["cq"], a["ck"], False))
    assert (a["out"] == 7.0).all()
