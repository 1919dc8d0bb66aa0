"""Failed allocations inside the kernels, and a result too large to allocate.

Every allocation of ``src_c/`` goes through ``fa_malloc``; the test hook
``fastattn._testing.fail_alloc_after(n)`` lets the next ``n`` kernel
allocations succeed and fails every later one.  For ``n = 0, 1, 2, ...`` each
call must either raise ``MemoryError`` with ``out`` (filled with a sentinel)
left untouched, or -- once ``n`` covers every allocation of the call -- give
exactly the result of an unhooked call.  The hook is reset in a ``finally`` so
that a failing test cannot poison the rest of the suite.

Weights of 256-512 TB raise ``MemoryError`` at once, before any work and with
``out`` untouched.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import fastattn
import fastattn._testing as _testing
from support import run_python


SENTINEL = -12345.0


MAX_ALLOCS = 40  # far more than any call below makes


def _hook(n):
    _testing.fail_alloc_after(n)


def _check_alloc_failures(call, out_shape, out_dtype, expected):
    """Run ``call(out)`` with 0, 1, 2, ... allocations allowed.

    Returns the number of ``n`` that raised MemoryError (>= 1)."""
    failures = 0
    succeeded = False
    for n in range(MAX_ALLOCS):
        out = np.full(out_shape, SENTINEL, dtype=out_dtype)
        raised = False
        try:
            _hook(n)
            res = call(out)
        except MemoryError:
            raised = True
        finally:
            _hook(-1)
        if raised:
            assert not succeeded, f"n={n}: MemoryError after a smaller n succeeded"
            assert np.all(out == SENTINEL), f"n={n}: out was written before the MemoryError"
            failures += 1
        else:
            assert res is out
            assert np.array_equal(out, expected, equal_nan=True), \
                f"n={n}: wrong result after the allocations succeeded"
            succeeded = True
            break
    assert succeeded, f"the call still failed with {MAX_ALLOCS} allocations allowed"
    assert failures >= 1, "the kernel allocated nothing: the hook tested nothing"
    # The hook is off again: a plain call works and agrees.
    out = np.full(out_shape, SENTINEL, dtype=out_dtype)
    assert np.array_equal(call(out), expected, equal_nan=True)
    return failures


def _qkv(rng, qs, ks, vs, dtype):
    return (rng.standard_normal(qs).astype(dtype), rng.standard_normal(ks).astype(dtype),
            rng.standard_normal(vs).astype(dtype))


ATTN_CASES = {
    # name: (qshape, kshape, vshape, kwargs)
    "streaming": ((2, 300, 32), (2, 517, 32), (2, 517, 24), {}),
    "streaming_masks": ((2, 300, 32), (2, 517, 32), (2, 517, 24),
                        {"is_causal": "lower_right", "mask": "bool", "kpm": True}),
    "weights": ((2, 300, 32), (2, 517, 32), (2, 517, 24), {"return_weights": True}),
    "weights_masks": ((2, 300, 32), (2, 517, 32), (2, 517, 24),
                      {"return_weights": True, "is_causal": True, "mask": "float"}),
    "split_key_decode": ((1, 1, 1, 64), (1, 1, 5000, 64), (1, 1, 5000, 64), {}),
    "split_key_decode_batched": ((3, 2, 64), (3, 5000, 64), (3, 5000, 40),
                                 {"is_causal": "lower_right"}),
    "gqa": ((1, 4, 150, 32), (1, 2, 300, 32), (1, 2, 300, 32), {"enable_gqa": True}),
}


def _attn_call(case, dtype, num_threads):
    qs, ks, vs, kw = ATTN_CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    q, k, v = _qkv(rng, qs, ks, vs, dtype)
    kw = dict(kw)
    L, S = qs[-2], ks[-2]
    mask = kw.pop("mask", None)
    if mask == "bool":
        mask = rng.random((L, S)) < 0.8
    elif mask == "float":
        mask = rng.standard_normal((L, S)).astype(dtype)
        mask[rng.random((L, S)) < 0.1] = -np.inf
    if kw.pop("kpm", False):
        kw["key_padding_mask"] = rng.random(S) < 0.1
    rw = kw.get("return_weights", False)

    def call(out):
        res = fastattn.attention(q, k, v, mask, out=out, num_threads=num_threads, **kw)
        return res[0] if rw else res

    expected = fastattn.attention(q, k, v, mask, num_threads=num_threads, **kw)
    if rw:
        expected = expected[0]
    return call, expected


@pytest.mark.parametrize("num_threads", [1, 2, None], ids=["nt1", "nt2", "ntNone"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention_allocation_failure_raises_memory_error_out_untouched(case, dtype, num_threads):
    call, expected = _attn_call(case, dtype, num_threads)
    failures = _check_alloc_failures(call, expected.shape, expected.dtype, expected)
    if num_threads == 2:
        # per-thread scratch: the table of buffers plus one buffer per thread
        # (the problems are large enough to run on two threads)
        assert failures >= 2


def test_attention_allocation_failure_float16_out_untouched():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, (2, 300, 32), (2, 517, 32), (2, 517, 24), np.float16)
    expected = fastattn.attention(q, k, v, is_causal=True, num_threads=2)
    _check_alloc_failures(
        lambda out: fastattn.attention(q, k, v, is_causal=True, num_threads=2, out=out),
        expected.shape, np.float16, expected)


def test_attention_allocation_failure_noncontiguous_out_untouched():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (2, 300, 32), (2, 517, 32), (2, 517, 24), np.float32)
    expected = fastattn.attention(q, k, v, num_threads=2)
    for n in range(6):
        parent = np.full((24, 300, 2), SENTINEL, np.float32)
        out = parent.transpose(2, 1, 0)
        try:
            _hook(n)
            fastattn.attention(q, k, v, num_threads=2, out=out)
        except MemoryError:
            assert np.all(parent == SENTINEL)
            continue
        finally:
            _hook(-1)
        assert np.array_equal(out, expected)
        break
    else:
        pytest.fail("never succeeded")


@pytest.mark.parametrize("num_threads", [1, 2], ids=["nt1", "nt2"])
def test_varlen_allocation_failure_out_untouched(num_threads):
    """Packed sequences: a later sequence's scratch failing must not leave
    the rows of the sequences before it in out."""
    rng = np.random.default_rng(6)
    cu = np.array([0, 90, 100, 230, 240])
    q, k, v = _qkv(rng, (240, 4, 32), (240, 2, 32), (240, 2, 24), np.float32)
    expected = fastattn.attention_varlen(q, k, v, cu, cu, is_causal=True, num_threads=num_threads)
    _check_alloc_failures(
        lambda out: fastattn.attention_varlen(q, k, v, cu, cu, is_causal=True, out=out,
                                              num_threads=num_threads),
        expected.shape, np.float32, expected)


def test_memory_error_message_is_helpful():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (2, 300, 32), (2, 517, 32), (2, 517, 24), np.float32)
    try:
        _hook(0)
        with pytest.raises(MemoryError, match="memory|allocat"):
            fastattn.attention(q, k, v)
        with pytest.raises(MemoryError, match="memory|allocat"):
            fastattn.softmax(np.ones((1000, 1000)), axis=-1, mask=np.ones(1000, bool))
    finally:
        _hook(-1)


SOFTMAX_CASES = {
    # name: (shape, axis, mask?)
    "rows_mask": ((1000, 1000), -1, True),          # a scratch row per thread
    "rows_nomask": ((1000, 1000), -1, False),
    "axis0_strided": ((1000, 1000), 0, False),
    "tuple_axis_mask": ((10, 100, 1000), (1, 2), True),
    "whole_array": ((300, 700), None, True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_allocation_failure_raises_memory_error_out_untouched(case, dtype):
    shape, axis, with_mask = SOFTMAX_CASES[case]
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape).astype(dtype)
    mask = rng.random(shape[-1]) < 0.7 if with_mask else None
    expected = fastattn.softmax(x, axis=axis, mask=mask)
    _check_alloc_failures(lambda out: fastattn.softmax(x, axis=axis, mask=mask, out=out),
                          shape, dtype, expected)


def test_softmax_in_place_allocation_failure_leaves_x_untouched():
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((1000, 1000))
    mask = rng.random(1000) < 0.7
    expected = fastattn.softmax(x0, axis=-1, mask=mask)
    for n in range(MAX_ALLOCS):
        x = x0.copy()
        try:
            _hook(n)
            res = fastattn.softmax(x, axis=-1, mask=mask, out=x)
        except MemoryError:
            assert np.array_equal(x, x0), f"n={n}: x changed before the MemoryError"
            continue
        finally:
            _hook(-1)
        assert res is x and np.array_equal(x, expected)
        break
    else:
        pytest.fail("never succeeded")


def test_allocation_failure_from_several_python_threads_at_once():
    """The hook is global: with it failing every allocation, concurrent calls
    on several Python threads (each with two OpenMP threads) all raise
    MemoryError and leave their ``out`` alone."""
    import threading
    rng = np.random.default_rng(8)
    inputs = [_qkv(rng, (2, 300, 32), (2, 517, 32), (2, 517, 24), np.float32) for _ in range(4)]
    outs = [np.full((2, 300, 24), SENTINEL, np.float32) for _ in range(4)]
    results = [None] * 4

    def work(i):
        try:
            fastattn.attention(*inputs[i], num_threads=2, out=outs[i])
            results[i] = "no error"
        except MemoryError:
            results[i] = "MemoryError"
        except Exception as e:  # pragma: no cover - reported below
            results[i] = repr(e)

    try:
        _hook(0)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _hook(-1)
    assert results == ["MemoryError"] * 4
    for o in outs:
        assert np.all(o == SENTINEL)


# ---------------------------------------------------------------------------
# a result too large to allocate
# ---------------------------------------------------------------------------

_MEMORY_SCRIPT = """
    import numpy as np, fastattn
    L = S = 10**6
    dt = np.dtype({dtype!r})
    q = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, L, 1))
    k = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, S, 1))
    v = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, S, 1))
    try:
        fastattn.attention(q, k, v, return_weights=True)
    except MemoryError as e:
        print("MEMORYERROR", e)
    else:
        print("NO ERROR")
    # small L, huge S, with a sentinel out: still untouched
    q = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, 1000, 1))
    k = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, 10**9, 1))
    v = k
    out = np.full((4, 16, 1000, 1), -7, dt)
    try:
        fastattn.attention(q, k, v, return_weights=True, out=out)
    except MemoryError as e:
        print("MEMORYERROR2", bool(np.all(out == -7)))
    else:
        print("NO ERROR2")
"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_weights_too_large_raises_memory_error(dtype):
    """4*16 heads x 10**6 x 10**6 weights (256-512 TB): MemoryError, quickly.

    Run in a subprocess with a timeout so that an implementation that starts
    computing before allocating cannot hang the suite.
    """
    proc = run_python(_MEMORY_SCRIPT.format(dtype=dtype))
    assert "MEMORYERROR " in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "MEMORYERROR2 True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
