"""The backward's two schemes against the reference and against each other.

The C backward runs either one fused work item per batch index (every
product of a query block x key block pair computed once) or two passes (per
key block for dK/dV, per query block for dQ), weighing them by their busiest
thread (``src_c/driver/bw_scheme.h``): fused on one thread, and on several
where the batch indices share them evenly enough, but never where an item's
keys take more than 16 MiB, ``S (3E + 2Ev)`` elements
(``FA_BW_FUSED_MAX_BYTES`` in ``src_c/kernels/blocking.h``).  Both sum
every gradient element over the same pairs in the same order, so a batch
index's gradients are bitwise the same whichever scheme its call selects:
four heads in one call (fused, on 1 and on 2 threads) equal each head
computed alone (fused on 1 thread, two passes on 2).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fastattn
from backward_common import grad_bound as _bound
from fastattn import reference

HEADS = 4
FUSED_MAX_BYTES = 16 * 2 ** 20
PARALLEL_MIN_WORK = 200_000        # blocking.h: below this, one thread


def _fuses(nbatch, threads, L, S, E, Ev, elem):
    """bw_scheme.h's rule: the fused pass where 5 ceil(n / t) <= 7 n / t."""
    t = 1 if nbatch * L * S * (E + Ev) < PARALLEL_MIN_WORK else threads
    busiest = -(-nbatch // t)
    return S * (3 * E + 2 * Ev) * elem <= FUSED_MAX_BYTES and 5 * busiest * t <= 7 * nbatch

CASES = {
    "plain": {},
    "causal_lower_right": {"is_causal": "lower_right"},
    "window_softcap": {"window": (40, 3), "softcap": 2.5},
    "padding": {"key_padding_mask": np.arange(200) % 9 == 4},
}


def _run(q, k, v, d_o, threads, **opts):
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    return fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=threads, **opts)


def _check_reference(got, q, k, v, d_o, **opts):
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    want = reference.attention_backward(d_o, q, k, v, out, lse, **opts)
    n = max(q.shape[-2], k.shape[-2]) + q.shape[-1] + v.shape[-1]
    for name, a, b in zip(("grad_query", "grad_key", "grad_value"), got, want):
        assert a.dtype == b.dtype, name
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
        assert err <= _bound(b, q.dtype, n), (name, err)


def _same_bits(a, b):
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.tobytes() == y.tobytes()


def _both_schemes(q, k, v, d_o, heads_alone, kv_heads_alone, **opts):
    """Every head in one call (fused, on 1 and 2 threads) and the first
    heads_alone query heads (kv_heads_alone key/value heads) alone: fused on
    1 thread, two passes on the fewest threads that choose them; each against
    the reference, and all bitwise the same where they overlap."""
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    elem = 8 if q.dtype == np.float64 else 4
    assert _fuses(q.shape[1], 2, L, S, E, Ev, elem)
    fused = _run(q, k, v, d_o, 1, **opts)
    _same_bits(fused, _run(q, k, v, d_o, 2, **opts))
    _check_reference(fused, q, k, v, d_o, **opts)
    sub = (q[:, :heads_alone], k[:, :kv_heads_alone], v[:, :kv_heads_alone],
           d_o[:, :heads_alone])
    passes = next(t for t in range(2, 9) if not _fuses(heads_alone, t, L, S, E, Ev, elem))
    alone = _run(*sub, 1, **opts)
    _same_bits(alone, _run(*sub, passes, **opts))
    _check_reference(alone, *sub, **opts)
    _same_bits(alone, (fused[0][:, :heads_alone], fused[1][:, :kv_heads_alone],
                       fused[2][:, :kv_heads_alone]))


def _inputs(dtype, nq, nkv, L, S, E, Ev, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, nq, L, E)).astype(dtype)
    k = rng.standard_normal((1, nkv, S, E)).astype(dtype)
    v = rng.standard_normal((1, nkv, S, Ev)).astype(dtype)
    d_o = rng.standard_normal((1, nq, L, Ev)).astype(dtype)
    return q, k, v, d_o


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_four_heads_and_two_passes_over_one_head_agree_bitwise(isa, dtype, name):
    q, k, v, d_o = _inputs(dtype, HEADS, HEADS, 130, 200, 24, 17)
    _both_schemes(q, k, v, d_o, 1, 1, **CASES[name])


def test_fused_gqa_and_two_pass_group_agree_bitwise(isa, dtype):
    q, k, v, d_o = _inputs(dtype, 8, 4, 70, 150, 16, 16, seed=1)
    _both_schemes(q, k, v, d_o, 2, 1, enable_gqa=True, is_causal=True, window=(30, None))


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_fused_gqa_and_two_pass_group_agree_bitwise_16_bit(isa, dt):
    q, k, v, d_o = _inputs(dt, 8, 4, 90, 140, 32, 32, seed=4)
    _both_schemes(q, k, v, d_o, 2, 1, enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_fused_and_two_pass_agree_bitwise_16_bit(isa, dt):
    q, k, v, d_o = _inputs(dt, HEADS, HEADS, 90, 140, 32, 32, seed=2)
    _both_schemes(q, k, v, d_o, 1, 1, is_causal=True, softcap=3.0)


@pytest.mark.parametrize("L,S", [(300, 300), (300, 140), (90, 400)],
                         ids=["square", "more_queries_some_rows_see_nothing", "more_keys"])
def test_causal_diagonal_pairs_over_several_blocks_in_both_schemes(isa, dtype, L, S):
    q, k, v, d_o = _inputs(dtype, HEADS, HEADS, L, S, 16, 24, seed=5)
    _both_schemes(q, k, v, d_o, 1, 1, is_causal="lower_right")


def test_fused_widths_of_whole_register_tiles_agree_bitwise(isa, dtype):
    # E and Ev multiples of every ISA's tile width: the fused pass sums dK
    # and dV in the outputs themselves rather than in scratch
    q, k, v, d_o = _inputs(dtype, HEADS, HEADS, 150, 170, 64, 32, seed=6)
    _both_schemes(q, k, v, d_o, 1, 1, is_causal=True)


def test_nan_and_inf_in_hidden_values_in_both_schemes(isa, dtype):
    q, k, v, d_o = _inputs(dtype, HEADS, HEADS, 60, 150, 16, 16, seed=3)
    pad = np.zeros(150, bool)
    pad[[3, 77]] = True
    k[..., 3, :], v[..., 77, :], v[..., 149, 0] = np.nan, np.inf, np.nan   # 149: causal future
    opts = {"key_padding_mask": pad, "is_causal": True}
    _both_schemes(q, k, v, d_o, 1, 1, **opts)
    dk, dv = _run(q, k, v, d_o, 1, **opts)[1:]
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


def test_more_keys_than_the_fused_pass_takes_runs_two_passes(isa):
    E = Ev = 64
    S = FUSED_MAX_BYTES // (4 * (3 * E + 2 * Ev)) + 3          # float32: just past the bound
    q, k, v, d_o = _inputs(np.float32, HEADS, HEADS, 5, S, E, Ev, seed=4)
    got = _run(q, k, v, d_o, 1, is_causal="lower_right")
    _same_bits(got, _run(q, k, v, d_o, 2, is_causal="lower_right"))
    _check_reference(got, q, k, v, d_o, is_causal="lower_right")
