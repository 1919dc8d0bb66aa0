"""The ``dask`` section of the benchmark: :func:`fastattn.dask.attention` on a
``dask.distributed.LocalCluster`` of 2 worker processes (1 thread each)
against the in-memory :func:`fastattn.attention` on 2 threads, in the same
run, and each worker's peak memory against its bound.

The inputs are made on the workers, already in the layout's chunks, each
worker holding the chunks of its half of the heads of Q, K and V (as a
cluster holds data it loaded); a worker's *share* is the bytes of the input
chunks the scheduler records on it.  The timed dask call is ``persist`` +
``wait`` (the result stays on the workers, as the in-memory result stays in
memory).  Rounds alternate the implementations; medians and the median of
the per-round ratios are reported.  A worker's peak is its ``VmHWM`` (reset
through ``/proc/self/clear_refs`` once its inputs exist) less its resident
memory when idle, before the inputs were made (so it counts its share and
its part of the result); the highest of the rounds is checked against the
bound ``1.5 x share + 64 MiB``.  Skipped, with a line saying so, when dask
or distributed is not installed.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from .procmem import reset_peak

SHAPE = (1, 8, 32768, 64)          # (B, H, L, D), L = S, float32, non-causal
QUICK_SHAPE = (1, 8, 4096, 64)
ROUNDS = 3
WORKERS = 2
# (label, query rows per chunk, key rows per chunk) as fractions of L: the
# heads are always split in two (one half per worker)
LAYOUTS = (("heads split", 1, 1), ("heads split, queries and keys in 4", 4, 4))
# A worker's peak over idle may be BOUND_SHARE x its share of the inputs + BOUND_MIB.
BOUND_SHARE, BOUND_MIB = 1.5, 64
MIB = 2**20


def _block(seed: int, which: int, h: int, shape: tuple) -> np.ndarray:
    return np.random.default_rng((seed, which, h)).standard_normal(shape, np.float32)


def _make_block(shape, h):
    """(q, k, v) of head block h."""
    return tuple(_block(0, w, h, shape) for w in range(3))


def _make_chunks(shape, h, splits):
    """(q, k, v) of head block h, each cut along its rows into ``splits[i]``
    contiguous chunks: a tuple of three lists."""
    L = shape[-2]
    return tuple([np.ascontiguousarray(x[..., c * L // n:(c + 1) * L // n, :])
                  for c in range(n)] for x, n in zip(_make_block(shape, h), splits))


def _pick(chunks, i: int, c: int) -> np.ndarray:
    return chunks[i][c]


def _rss(field: str = "VmRSS:") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def _peak() -> int:
    return _rss("VmHWM:")


def _warm():
    import fastattn
    x = np.ones((1, 2, 8, 4), np.float32)
    fastattn.attention(x, x, x)
    return reset_peak()


def _held(dask_worker) -> int:
    return len(dask_worker.data)


def _idle(client) -> dict:
    """Each worker's resident memory once it holds nothing (after the last
    layout's data is released), with its VmHWM reset."""
    for _ in range(100):
        if not any(client.run(_held).values()):
            break
        time.sleep(0.1)
    client.run(reset_peak)
    return client.run(_rss)


