"""Peak memory: the extra peak RSS (``VmHWM``) of one attention call, each
measured in a fresh subprocess, for fastattn at every thread count and for
each available peer."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from . import procmem
from .progress import Progress

# Run as ``python -c _MEM_SCRIPT impl H L S D dtype t use_threadpoolctl``.
_MEM_SCRIPT = r"""
import json, sys
impl, H, L, S, D, dtype, t = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], int(sys.argv[7])
use_tpc = sys.argv[8] == "1"        # threadpoolctl: looked for once, by the parent
import numpy as np

rng = np.random.default_rng(0)
q = rng.standard_normal((1, H, L, D), dtype=dtype)
k = rng.standard_normal((1, H, S, D), dtype=dtype)
v = rng.standard_normal((1, H, S, D), dtype=dtype)
small = [a[..., :16, :].copy() for a in (q, k, v)]
if impl == "fastattn":
    import fastattn
    run = lambda a, b, c: fastattn.attention(a, b, c, num_threads=t)
elif impl == "torch":
    import torch
    torch.set_num_threads(t)
    F = torch.nn.functional
    def run(a, b, c):
        with torch.inference_mode():
            return F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (a, b, c)))
else:
    import scipy.special
    if use_tpc:
        import threadpoolctl
        threadpoolctl.threadpool_limits(t)
    scale = np.dtype(dtype).type(1.0 / np.sqrt(D))
    def run(a, b, c):
        s = a @ b.swapaxes(-1, -2)
        s *= scale
        return scipy.special.softmax(s, axis=-1) @ c
run(*small)                         # load libraries, start thread pools
del small
reset = reset_peak()
before = status()
out = run(q, k, v)
after = status()
if reset or after["VmHWM"] > before["VmHWM"]:
    extra = after["VmHWM"] - before["VmRSS"]
    exact = True
else:                               # peak not reached: only an upper bound
    extra = before["VmHWM"] - before["VmRSS"]
    exact = False
print(json.dumps({"extra_peak_bytes": extra, "exact": exact, "hwm_reset": reset,
                  "rss_before": before["VmRSS"], "hwm_after": after["VmHWM"],
                  "output_bytes": int(np.asarray(out).nbytes)}))
"""


def measure_memory(impl: str, H: int, L: int, S: int, D: int, dtype: str, t: int,
                   timeout: float = 300.0, threadpoolctl: bool = True) -> dict:
    """Extra peak RSS of one call of ``impl`` (one of the available peers, or
    fastattn) in a fresh subprocess; ``threadpoolctl``: whether the numpy peer
    limits its BLAS pool with it there."""
    rec = {"impl": impl, "threads": t, "shape": {"B": 1, "H": H, "L": L, "S": S, "D": D},
           "dtype": dtype,
           "scores_bytes": H * L * S * np.dtype(dtype).itemsize}
    cmd = [sys.executable, "-c", procmem.source() + _MEM_SCRIPT, impl, str(H), str(L), str(S), str(D),
           dtype, str(t), "1" if threadpoolctl else "0"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        rec["error"] = f"timed out after {timeout:.0f} s"
        return rec
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        rec["error"] = f"exit {p.returncode}: {tail[0][:200]}"
        return rec
    try:
        rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        rec["error"] = "could not parse the subprocess output"
    return rec


def memory_jobs(sections, threads: list, peers) -> list[tuple[str, int]]:
    """-> the (implementation, thread count) pairs the memory section measures."""
    if "memory" not in sections:
        return []
    return [("fastattn", t) for t in threads] + [(p, max(threads)) for p in peers]


def run_memory(jobs: list, shape: tuple, dtype: str, progress: Progress,
               threadpoolctl: bool) -> list[dict]:
    """Measure each of ``jobs`` at ``shape`` = (H, L, S, D) -> their records."""
    H, L, S, D = shape
    mem = []
    for imp, t in jobs:
        progress.status(f"memory {imp} L=S={L} {t}t (subprocess)")
        rec = measure_memory(imp, H, L, S, D, dtype, t, threadpoolctl=threadpoolctl)
        mem.append(rec)
        progress.step(f"memory {imp} 1x{H}x{L}x{S}x{D} {t}t: " +
                      (rec["error"] if "error" in rec else
                       f"{rec['extra_peak_bytes'] / 2 ** 20:.1f} MiB extra peak RSS"))
    return mem
