"""The backward drivers' grouped-query sum (src_c/driver/bw_scheme.h's
fa_bw_group): where dk and dv are broadcast along the last batch dimension
(the query heads of a key head), the kernel sums each key's gradient over
that dimension in order, from float accumulators, times the scale once and
(16-bit) rounded once.  One dK/dV work item per key head, in either scheme,
so the sums are bitwise the same for any thread count.

These call ``fastattn._core`` directly, as attention_backward does, to
reach what the public API cannot: a group whose heads read different keys
(the keys packed again per head), a 16-bit group's float32 sums, and
gradients broadcast where no group is."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
from fastattn._half import bfloat16

HK, G, L, S, E, EV = 2, 3, 70, 150, 16, 8
SCALE = 0.25


def _problem(dtype, seed=0, **opts):
    """Per-head keys (HK, G, S, .): each query head its own K, V; the forward's
    out and lse from the public API, per head."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((HK, G, L, E)).astype(dtype)
    k = rng.standard_normal((HK, G, S, E)).astype(dtype)
    v = rng.standard_normal((HK, G, S, EV)).astype(dtype)
    d_o = rng.standard_normal((HK, G, L, EV)).astype(dtype)
    out, lse = fastattn.attention(q, k, v, scale=SCALE, return_lse=True, **opts)
    return q, k, v, d_o, out, lse


def _kernel(q, k, v, d_o, out, lse, dk_shape, gdt, threads, *, causal=False, dq_shape=None):
    """_core.attention_backward with dk, dv of dk_shape (+ (S, .)); returns
    dq, dk, dv."""
    adt = np.float64 if q.dtype == np.float64 else np.float32
    dq = np.zeros(dq_shape or q.shape, gdt)
    dk = np.zeros(dk_shape + (S, E), gdt)
    dv = np.zeros(dk_shape + (S, EV), gdt)
    _core.attention_backward(q, k, v, out, np.asarray(lse, adt)[..., None], d_o, dq, dk, dv,
                             batch=(HK, G), scale=SCALE, causal=causal, num_threads=threads)
    return dq, dk, dv


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
          "bfloat16": bfloat16()}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_group_with_distinct_keys_per_head_sums_each_heads_gradient(isa, dtype, causal):
    dt = DTYPES[dtype]
    q, k, v, d_o, out, lse = _problem(dt, is_causal=causal)
    gdt = np.float64 if dt == np.float64 else np.float32
    per_head = _kernel(q, k, v, d_o, out, lse, (HK, G), gdt, 1, causal=causal)
    fused = _kernel(q, k, v, d_o, out, lse, (HK, 1), gdt, 1, causal=causal)
    # two key heads: on 2 threads the fused pass, a head each; on 3 the two
    # passes (bw_scheme.h: 5 ceil(2 / 3) 3 > 7 x 2)
    for nt in (2, 3):
        split = _kernel(q, k, v, d_o, out, lse, (HK, 1), gdt, nt, causal=causal)
        for got, want in zip(split, fused):
            assert _same_bits(got, want), f"num_threads={nt}"
    assert _same_bits(fused[0], per_head[0])  # dQ is per query head either way
    tol = 1e-12 if dt == np.float64 else 2e-5
    for got, heads in zip(fused[1:], per_head[1:]):
        want = heads.astype(np.float64).sum(axis=1, keepdims=True)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= tol, err


@pytest.mark.parametrize("threads", [1, 2])
def test_16_bit_group_is_its_float32_sums_rounded_once(isa, threads):
    # where the ISA path has the 16-bit backward's rounding, the kernel
    # rounds; elsewhere attention_backward rounds the kernel's float32 sums
    q, k, v, d_o, out, lse = _problem(bfloat16(), seed=1, is_causal=True)
    k, v = k[:, :1], v[:, :1]  # the grouped-query layout: one K, V per key head
    out, lse = fastattn.attention(q, k, v, scale=SCALE, is_causal=True, return_lse=True)
    wide = _kernel(q, k, v, d_o, out, lse, (HK, 1), np.float32, threads, causal=True)
    got = fastattn.attention_backward(*(x.reshape((HK * G,) + x.shape[2:]) for x in (d_o, q)),
                                      k[:, 0], v[:, 0],
                                      *(x.reshape((HK * G,) + x.shape[2:]) for x in (out, lse)),
                                      scale=SCALE, is_causal=True, enable_gqa=True,
                                      num_threads=threads)
    for name, g, w in zip(("query", "key", "value"), got, wide):
        assert _same_bits(g, w.reshape(g.shape).astype(bfloat16())), name


@pytest.mark.parametrize("case", ["dq_broadcast", "dk_alone_broadcast",
                                  "group_on_the_first_batch_dimension"])
def test_driver_refuses_gradients_broadcast_outside_the_group_nothing_written(case):
    q, k, v, d_o, out, lse = _problem(np.float64)
    adt = np.float64
    dq = np.full(q.shape, 7.0)
    dk, dv = np.full((HK, 1, S, E), 7.0), np.full((HK, 1, S, EV), 7.0)
    if case == "dq_broadcast":
        dq = np.full((HK, 1, L, E), 7.0)
    elif case == "dk_alone_broadcast":
        dv = np.full((HK, G, S, EV), 7.0)
    else:
        dk, dv = np.full((1, G, S, E), 7.0), np.full((1, G, S, EV), 7.0)
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention_backward(q, k, v, out, np.asarray(lse, adt)[..., None], d_o, dq, dk,
                                 dv, batch=(HK, G), scale=SCALE)
    assert (dq == 7.0).all() and (dk == 7.0).all() and (dv == 7.0).all()
