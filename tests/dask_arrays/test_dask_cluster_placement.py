"""What keeps a worker's memory bounded on a real cluster: a LocalCluster of
2 worker processes (1 thread each) holding the chunks of one half of the
heads each, as the benchmark's dask section places them.  Watched from the
scheduler: a query block never has more than two results of its merge chain
in memory (the running result and the one that replaces it), and every task
runs on the worker holding its chunks, so no chunk is copied to the other
worker.  (The bound 1.5 x share + 64 MiB itself is measured by
``python -m fastattn bench --suite dask``: at sizes a test can run in
seconds the 64 MiB dominates it.)"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict

import numpy as np
import pytest

from dask_common import CLUSTER_REASON, chain_steps, import_dask

da = import_dask()
distributed = pytest.importorskip("distributed", reason=CLUSTER_REASON)
cloudpickle = pytest.importorskip("cloudpickle", reason=CLUSTER_REASON)

import dask  # noqa: E402
import distributed.diagnostics.plugin  # noqa: E402

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402

# The workers cannot import this file: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 120
SHAPE = (1, 4, 512, 32)          # (B, H, L, D); each worker holds 2 heads
SPLIT = 4                        # query and key rows in 4 chunks


class ChainWatch(distributed.diagnostics.plugin.SchedulerPlugin):
    """A scheduler plugin: for each query block, the most results of its
    chain in memory at once, and the worker each chain task ran on."""

    def __init__(self, scheduler, prefix: str):
        self.scheduler, self.prefix = scheduler, prefix
        self.alive = defaultdict(set)
        self.most = defaultdict(int)
        self.ran_on = {}

    def transition(self, key, start, finish, *args, **kwargs):
        if not (isinstance(key, tuple) and str(key[0]).startswith(self.prefix)):
            return
        head = key[1:-1]
        if finish == "memory":
            self.alive[head].add(key)
            self.most[head] = max(self.most[head], len(self.alive[head]))
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.who_has:
                self.ran_on[key] = next(iter(ts.who_has)).address
        elif start == "memory":
            self.alive[head].discard(key)


def _chunk(shape, which, h, c):
    """Chunk c (of SPLIT along the rows) of head block h of q, k or v."""
    rows = shape[-2] // SPLIT
    full = np.random.default_rng((which, h)).standard_normal(shape, np.float32)
    return np.ascontiguousarray(full[..., c * rows:(c + 1) * rows, :])


def _pinned_inputs(client, addrs):
    """q, k, v whose chunks of head block h are made on worker addrs[h]
    -> (q, k, v), {future: the worker it was sent to}."""
    B, H, L, D = SHAPE
    shape = (B, H // len(addrs), L, D)
    arrays, sent = [], {}
    for which in range(3):
        halves = []
        for h, addr in enumerate(addrs):
            row = [client.submit(_chunk, shape, which, h, c, workers=[addr], pure=False)
                   for c in range(SPLIT)]
            sent.update(dict.fromkeys(row, addr))
            halves.append(da.concatenate(
                [da.from_delayed(dask.delayed(f), shape[:2] + (L // SPLIT, D), dtype=np.float32)
                 for f in row], axis=2))
        arrays.append(da.concatenate(halves, axis=1))
    distributed.wait(list(sent), timeout=TIMEOUT)
    return arrays, sent


def test_chains_hold_two_results_at_most_and_run_where_their_chunks_are():
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None, memory_limit=0,
                                           silence_logs=logging.CRITICAL)
    client = distributed.Client(cluster, timeout=TIMEOUT)
    try:
        addrs = sorted(client.scheduler_info()["workers"])
        (q, k, v), sent = _pinned_inputs(client, addrs)
        who = client.who_has(list(sent))
        assert all(who[f.key] == (addr,) for f, addr in sent.items())
        out = fdask.attention(q, k, v)
        watch = ChainWatch(cluster.scheduler, out.name.replace("attention", "partial"))
        cluster.scheduler.add_plugin(watch, name="chain-watch")
        # the graph as built (optimised, a chain's last step is fused with the
        # task that takes its output, under another key)
        got = client.compute(out, optimize_graph=False).result(TIMEOUT)
        qn, kn, vn = client.gather(client.compute([q, k, v]))
    finally:
        client.close(timeout=TIMEOUT)
        cluster.close(timeout=TIMEOUT)
    steps = chain_steps(out)
    assert len(steps) == 2 * SPLIT * SPLIT and set(watch.ran_on) == set(steps)
    # SPLIT steps per block, and never more than 2 of a block's results alive
    assert len(watch.most) == 2 * SPLIT and max(watch.most.values()) == 2
    # every step ran on the worker that made its head block's chunks (key[2])
    assert {key: watch.ran_on[key] for key in steps} == {key: addrs[key[2]] for key in steps}
    np.testing.assert_allclose(got, fastattn.attention(qn, kn, vn), rtol=3e-5, atol=3e-5)
