"""Memory: no growth over thousands of calls on every path (including the
error paths), and the streaming path's extra memory is bounded by the
threads' scratch (no L x S matrix).

Resident memory is read from ``/proc/self/status`` (Linux; tests/support.py).
Each leak test warms up, reads RSS, makes 3000 calls, reads RSS again and
allows 8 MiB of slack (malloc arenas, the OpenMP pool); the inputs are large
enough that a leaked output, input copy or scratch buffer per call would add
tens of MiB.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import fastattn
import fastattn._testing as _testing
from support import run_python, vm_rss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self (Linux only)")

WARMUP = 300
CALLS = 3000
SLACK = 8 * 2**20


def _qkv(rng, qs, ks, vs, dt=np.float32):
    return tuple(rng.standard_normal(s).astype(dt) for s in (qs, ks, vs))


def _expect(exc, fn):
    def call():
        try:
            fn()
        except exc:
            return
        raise AssertionError(f"expected {exc.__name__}")
    return call


def _n_allocs(fn):
    """How many kernel allocations fn() makes (probed with the hook)."""
    for n in range(40):
        try:
            _testing.fail_alloc_after(n)
            fn()
        except MemoryError:
            continue
        finally:
            _testing.fail_alloc_after(-1)
        return n
    raise AssertionError("fn() fails whatever the allocation budget")


def _alloc_fail(fn):
    """fn() with the allocation hook failing after n allocations, n cycling
    through every budget that makes it fail (so every partial allocation
    must be freed again)."""
    budgets = range(_n_allocs(fn))
    assert len(budgets) >= 1
    state = {"i": 0}

    def call():
        n = budgets[state["i"] % len(budgets)]
        state["i"] += 1
        try:
            _testing.fail_alloc_after(n)
            fn()
        except MemoryError:
            return
        finally:
            _testing.fail_alloc_after(-1)
        raise AssertionError(f"expected MemoryError with {n} allocations allowed")
    return call


def _paths():
    # Small problems on one thread keep 3000 calls cheap; the inputs are
    # still large enough for a leak per call to show (an output is >= 8 KiB,
    # the per-thread scratch >= 100 KiB, the split-key partials 6 KiB).
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, (1, 64, 32), (1, 128, 32), (1, 128, 32))
    q2, k2, v2 = _qkv(rng, (2, 64, 32), (2, 128, 32), (2, 128, 32))  # runs on two threads
    # split-key decode: 15 x 1 query rows (< 16 work items), 1100 keys (> 2 x 512)
    q1, k1, v1 = _qkv(rng, (15, 1, 8), (15, 1100, 8), (15, 1100, 32))
    qh, kh, vh = _qkv(rng, (1, 4, 30, 32), (1, 2, 90, 32), (1, 2, 90, 32))
    q16 = q.astype(np.float16)
    qd, kd, vd = (a.astype(np.float64) for a in (q, k, v))
    bm = rng.random((64, 128)) < 0.8
    am = rng.standard_normal((64, 128)).astype(np.float32)
    kpm = rng.random((1, 128)) < 0.1
    out = np.empty((1, 64, 32), np.float32)
    out_t = np.empty((32, 64, 1), np.float32).T
    x = rng.standard_normal((100, 300))
    xm = rng.random(300) < 0.7
    xo = np.empty_like(x)
    xi = np.arange(30000).reshape(100, 300) % 7
    A, SM = fastattn.attention, fastattn.softmax
    return {
        "streaming": lambda: A(q, k, v, num_threads=1),
        "streaming_two_threads": lambda: A(q2, k2, v2, num_threads=2),
        "streaming_float64": lambda: A(qd, kd, vd, num_threads=1),
        "streaming_float16": lambda: A(q16, k, v, num_threads=1),
        "streaming_out": lambda: A(q, k, v, out=out, num_threads=1),
        "streaming_strided_out": lambda: A(q, k, v, out=out_t, num_threads=1),
        "streaming_noncontiguous_inputs": lambda: A(q[..., ::2], k[..., ::2], v[:, ::-1],
                                                    num_threads=1),
        "weights": lambda: A(q, k, v, return_weights=True, num_threads=1),
        "bool_mask_causal": lambda: A(q, k, v, bm, is_causal=True, num_threads=1),
        "float_mask_kpm": lambda: A(q, k, v, am, key_padding_mask=kpm, num_threads=1),
        "float64_mask_converted": lambda: A(q, k, v, am.astype(np.float64), num_threads=1),
        "gqa": lambda: A(qh, kh, vh, enable_gqa=True, is_causal="lower_right", num_threads=1),
        "split_key_decode": lambda: A(q1, k1, v1, num_threads=1),
        "softmax": lambda: SM(x, axis=-1),
        "softmax_mask_out": lambda: SM(x, axis=-1, mask=xm, out=xo),
        "softmax_axis0_and_whole": lambda: (SM(x, axis=0), SM(x)),
        "softmax_int": lambda: SM(xi, axis=-1),
        # error paths, raised at different points of the validation
        "error_value_shapes": _expect(ValueError, lambda: A(q, k[..., :16], v)),
        "error_type_dtype": _expect(TypeError, lambda: A(q.astype(complex), k, v)),
        "error_value_mask_shape": _expect(ValueError, lambda: A(q, k, v, bm[:, :50])),
        "error_type_mask_dtype": _expect(TypeError, lambda: A(q, k, v, bm.astype(int))),
        "error_value_kpm_shape": _expect(ValueError,
                                         lambda: A(q, k, v, key_padding_mask=kpm[:, 1:])),
        "error_value_scale": _expect(ValueError, lambda: A(q, k, v, scale=np.nan)),
        "error_value_out_shape": _expect(ValueError, lambda: A(q, k, v, out=out[:, 1:])),
        "error_type_out_dtype": _expect(TypeError,
                                        lambda: A(q, k, v, out=out.astype(np.float64))),
        "error_value_threads": _expect(ValueError, lambda: A(q, k, v, num_threads=0)),
        "error_value_after_conversion": _expect(ValueError,
                                                lambda: A(q16, k, v, is_causal="x")),
        "error_softmax_mask": _expect(ValueError, lambda: SM(x, mask=xm[:10])),
        "memoryerror_streaming": _alloc_fail(lambda: A(q2, k2, v2, num_threads=2)),
        "memoryerror_weights": _alloc_fail(lambda: A(q2, k2, v2, return_weights=True,
                                                     num_threads=2)),
        "memoryerror_split": _alloc_fail(lambda: A(q1, k1, v1, num_threads=2)),
        "memoryerror_softmax": _alloc_fail(lambda: SM(x, axis=-1, mask=xm)),
    }


PATHS = _paths()


@pytest.mark.parametrize("path", list(PATHS))
def test_no_memory_growth_over_3000_calls(path):
    fn = PATHS[path]
    for _ in range(WARMUP):
        fn()
    gc.collect()
    before = vm_rss()
    for _ in range(CALLS):
        fn()
    gc.collect()
    grown = vm_rss() - before
    assert grown < SLACK, f"{path}: RSS grew by {grown / 2**20:.1f} MiB over {CALLS} calls"


_STREAMING_SCRIPT = """
    import numpy as np, fastattn
    from support import peak_rss_delta

    L = S = 32768
    E = 64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((L, E), dtype=np.float32)
    k = rng.standard_normal((S, E), dtype=np.float32)
    v = rng.standard_normal((S, E), dtype=np.float32)
    out = np.full((L, E), np.nan, np.float32)       # touched: resident
    # warm-up on a small problem: the OpenMP pool and the code pages
    fastattn.attention(q[:512], k[:1024], v[:1024])
    extra = peak_rss_delta(lambda: fastattn.attention(q, k, v, out=out))
    assert np.isfinite(out).all()
    # a few rows against float64
    rows = [0, 12345, L - 1]
    s = (q[rows].astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(E)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    exp = (w / w.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    np.testing.assert_allclose(out[rows], exp, rtol=1e-4, atol=1e-5)
    print("EXTRA", extra)
"""


def test_streaming_extra_memory_is_bounded_by_scratch():
    """L = S = 32768: the L x S scores would be 4 GiB; the streaming path
    must stay within its per-thread scratch (well under 64 MiB)."""
    res = run_python(_STREAMING_SCRIPT, env={"OMP_NUM_THREADS": None}, timeout=300)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("EXTRA")][0]
    extra = int(line.split()[1])
    assert extra < 64 * 2**20, (f"peak RSS exceeded the resident inputs + output by "
                                f"{extra / 2**20:.1f} MiB")