def _inputs_on_workers(client, da, dask, addrs, shape, splits):
    """q, k, v as dask arrays chunked along the rows as ``splits`` says,
    whose chunks of head block h are made and held on worker addrs[h]
    -> (q, k, v), the futures of the chunks."""
    B, H, L, D = shape
    hb = H // len(addrs)
    held, per_worker = [], []
    for h, addr in enumerate(addrs):
        made = client.submit(_make_chunks, (B, hb, L, D), h, splits, workers=[addr],
                             pure=False)
        trio = []
        for i, n in enumerate(splits):
            row = [client.submit(_pick, made, i, c, workers=[addr], pure=False)
                   for c in range(n)]
            held += row
            trio.append([da.from_delayed(dask.delayed(f), (B, hb, L // n, D), dtype=np.float32)
                         for f in row])
        per_worker.append(trio)
    arrays = tuple(da.concatenate([da.concatenate(w[i], axis=2) for w in per_worker], axis=1)
                   for i in range(3))
    return arrays, held


def _shares(client, futures, addrs) -> dict:
    """The bytes of ``futures``' data on each worker, as the scheduler records them."""
    who = client.who_has(futures)
    nbytes = client.nbytes(list(who), summary=False)
    share = dict.fromkeys(addrs, 0)
    for key, workers in who.items():
        for w in workers:
            share[w] += nbytes[key]
    return share


def _local_inputs(shape, n):
    B, H, L, D = shape
    hb = H // n
    per = [_make_block((B, hb, L, D), h) for h in range(n)]
    return tuple(np.concatenate([p[i] for p in per], axis=1) for i in range(3))


def _run_layout(env, splits, want=None) -> dict:
    """One dask run of a layout: inputs made on the workers, the timed
    ``persist``, each worker's share and peak over idle, and (given the
    in-memory result) the largest difference from it."""
    client, distributed, addrs = env["client"], env["distributed"], env["addrs"]
    base = _idle(client)
    (q, k, v), futures = _inputs_on_workers(client, env["da"], env["dask"], addrs,
                                            env["shape"], splits)
    distributed.wait(futures)
    share = _shares(client, futures, addrs)
    out = env["fdask"].attention(q, k, v)
    client.run(reset_peak)
    t0 = time.perf_counter()
    done = client.persist(out)
    distributed.wait(done)
    seconds = time.perf_counter() - t0
    peaks = client.run(_peak)
    err = None if want is None else float(np.max(np.abs(done.compute() - want)))
    del done, futures, q, k, v, out
    return {"seconds": seconds, "err": err, "share": share,
            "peak": {a: peaks[a] - base[a] for a in addrs}}


def _rounds(env, rounds: int, status) -> dict:
    """The rounds, alternating the in-memory call and each layout's dask run."""
    import fastattn
    qn, kn, vn = _local_inputs(env["shape"], WORKERS)
    results = {lab: {"mem": [], "runs": []} for lab, _, _ in LAYOUTS}
    for r in range(rounds):
        for label, qsplit, ksplit in LAYOUTS:
            status(f"dask round {r + 1}/{rounds}: in-memory")
            t0 = time.perf_counter()
            want = fastattn.attention(qn, kn, vn, num_threads=WORKERS)
            results[label]["mem"].append(time.perf_counter() - t0)
            status(f"dask round {r + 1}/{rounds}: {label}")
            run = _run_layout(env, (qsplit, ksplit, ksplit),
                              want if r == rounds - 1 else None)
            results[label]["runs"].append(run)
    return results


def _bound(share: int) -> float:
    return BOUND_SHARE * share + BOUND_MIB * MIB


def _rows(results: dict, addrs: list) -> tuple[list, list]:
    """(a timing row per layout, a memory row per layout and worker); a
    worker's peak is the highest of the rounds."""
    timing, memory = [], []
    for label, _, _ in LAYOUTS:
        res = results[label]
        dask_s = [run["seconds"] for run in res["runs"]]
        timing.append({"label": label, "mem_s": statistics.median(res["mem"]),
                       "dask_s": statistics.median(dask_s),
                       "ratio": statistics.median(m / d for m, d in zip(res["mem"], dask_s)),
                       "err": res["runs"][-1]["err"]})
        for n, a in enumerate(addrs, 1):
            share = max(run["share"][a] for run in res["runs"])
            peak = max(run["peak"][a] for run in res["runs"])
            memory.append({"label": label, "worker": n, "share": share, "peak": peak,
                           "bound": _bound(share), "ok": peak <= _bound(share)})
    return timing, memory


def _tables(timing: list, memory: list) -> list[str]:
    out = ["| layout | in-memory 2 threads | dask 2 workers x 1 thread | speed vs in-memory "
           "| max abs difference |", "|---|---|---|---|---|"]
    out += [f"| {r['label']} | {r['mem_s']:.2f} s | {r['dask_s']:.2f} s | {r['ratio']:.2f}x "
            f"| {r['err']:.1e} |" for r in timing]
    out += ["", "| layout | worker | share of the inputs (MiB) | peak over idle (MiB) "
            f"| bound {BOUND_SHARE} x share + {BOUND_MIB} MiB | within |",
            "|---|---|---|---|---|---|"]
    out += [f"| {r['label']} | {r['worker']} | {r['share'] / MIB:.0f} | {r['peak'] / MIB:.0f} "
            f"| {r['bound'] / MIB:.0f} | {'yes' if r['ok'] else 'NO'} |" for r in memory]
    return out


def _text(shape, rounds: int, resettable: bool, timing: list, memory: list) -> str:
    B, H, L, D = shape
    return "\n".join([
        "## Dask (fastattn.dask on a LocalCluster)", "",
        f"({B}, {H}, {L}, {D}) float32, non-causal; {WORKERS} worker processes x 1 thread "
        f"against the in-memory call on {WORKERS} threads, {rounds} alternating rounds, "
        "medians; speed = median of the per-round ratios (in-memory time / dask time, >= 0.8 "
        "is the target). Each worker makes and holds the chunks of half of the heads of Q, K, "
        "V (its share); peak over idle = its VmHWM during the call less its RSS when idle "
        f"(its share and its part of the result included), the highest of the rounds, "
        f"against the bound {BOUND_SHARE} x its share + {BOUND_MIB} MiB"
        + ("" if resettable else " (VmHWM could not be reset: peaks since start)")
        + ". On a shared machine the times are noisy.",
        "", *_tables(timing, memory), ""])


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
    note = progress.note if progress is not None else (lambda s: None)
    status = progress.status if progress is not None else (lambda s: None)
    shape, rounds = (QUICK_SHAPE if quick else SHAPE), repeats or ROUNDS
    cluster = distributed.LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit=0,
                                       silence_logs=logging.ERROR)
    client = distributed.Client(cluster)
    try:
        addrs = sorted(client.scheduler_info()["workers"])
        resettable = all(client.run(_warm).values())
        env = {"client": client, "distributed": distributed, "da": da, "dask": dask,
               "fdask": fdask, "addrs": addrs, "shape": shape}
        timing, memory = _rows(_rounds(env, rounds, status), addrs)
    finally:
        client.close()
        cluster.close()
    for r in timing:
        note(f"dask {r['label']}: ratio {r['ratio']:.2f}, max |dask - in-memory| "
             f"{r['err']:.2e}")
    for r in memory:
        note(f"dask {r['label']}, worker {r['worker']}: peak {r['peak'] / MIB:.0f} MiB, "
             f"bound {r['bound'] / MIB:.0f} MiB ({'within' if r['ok'] else 'OVER'})")
    return _text(shape, rounds, resettable, timing, memory)
