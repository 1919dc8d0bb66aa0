"""Concurrency: many Python threads calling fastattn at once, and the GIL.

* 8 Python threads x 20 calls each, every thread with its own inputs and
  its own path (streaming, weights, split-key decode, masks, GQA, float16,
  ``out=``, softmax), all started together behind a barrier: every call must
  give bitwise the result of the same call made alone on one thread; and
  4 threads each repeating one causal call with ``num_threads=2``.
* The GIL is released while a kernel runs: two Python threads each running a
  big ``num_threads=1`` call at once finish in well under the time of the two
  calls one after the other (on a machine with >= 2 cores; this is a
  functional check of the GIL release, not a speed claim), and a Python
  thread keeps running while another thread is inside a kernel.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import fastattn


N_THREADS = 8


N_CALLS = 20


def _make_jobs(rng):
    """One job per Python thread: (name, fn(num_threads, out) -> array, out spec)."""
    f32, f64 = np.float32, np.float64
    jobs = []

    def qkv(qs, ks, vs, dt):
        return tuple(rng.standard_normal(s).astype(dt) for s in (qs, ks, vs))

    q, k, v = qkv((2, 200, 32), (2, 300, 32), (2, 300, 24), f32)
    jobs.append(("streaming", lambda nt, out, a=(q, k, v): fastattn.attention(
        *a, num_threads=nt, out=out), ((2, 200, 24), f32)))

    q, k, v = qkv((2, 130, 16), (2, 270, 16), (2, 270, 16), f64)
    jobs.append(("weights", lambda nt, out, a=(q, k, v): np.concatenate([
        r.ravel() for r in fastattn.attention(*a, return_weights=True, is_causal=True,
                                              num_threads=nt)]), None))

    q, k, v = qkv((2, 1, 64), (2, 3000, 64), (2, 3000, 64), f32)
    jobs.append(("split_key_decode", lambda nt, out, a=(q, k, v): fastattn.attention(
        *a, num_threads=nt, out=out), ((2, 1, 64), f32)))

    q, k, v = qkv((3, 150, 32), (3, 260, 32), (3, 260, 32), f64)
    bm = rng.random((150, 260)) < 0.8
    kpm = rng.random((3, 260)) < 0.1
    jobs.append(("masks", lambda nt, out, a=(q, k, v): fastattn.attention(
        *a, bm, is_causal="lower_right", key_padding_mask=kpm, num_threads=nt),
        None))

    q, k, v = qkv((1, 6, 100, 32), (1, 2, 300, 32), (1, 2, 300, 32), f32)
    am = rng.standard_normal((100, 300)).astype(f32)
    jobs.append(("gqa_float_mask", lambda nt, out, a=(q, k, v): fastattn.attention(
        *a, am, enable_gqa=True, num_threads=nt), None))

    q, k, v = qkv((2, 150, 32), (2, 300, 32), (2, 300, 32), np.float16)
    jobs.append(("float16_strided_out", lambda nt, out, a=(q, k, v): fastattn.attention(
        *a, is_causal=True, num_threads=nt, out=out), ((2, 150, 32), np.float16)))

    x = rng.standard_normal((300, 700)).astype(f32)
    m = rng.random(700) < 0.8
    jobs.append(("softmax_rows_mask", lambda nt, out, x=x: fastattn.softmax(
        x, axis=-1, mask=m, out=out), ((300, 700), f32)))

    x = rng.standard_normal((40, 50, 60))
    jobs.append(("softmax_axes", lambda nt, out, x=x: fastattn.softmax(x, axis=(0, 2)), None))
    assert len(jobs) == N_THREADS
    return jobs


def _new_out(spec, strided):
    if spec is None:
        return None
    shape, dt = spec
    if strided:  # a transposed view: any strides are allowed for out
        return np.full(shape[::-1], np.nan, dt).T
    return np.full(shape, np.nan, dt)


def test_many_python_threads_each_get_their_own_answer():
    rng = np.random.default_rng(2024)
    jobs = _make_jobs(rng)
    # ground truth: each job alone, on one thread, before any concurrency
    expected = [fn(1, _new_out(spec, False)).copy() for _, fn, spec in jobs]
    errors = []
    barrier = threading.Barrier(N_THREADS)

    def work(i):
        name, fn, spec = jobs[i]
        try:
            barrier.wait(timeout=60)
            for c in range(N_CALLS):
                nt = (None, 1, 2, 3)[(c + i) % 4]
                out = _new_out(spec, strided=c % 2 == 1)
                got = fn(nt, out)
                if out is not None and got is not out:
                    errors.append(f"{name}: out= not returned")
                if not np.array_equal(got, expected[i], equal_nan=True):
                    errors.append(f"{name} call {c} (num_threads={nt}): result differs from "
                                  f"the single-threaded one")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[:10]


def test_concurrent_calls_share_read_only_inputs():
    """The same (read-only, broadcast) inputs from 8 threads at once."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((4, 120, 32))
    k = np.broadcast_to(rng.standard_normal((1, 260, 32)), (4, 260, 32))
    v = rng.standard_normal((260, 16))
    for a in (q, v):
        a.flags.writeable = False
    expected = fastattn.attention(q, k, v, is_causal=True, num_threads=1)
    errors = []

    def work():
        for _ in range(N_CALLS):
            if not np.array_equal(fastattn.attention(q, k, v, is_causal=True), expected):
                errors.append("differs")

    threads = [threading.Thread(target=work) for _ in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors


def test_concurrent_python_threads():
    """Several Python threads calling attention at once get correct results."""
    rng = np.random.default_rng(11)
    inputs = [tuple(rng.standard_normal(s).astype(np.float32) for s in
                    [(2, 150, 32), (2, 300, 32), (2, 300, 16)]) for _ in range(4)]
    expected = [fastattn.attention(*qkv, is_causal=True, num_threads=1) for qkv in inputs]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                got = fastattn.attention(*inputs[i], is_causal=True, num_threads=2)
                if not np.array_equal(got, expected[i]):
                    errors.append(f"thread {i}: wrong result")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------------------
# the GIL is released during the kernels
# ---------------------------------------------------------------------------

def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _big_problem():
    rng = np.random.default_rng(1)
    L = S = 4096   # ~0.2 s on one AVX2 core
    return tuple(rng.standard_normal((n, 64)).astype(np.float32) for n in (L, S, S))


def test_gil_released_two_threads_kernels_overlap():
    """Two threads calling with num_threads=1 are inside the kernel at the
    same time: were the GIL held during the kernel, the second call could not
    start before the first returned.  A functional check on the intervals
    (no timing threshold), robust to a loaded machine."""
    q, k, v = _big_problem()
    fastattn.attention(q, k, v, num_threads=1)  # warm up
    barrier = threading.Barrier(2)
    spans = [None, None]

    def call(i):
        barrier.wait()
        t0 = time.perf_counter()
        fastattn.attention(q, k, v, num_threads=1)
        spans[i] = (t0, time.perf_counter())

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (s0, e0), (s1, e1) = spans
    assert max(s0, s1) < min(e0, e1), f"kernel calls did not overlap: {spans}"


def _max_gap_while(fn):
    """Run fn() on another thread; return (its duration, the longest pause of
    a Python loop on this thread meanwhile)."""
    done = threading.Event()
    span = []

    def target():
        t0 = time.perf_counter()
        fn()
        span.append(time.perf_counter() - t0)
        done.set()

    t = threading.Thread(target=target)
    last = time.perf_counter()
    gap = 0.0
    t.start()
    while not done.is_set():
        now = time.perf_counter()
        gap = max(gap, now - last)
        last = now
    t.join()
    return span[0], gap


@pytest.mark.parametrize("which", ["attention", "attention_weights", "softmax"])
def test_gil_released_python_thread_keeps_running(which):
    """While a kernel runs on one thread, a pure-Python loop on another keeps
    going: with the GIL held it would stall for the whole kernel."""
    q, k, v = _big_problem()
    x = np.random.default_rng(3).standard_normal((4000, 4000))
    fn = {
        "attention": lambda: fastattn.attention(q, k, v, num_threads=1),
        "attention_weights": lambda: fastattn.attention(q[:2048], k, v, num_threads=1,
                                                        return_weights=True),
        "softmax": lambda: fastattn.softmax(x, axis=-1),
    }[which]
    fn()
    results = []
    for _attempt in range(3):
        dur, gap = _max_gap_while(fn)
        results.append((dur, gap))
        if gap < 0.5 * dur:
            break
    assert any(gap < 0.5 * dur for dur, gap in results), results
