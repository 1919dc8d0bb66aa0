"""A serving decode step on a shared machine: one ``attention_paged`` call
for the whole batch against fastattn's per-sequence loop, quiet and while
other processes keep cores busy.

    python bench/serving_under_load.py [--dtype bfloat16] [--block 16]
                                       [--threads 2] [--rounds 5] [--calls 20]
                                       [--busy 1] [--json FILE]

The batch is the serving section's decoding step (``fastattn.bench.
serving_section.FULL``: 64 sequences, contexts log-uniform in 128..8192,
Hq 32, Hkv 8, D 128, HND pools); the loop is that section's "fastattn loop"
(one grouped ``attention`` call per sequence on contiguous caches, each its
own parallel region).  Two phases, quiet and then with ``--busy`` processes
spinning (``python -c "while True: pass"``, started by this script and
killed at its end): in each, ``--rounds`` rounds alternate the two ways,
``--calls`` calls each, every call timed on its own.  Printed per phase and
way: the median, 90th percentile, mean and maximum call, and the loop's
median and mean over the batch call's.  The fastattn imported is the one on
``sys.path`` (its path is printed).
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np

import fastattn
from fastattn.bench.machine import ThreadLimit
from fastattn.bench.serving_section import (FULL, Caches, Env, context_lengths,
                                            decode_impls, paged_batch)


def _phase(impls, rounds, calls):
    """-> name -> every call's seconds, the ways alternating round by round."""
    times = {n: [] for n in impls}
    for r in range(rounds):
        order = list(impls) if r % 2 == 0 else list(impls)[::-1]
        for name in order:
            for _ in range(calls):
                t0 = time.perf_counter()
                impls[name]()
                times[name].append(time.perf_counter() - t0)
    return times


def _summary(ts):
    ms = np.array(ts) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "mean_ms": float(ms.mean()), "max_ms": float(ms.max()), "calls": len(ms)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--busy", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    t = a.threads
    print(f"fastattn {fastattn.__file__} isa {fastattn.get_isa()}; {a.dtype} block {a.block}, "
          f"{t} threads, {a.busy} busy process(es) in the second phase", flush=True)
    cfg = FULL
    batch = paged_batch(cfg, context_lengths(cfg), a.block)
    env = Env(fastattn, None, None, [t], {t: ThreadLimit(t, None, None)})
    caches = Caches(cfg, fastattn, batch, a.dtype, dense=True)
    impls, _ = decode_impls(env, caches)     # no torch: no padded batch
    impls = {"attention_paged": impls[f"fastattn@{t}"], "loop": impls[f"fastattn loop@{t}"]}
    for fn in impls.values():
        fn()
    result = {"dtype": a.dtype, "block": a.block, "threads": t, "busy": a.busy, "phases": {}}
    for phase, busy in (("quiet", 0), ("busy", a.busy)):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(busy)]
        try:
            time.sleep(0.5 if busy else 0.0)
            times = _phase(impls, a.rounds, a.calls)
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        rec = {n: _summary(ts) for n, ts in times.items()}
        for stat in ("median_ms", "mean_ms"):
            rec[f"loop_over_paged_{stat[:-3]}"] = (rec["loop"][stat]
                                                   / rec["attention_paged"][stat])
        result["phases"][phase] = rec
        for n in impls:
            s = rec[n]
            print(f"{phase:>5} {n:>15}: median {s['median_ms']:8.2f} ms  p90 "
                  f"{s['p90_ms']:8.2f}  mean {s['mean_ms']:8.2f}  max {s['max_ms']:8.2f}",
                  flush=True)
        print(f"{phase:>5} loop / attention_paged: median {rec['loop_over_paged_median']:.2f}x,"
              f" mean {rec['loop_over_paged_mean']:.2f}x", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
