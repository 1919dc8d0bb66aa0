"""The ``dask`` section of the benchmark: :func:`fastattn.dask.attention` on a
``dask.distributed.LocalCluster`` of 2 worker processes (1 thread each)
against the in-memory :func:`fastattn.attention` on 2 threads, in the same
run, and each worker's peak memory.

The inputs are made on the workers, each worker holding its half of the
heads of Q, K and V (as a cluster holds data it loaded); the timed dask call
is ``persist`` + ``wait`` (the result stays on the workers, as the in-memory
result stays in memory).  Rounds alternate the implementations; medians and
the median of the per-round ratios are reported.  A worker's peak memory is
its ``VmHWM`` (reset before each run through ``/proc/self/clear_refs``) less
its resident memory before the inputs were made.  Skipped, with a line
saying so, when dask or distributed is not installed.
"""

from __future__ import annotations

import gc
import logging
import operator
import statistics
import time

import numpy as np

SHAPE = (1, 8, 65536, 64)          # (B, H, L, D), L = S, float32, non-causal
QUICK_SHAPE = (1, 8, 4096, 64)
ROUNDS = 3
WORKERS = 2
# (label, query rows per chunk, key rows per chunk) as fractions of L: the
# heads are always split in two (one half per worker)
LAYOUTS = (("heads split", 1, 1), ("heads split, queries and keys in 4", 4, 4))


def _block(seed: int, which: int, h: int, shape: tuple) -> np.ndarray:
    return np.random.default_rng((seed, which, h)).standard_normal(shape, np.float32)


def _make_block(shape, h):
    """(q, k, v) of head block h."""
    return tuple(_block(0, w, h, shape) for w in range(3))


def _rss(field: str = "VmRSS:") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def _peak() -> int:
    return _rss("VmHWM:")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux); False if it cannot be."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _warm():
    import fastattn
    x = np.ones((1, 2, 8, 4), np.float32)
    fastattn.attention(x, x, x)
    return _reset_peak()


def _inputs_on_workers(client, da, dask, addrs, shape):
    """q, k, v as dask arrays whose head block h lives on worker addrs[h]."""
    B, H, L, D = shape
    hb = H // len(addrs)
    blocks = []
    for h, addr in enumerate(addrs):
        trio = client.submit(_make_block, (B, hb, L, D), h, workers=[addr], pure=False)
        blocks.append([client.submit(operator.getitem, trio, i, workers=[addr], pure=False)
                       for i in range(3)])
    arrays = []
    for i in range(3):
        parts = [da.from_delayed(dask.delayed(b[i]), (B, hb, L, D), dtype=np.float32)
                 for b in blocks]
        arrays.append(da.concatenate(parts, axis=1))
    wait_on = [f for b in blocks for f in b]
    return arrays, wait_on


def _local_inputs(shape, n):
    B, H, L, D = shape
    hb = H // n
    per = [_make_block((B, hb, L, D), h) for h in range(n)]
    return tuple(np.concatenate([p[i] for p in per], axis=1) for i in range(3))


def _table(rows):
    head = ("| layout | in-memory 2 threads | dask 2 workers x 1 thread | speed vs in-memory "
            "| worker peak extra (MiB) | target (MiB) |")
    out = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['mem_s']:.2f} s | {r['dask_s']:.2f} s | "
                   f"{r['ratio']:.2f}x | {r['peak_mib']} | <= {r['target_mib']:.0f} |")
    return "\n".join(out)


def run_dask_section(*, quick: bool = False, repeats: int | None = None, progress=None) -> str:
    """Run the section; -> its markdown (or the line saying it was skipped)."""
    try:
        import dask
        import dask.array as da
        import distributed
        import fastattn.dask as fdask
    except ImportError as e:
        return (f"## Dask\n\nskipped: {e.name or 'dask'} is not installed "
                "(pip install 'fastattn[dask]')\n")
    import fastattn
    note = progress.note if progress is not None else (lambda s: None)
    status = progress.status if progress is not None else (lambda s: None)
    shape = QUICK_SHAPE if quick else SHAPE
    rounds = repeats or ROUNDS
    B, H, L, D = shape
    cluster = distributed.LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit=0,
                                       silence_logs=logging.ERROR)
    client = distributed.Client(cluster)
    try:
        addrs = sorted(client.scheduler_info()["workers"])
        resettable = all(client.run(_warm).values())
        base = client.run(_rss)
        (q, k, v), futures = _inputs_on_workers(client, da, dask, addrs, shape)
        distributed.wait(futures)
        qn, kn, vn = _local_inputs(shape, WORKERS)
        share = (qn.nbytes * 3) // WORKERS
        results = {lab: {"mem": [], "dask": [], "peak": []} for lab, _, _ in LAYOUTS}
        outs = {}
        for r in range(rounds):
            for label, qsplit, ksplit in LAYOUTS:
                status(f"dask round {r + 1}/{rounds}: in-memory")
                t0 = time.perf_counter()
                want = fastattn.attention(qn, kn, vn, num_threads=WORKERS)
                results[label]["mem"].append(time.perf_counter() - t0)
                status(f"dask round {r + 1}/{rounds}: {label}")
                qc = q.rechunk((B, H // WORKERS, L // qsplit, D))
                kc, vc = (x.rechunk((B, H // WORKERS, L // ksplit, D)) for x in (k, v))
                out = fdask.attention(qc, kc, vc)
                client.run(_reset_peak)
                t0 = time.perf_counter()
                done = client.persist(out)
                distributed.wait(done)
                results[label]["dask"].append(time.perf_counter() - t0)
                peaks = client.run(_peak)
                results[label]["peak"].append(max(peaks[a] - base[a] for a in addrs))
                if r == rounds - 1:
                    got = done.compute()
                    outs[label] = float(np.max(np.abs(got - want)))
                del done
        rows = []
        for label, _, _ in LAYOUTS:
            res = results[label]
            ratio = statistics.median(m / d for m, d in zip(res["mem"], res["dask"]))
            rows.append({"label": label, "mem_s": statistics.median(res["mem"]),
                         "dask_s": statistics.median(res["dask"]), "ratio": ratio,
                         "peak_mib": round(statistics.median(res["peak"]) / 2**20),
                         "target_mib": (1.5 * share + 64 * 2**20) / 2**20})
            note(f"dask {label}: ratio {ratio:.2f}, max |dask - in-memory| {outs[label]:.2e}")
    finally:
        client.close()
        cluster.close()
    errs = ", ".join(f"{lab}: {e:.1e}" for lab, e in outs.items())
    return "\n".join([
        "## Dask (fastattn.dask on a LocalCluster)", "",
        f"({B}, {H}, {L}, {D}) float32, non-causal; {WORKERS} worker processes x 1 thread "
        f"against the in-memory call on {WORKERS} threads, {rounds} alternating rounds, "
        "medians; speed = median of the per-round ratios (in-memory time / dask time, >= 0.8 "
        "is the target). Each worker holds half of the heads of Q, K, V "
        f"({share >> 20} MiB); peak extra = its VmHWM less its RSS before the inputs "
        "(result included), target 1.5 x its share + 64 MiB"
        + ("" if resettable else " (VmHWM could not be reset: peaks since start)")
        + f". Max |dask - in-memory|: {errs}. On a shared machine these figures are noisy.",
        "", _table(rows), ""])
