"""The backward pass streams: its extra memory is its gradients, the rows'
``D - grad_lse`` and the threads' block scratch, never an ``L x S`` buffer.
A (1, 2, 4096, 64) float32 call would need 128 MiB for its weights alone;
it adds at most 16 MiB (the three gradients are 6 MiB), on every ISA path."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

import fastattn
from support import peak_rss_delta

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self (Linux only)")

BOUND = 16 * 2**20


def test_backward_streaming_extra_memory_is_far_below_l_times_s(isa):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 4096, 64), dtype=np.float32) for _ in "qkv")
    out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True)
    d_o = rng.standard_normal(out.shape, dtype=np.float32)
    small = tuple(x[:, :, :256] for x in (d_o, q, k, v, out, lse))
    fastattn.attention_backward(*small, is_causal=True)                  # warm-up
    grads = []
    delta = peak_rss_delta(lambda: grads.append(
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True)))
    assert delta < BOUND, f"{delta / 2**20:.1f} MiB"
    assert all(np.isfinite(g).all() for g in grads[0])


@pytest.mark.parametrize("dt", [np.dtype(ml_dtypes.bfloat16)], ids=["bfloat16"])
def test_16_bit_backward_extra_memory_is_far_below_l_times_s(isa, dt):
    """bfloat16 inputs (the matrix tiers' own driver): the same bound."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 4096, 64), dtype=np.float32).astype(dt) for _ in "qkv")
    out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True)
    d_o = rng.standard_normal(out.shape, dtype=np.float32).astype(dt)
    small = tuple(x[:, :, :256] for x in (d_o, q, k, v, out, lse))
    fastattn.attention_backward(*small, is_causal=True)                  # warm-up
    grads = []
    delta = peak_rss_delta(lambda: grads.append(
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True)))
    assert delta < BOUND, f"{delta / 2**20:.1f} MiB"
    assert all(np.isfinite(g.astype(np.float32)).all() for g in grads[0])
