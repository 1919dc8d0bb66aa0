"""fastattn.dask.attention on a real dask.distributed cluster: a LocalCluster
of 2 worker processes (1 thread each), spawned here and shut down after,
with a low memory limit.  The same bits as the synchronous scheduler; a
worker killed mid-computation is replaced and its tasks rerun; a causal
problem whose K and V exceed one worker's memory limit completes."""

from __future__ import annotations

import logging
import os
import signal
import sys

import numpy as np
import pytest

from dask_common import CLUSTER_REASON, import_dask

da = import_dask()
distributed = pytest.importorskip("distributed", reason=CLUSTER_REASON)
cloudpickle = pytest.importorskip("cloudpickle", reason=CLUSTER_REASON)

import dask  # noqa: E402

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402
import support  # noqa: E402
from fastattn import _dask_tasks, reference  # noqa: E402

# The workers cannot import this file or tests/support.py: their functions
# travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(support)

MEMORY_LIMIT = 240 * 2**20       # per worker; each idles at about 90 MiB
TIMEOUT = 120                    # seconds, for anything that waits on the cluster


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       memory_limit=MEMORY_LIMIT, dashboard_address=None,
                                       silence_logs=logging.CRITICAL)
    c = distributed.Client(cluster, timeout=TIMEOUT)
    try:
        yield c
    finally:
        c.close(timeout=TIMEOUT)
        cluster.close(timeout=TIMEOUT)


def _compute(client, *arrays):
    futures = client.compute(list(arrays))
    distributed.wait(futures, timeout=TIMEOUT)
    return client.gather(futures)


def _normal_block(x, seed, block_id=None):
    """Normal float32 values for a block, a function of (seed, block) alone."""
    return np.random.default_rng((seed,) + block_id).standard_normal(x.shape, np.float32)


def _lazy_normal(shape, chunks, seed):
    """A float32 array whose blocks are made where they are needed."""
    return da.zeros(shape, dtype=np.float32, chunks=chunks).map_blocks(
        _normal_block, seed, dtype=np.float32)


def _kill_once(x, marker, victim, block_id=None):
    """The block itself; but the first time block ``victim`` is made, the
    worker process making it is killed (SIGKILL), after noting its pid."""
    if block_id == victim and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _problem():
    shape, kshape = (2, 4, 192, 32), (2, 4, 320, 32)
    q = _lazy_normal(shape, (1, 2, 64, 32), 1)
    k = _lazy_normal(kshape, (2, 4, 40, 32), 2)
    v = _lazy_normal(kshape, (2, 2, 40, 32), 3)
    return q, k, v


OPTS = {"is_causal": "lower_right", "alibi_slopes": [0.1, 0.2, 0.3, 0.4],
        "sinks": [0.0, 1.0, -1.0, 2.0], "return_lse": True}


def test_cluster_result_is_bitwise_the_synchronous_one(client):
    q, k, v = _problem()
    out, lse = fdask.attention(q, k, v, **OPTS)
    got, got_lse = _compute(client, out, lse)
    want, want_lse = dask.compute(out, lse, scheduler="sync")
    assert np.array_equal(got, want) and np.array_equal(got_lse, want_lse)
    qn, kn, vn = dask.compute(q, k, v, scheduler="sync")
    whole, whole_lse = fastattn.attention(qn, kn, vn, **OPTS)
    np.testing.assert_allclose(got, whole, rtol=3e-5, atol=3e-5)
    np.testing.assert_allclose(got_lse, whole_lse, rtol=3e-5, atol=3e-5)


def test_tasks_default_to_the_worker_s_threads(client):
    assert client.submit(_dask_tasks._worker_threads, pure=False).result(TIMEOUT) == 1


def test_worker_killed_mid_computation_is_replaced_and_the_result_exact(client, tmp_path):
    marker = str(tmp_path / "killed")
    q, k, v = _problem()
    k = k.map_blocks(_kill_once, marker, (0, 0, 4, 0), dtype=k.dtype)
    out, lse = fdask.attention(q, k, v, **OPTS)
    got, got_lse = _compute(client, out, lse)
    with open(marker) as f:
        pid = int(f.read())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)                      # that worker is gone
    want, want_lse = dask.compute(out, lse, scheduler="sync")   # the marker is there now
    assert np.array_equal(got, want) and np.array_equal(got_lse, want_lse)
    client.wait_for_workers(2, timeout=TIMEOUT)


def test_causal_problem_whose_keys_and_values_exceed_a_worker_s_memory(client):
    client.wait_for_workers(2, timeout=TIMEOUT)
    S, L, H, E = 2**20, 256, 2, 16
    k = _lazy_normal((1, H, S, E), (1, H, S // 16, E), 5)
    v = _lazy_normal((1, H, S, E), (1, H, S // 16, E), 6)
    q = _lazy_normal((1, H, L, E), (1, H, L // 2, E), 7)
    assert k.nbytes + v.nbytes > MEMORY_LIMIT          # 256 MiB against 240 MiB
    out, lse = fdask.attention(q, k, v, is_causal="lower_right", return_lse=True)
    got, got_lse = _compute(client, out, lse)
    peaks = client.run(support.vm_hwm)
    assert max(peaks.values()) < MEMORY_LIMIT, peaks
    qn, kn, vn = dask.compute(q, k, v, scheduler="sync")
    for i in (0, 77, 200, 255):                        # query i sees keys j <= i + S - L
        n = i + S - L + 1
        want, want_lse = reference.attention(qn[..., i:i + 1, :], kn[..., :n, :],
                                             vn[..., :n, :], return_lse=True)
        np.testing.assert_allclose(got[..., i:i + 1, :], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got_lse[..., i:i + 1], want_lse, rtol=1e-5, atol=1e-5)
