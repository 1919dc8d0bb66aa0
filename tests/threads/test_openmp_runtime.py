"""The OpenMP runtime: ``OMP_NUM_THREADS``, threadpoolctl and fork.

* ``num_threads=None`` follows ``OMP_NUM_THREADS`` when it is set.
* threadpoolctl sees fastattn's OpenMP runtime, and
  ``threadpool_limits(1, "openmp")`` makes fastattn single-threaded.
* A child ``fork()``ed after fastattn has used its OpenMP thread pool can
  still call fastattn (default threads and ``num_threads=2``) and gets the
  right answer instead of deadlocking.  These run in a subprocess with a
  timeout, so that a deadlock fails the test instead of hanging CI.
"""

from __future__ import annotations

import os

import pytest

import fastattn
import fastattn._core as _core
from support import run_python


TIMEOUT = 60


def _run(script, env=None):
    """The output of ``script`` in a fresh interpreter, with OMP_NUM_THREADS
    unset unless ``env`` sets it."""
    return run_python(script, env={"OMP_NUM_THREADS": None, **(env or {})},
                      timeout=TIMEOUT).stdout


needs_openmp = pytest.mark.skipif(not fastattn.openmp_enabled(),
                                  reason="serial build: no OpenMP runtime")


# ---------------------------------------------------------------------------
# OMP_NUM_THREADS and num_threads
# ---------------------------------------------------------------------------

@needs_openmp
@pytest.mark.parametrize("n", ["1", "3"])
def test_num_threads_none_follows_omp_num_threads(n):
    out = _run("""
        import numpy as np, fastattn, fastattn._core as c
        print("MAX", c.openmp_max_threads())
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 300, 32)) for _ in range(3))
        a = fastattn.attention(q, k, v)
        b = fastattn.attention(q, k, v, num_threads=1)
        print("SAME", bool(np.array_equal(a, b)))
    """, {"OMP_NUM_THREADS": n})
    assert f"MAX {n}" in out
    assert "SAME True" in out


@needs_openmp
def test_without_omp_num_threads_default_is_usable_cpus():
    out = _run("import fastattn._core as c, fastattn; print('MAX', c.openmp_max_threads())")
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cpus = os.cpu_count()
    assert 1 <= int(out.split()[-1]) <= cpus


# ---------------------------------------------------------------------------
# threadpoolctl
# ---------------------------------------------------------------------------

@needs_openmp
def test_threadpoolctl_sees_fastattn_openmp_and_limits_it():
    pytest.importorskip("threadpoolctl")
    out = _run("""
        import numpy as np
        import fastattn, fastattn._core as c
        from threadpoolctl import threadpool_info, threadpool_limits
        apis = [i["user_api"] for i in threadpool_info()]
        print("OPENMP_LISTED", "openmp" in apis)
        before = c.openmp_max_threads()
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 300, 32)) for _ in range(3))
        ref = fastattn.attention(q, k, v, num_threads=1)
        with threadpool_limits(1, "openmp"):
            print("INSIDE", c.openmp_max_threads())
            print("SAME", bool(np.array_equal(fastattn.attention(q, k, v), ref)))
        print("RESTORED", c.openmp_max_threads() == before)
    """, {"OMP_NUM_THREADS": "2"})
    assert "OPENMP_LISTED True" in out, out
    assert "INSIDE 1" in out, out
    assert "SAME True" in out
    assert "RESTORED True" in out


@needs_openmp
def test_threadpoolctl_limit_in_this_process():
    tpc = pytest.importorskip("threadpoolctl")
    before = _core.openmp_max_threads()
    with tpc.threadpool_limits(1, "openmp"):
        assert _core.openmp_max_threads() == 1
    assert _core.openmp_max_threads() == before


# ---------------------------------------------------------------------------
# fork after the thread pool has been used
# ---------------------------------------------------------------------------

_FORK_SCRIPT = """
    import multiprocessing as mp
    import numpy as np
    import fastattn

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 300, 32)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((1000, 1000))
    # the parent uses its OpenMP pool (two threads) before forking
    ref = fastattn.attention(q, k, v, num_threads=2)
    ref_w = fastattn.attention(q, k, v, num_threads=2, return_weights=True)[1]
    ref_sm = fastattn.softmax(x, axis=-1)

    def child(nt):
        o = fastattn.attention(q, k, v, num_threads=nt)
        w = fastattn.attention(q, k, v, num_threads=nt, return_weights=True)[1]
        s = fastattn.softmax(x, axis=-1)
        return (bool(np.array_equal(o, ref)), bool(np.array_equal(w, ref_w)),
                bool(np.array_equal(s, ref_sm)))

    def proc_target():
        import sys
        sys.exit(0 if child(None) == (True, True, True) else 3)

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        with ctx.Pool(2) as pool:
            res = pool.map(child, [None, 2, None, 2], chunksize=1)
        print("CHILDREN", res)
        # a plain fork()ed Process too, and the parent still works afterwards
        p = ctx.Process(target=proc_target)
        p.start()
        p.join(30)
        print("PROCESS", p.exitcode)
        print("PARENT", bool(np.array_equal(fastattn.attention(q, k, v, num_threads=2), ref)))
"""


@needs_openmp
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_after_thread_pool_use_gets_correct_results():
    out = _run(_FORK_SCRIPT, {"OMP_NUM_THREADS": "2"})
    assert "CHILDREN [(True, True, True), (True, True, True), (True, True, True), " \
           "(True, True, True)]" in out, out
    assert "PROCESS 0" in out, out
    assert "PARENT True" in out, out


@needs_openmp
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_default_threads_without_omp_num_threads():
    out = _run(_FORK_SCRIPT)
    assert "CHILDREN [(True, True, True), (True, True, True), (True, True, True), " \
           "(True, True, True)]" in out, out
    assert "PROCESS 0" in out, out
