"""attention_varlen_backward against fastattn.reference.attention_backward run
on each sequence of the packed batch (float64; the bound of test_backward.py)."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference


def _per_sequence_reference(d_o, q, k, v, out, lse, cq, ck, g_lse, sinks, **opts):
    grads = [np.zeros_like(x) for x in (q, k, v)]
    d_sink = np.zeros(q.shape[1])
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if rows.start == rows.stop:
            continue
        t = lambda a: np.swapaxes(a, 0, 1)   # noqa: E731  (rows, H, C) -> (H, rows, C)
        r = reference.attention_backward(t(d_o[rows]), t(q[rows]), t(k[keys]), t(v[keys]),
                                         t(out[rows]), lse[:, rows], grad_lse=g_lse[:, rows],
                                         enable_gqa=True, sinks=sinks, **opts)
        for grad, part, sl in zip(grads, r[:3], (rows, keys, keys)):
            grad[sl] = t(part)
        d_sink += r[3]
    return (*grads, d_sink)


def _check_against_the_reference(rng, q, k, v, cq, ck, **opts):
    """Forward and backward of the packed batch, four heads' sinks and a
    random grad_lse, against the reference per sequence (float64)."""
    sinks = np.array([0.5, -0.5, 0.0, 1.0])
    out, lse = fastattn.attention_varlen(q, k, v, cq, ck, sinks=sinks, return_lse=True, **opts)
    d_o, g_lse = rng.standard_normal(out.shape), rng.standard_normal(lse.shape)
    got = fastattn.attention_varlen_backward(d_o, q, k, v, out, lse, cq, ck, sinks=sinks,
                                             grad_lse=g_lse, **opts)
    want = _per_sequence_reference(d_o, q, k, v, out, lse, cq, ck, g_lse, sinks, **opts)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1.0, np.abs(b).max(initial=0)))


@pytest.mark.parametrize("opts", [{}, {"is_causal": True, "softcap": 2.0},
                                  {"is_causal": "lower_right", "window": (3, 1)}],
                         ids=["plain", "causal_softcap", "lower_right_window"])
def test_packed_sequences_match_the_reference_per_sequence(isa, opts):
    rng = np.random.default_rng(0)
    cq = np.array([0, 3, 3, 40, 41, 170])                 # an empty sequence, L = 1, long ones
    ck = np.array([0, 5, 9, 60, 60, 200])                 # one sequence with no key
    q = rng.standard_normal((170, 4, 8))
    k, v = rng.standard_normal((200, 2, 8)), rng.standard_normal((200, 2, 6))
    _check_against_the_reference(rng, q, k, v, cq, ck, **opts)


@pytest.mark.parametrize("E,Ev", [(0, 6), (8, 0)], ids=["E0", "Ev0"])
def test_empty_feature_axis_matches_the_reference_per_sequence(isa, E, Ev):
    """No query/key features (every score 0) or no value features (an empty
    output, but lse and its gradient still reach dQ and dK)."""
    rng = np.random.default_rng(1)
    cq, ck = np.array([0, 3, 3, 20]), np.array([0, 5, 9, 30])
    q = rng.standard_normal((20, 4, E))
    k, v = rng.standard_normal((30, 2, E)), rng.standard_normal((30, 2, Ev))
    _check_against_the_reference(rng, q, k, v, cq, ck, is_causal="lower_right", window=(6, None))


def test_grad_out_of_another_shape_is_named():
    x = np.ones((5, 2, 4))
    cu = np.array([0, 2, 5])
    out, lse = fastattn.attention_varlen(x, x, x, cu, cu, return_lse=True)
    with pytest.raises(ValueError, match="grad_out must"):
        fastattn.attention_varlen_backward(out[:4], x, x, x, out, lse, cu, cu)
    with pytest.raises(ValueError, match="lse must"):
        fastattn.attention_varlen_backward(out, x, x, x, out, lse.T, cu, cu)


def test_gradients_bitwise_equal_for_any_thread_count():
    # and each sequence's are those of its own attention_backward call
    rng = np.random.default_rng(3)
    lengths = [40, 120, 75, 90, 64, 110, 50, 100, 85, 70, 128, 60]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    q = rng.standard_normal((cu[-1], 4, 64), dtype=np.float32)
    k, v = (rng.standard_normal((cu[-1], 2, 64), dtype=np.float32) for _ in range(2))
    sinks = np.array([0.5, -0.5, 0.0, 1.0], np.float32)
    out, lse = fastattn.attention_varlen(q, k, v, cu, cu, is_causal=True, sinks=sinks,
                                         return_lse=True)
    d_o = rng.standard_normal(out.shape, dtype=np.float32)
    one = fastattn.attention_varlen_backward(d_o, q, k, v, out, lse, cu, cu, is_causal=True,
                                             sinks=sinks, num_threads=1)
    for nt in (2, 3, None):
        got = fastattn.attention_varlen_backward(d_o, q, k, v, out, lse, cu, cu, is_causal=True,
                                                 sinks=sinks, num_threads=nt)
        for a, b in zip(got, one):
            np.testing.assert_array_equal(a, b)
    t = lambda a: np.swapaxes(a, 0, 1)   # noqa: E731  (rows, H, C) -> (H, rows, C)
    for b in (0, 7, 11):
        s = slice(cu[b], cu[b + 1])
        r = fastattn.attention_backward(t(d_o[s]), t(q[s]), t(k[s]), t(v[s]), t(out[s]),
                                        lse[:, s], None, True, enable_gqa=True, sinks=sinks)
        for grad, part in zip(one[:3], r[:3]):
            np.testing.assert_array_equal(t(grad[s]), part)


def test_no_query_heads_give_zero_gradients():
    cu = np.array([0, 2, 5])
    q, k, v = np.ones((5, 0, 4)), np.ones((5, 2, 4)), np.ones((5, 2, 3))
    out, lse = fastattn.attention_varlen(q, k, v, cu, cu, return_lse=True)
    grads = fastattn.attention_varlen_backward(np.ones_like(out), q, k, v, out, lse, cu, cu)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert not any(g.any() for g in grads)
