"""attention_backward under failed kernel allocations: every allocation of
the backward driver (the threads' scratch, the rows' D - grad_lse, the check
flags) is made before any gradient is written, so for n = 0, 1, 2, ...
allowed allocations a call either raises MemoryError or gives exactly the
unhooked result."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fastattn
import fastattn._testing as _testing


def _each_failure_raises_or_changes_nothing(call):
    want = call()
    failed = 0
    for n in range(40):
        try:
            _testing.fail_alloc_after(n)
            got = call()
        except MemoryError:
            failed += 1
            continue
        finally:
            _testing.fail_alloc_after(-1)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        break
    else:
        raise AssertionError("the call never succeeded within 40 allocations")
    assert failed >= 1


def test_each_failed_allocation_raises_memory_error_or_changes_nothing():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 90, 16)) for _ in "qkv")
    opts = {"is_causal": True, "sinks": np.array([0.1, 0.2])}
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape)
    _each_failure_raises_or_changes_nothing(
        lambda: fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=2, **opts))


@pytest.mark.parametrize("dt", [np.dtype(ml_dtypes.bfloat16)], ids=["bfloat16"])
@pytest.mark.parametrize("heads", [1, 4], ids=["two_passes", "fused"])
def test_each_failed_allocation_of_16_bit_inputs_raises_or_changes_nothing(isa, dt, heads):
    """bfloat16 on each ISA path: the matrix tiers run their own 16-bit
    driver (driver/bw16.c), with its own scratch."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, heads, 90, 16)).astype(dt) for _ in "qkv")
    opts = {"is_causal": True, "sinks": np.linspace(0.1, 0.4, heads)}
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(dt)
    _each_failure_raises_or_changes_nothing(
        lambda: fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=2, **opts))


def test_each_failed_allocation_of_packed_sequences_raises_or_changes_nothing():
    """attention_varlen_backward: each sequence's call allocates its own
    scratch, some side by side on two threads."""
    rng = np.random.default_rng(2)
    cu = np.array([0, 70, 75, 160, 170])
    q = rng.standard_normal((170, 4, 16))
    k, v = rng.standard_normal((170, 2, 16)), rng.standard_normal((170, 2, 8))
    opts = {"is_causal": True, "sinks": np.array([0.1, 0.2, 0.3, 0.4])}
    out, lse = fastattn.attention_varlen(q, k, v, cu, cu, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape)
    _each_failure_raises_or_changes_nothing(
        lambda: fastattn.attention_varlen_backward(d_o, q, k, v, out, lse, cu, cu,
                                                   num_threads=2, **opts))
