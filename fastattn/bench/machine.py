"""The machine a benchmark runs on: CPU model, flags and usable CPUs, the
load on it, the thread pools and their limits, the run's metadata, and its
two ceilings, the matmul peak (``np.matmul``) and the FMA peak (fastattn's
register-only FMA probe)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import time

import numpy as np

from .cases import Profile
from .peers import Tools
from .progress import Progress
from .timing import SETTLE_S, _no_gc, paired_ratio, run_interleaved

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def cpu_model() -> str:
    """The CPU's model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
    """The SIMD flags of the CPU that matter here."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    keep = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw",
                            "avx512vl", "avx512_bf16", "amx_tile", "asimd", "sve")
                    return [x for x in keep if x in flags]
    except OSError:
        pass
    return []


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_seconds():
    """(busy CPU seconds of the whole machine, CPU seconds of this process and
    its waited-for children), or None where /proc/stat is unavailable."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    vals += [0] * (8 - len(vals))
    busy = (sum(vals) - vals[3] - vals[4]) / hz      # minus idle and iowait
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return busy, own


def _loadavg():
    """The 1-minute load average, or None."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None



def _isa_info(fa) -> dict:
    """The ISA fastattn uses and those it could use."""
    info = {}
    try:
        info["isa"] = fa.get_isa()
        if info["isa"] == "avx512" and fa._core.avx512_emulated():
            info["isa"] = "avx512 (EMULATED by SIMDe: a test build, timings meaningless)"
    except Exception as e:  # noqa: BLE001 - report, don't die
        info["isa"] = f"unknown ({type(e).__name__}: {e})"
    try:
        info["available_isas"] = list(fa.available_isas())
    except Exception:  # noqa: BLE001
        info["available_isas"] = None
    return info


def _threadpools(tpc) -> list[dict] | None:
    """The BLAS/OpenMP thread pools threadpoolctl sees."""
    try:
        return [{k: info.get(k) for k in ("user_api", "internal_api", "prefix",
                                          "version", "num_threads",
                                          "threading_layer", "architecture")}
                for info in tpc.threadpool_info()]
    except Exception:  # noqa: BLE001
        return None


def collect_meta(fa, tools: Tools, args) -> dict:
    """The run's metadata: date, machine, versions, environment, options."""
    torch, tpc = tools.torch, tools.threadpoolctl
    meta = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": getattr(tools.scipy, "__version__", None),
        "torch": getattr(torch, "__version__", None) if torch else None,
        "threadpoolctl": getattr(tpc, "__version__", None) if tpc else None,
        "fastattn": getattr(fa, "__version__", None),
        "env": {k: os.environ[k] for k in OPENBLAS_VARS + ("OMP_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS",
                                                           "MKL_NUM_THREADS")
                if k in os.environ},
        "loadavg_1min_at_start": _loadavg(),
        "argv": list(args.argv),
        "suite": args.suite_name,
        "sections": list(args.sections),
        "threads": list(args.threads_parsed),
        "dtype": args.dtype,
        "causal": args.causal,
        "repeats": args.repeats,
        "peers": list(args.peers_parsed),
        "unavailable": {name: {"kind": kind, "reason": why, "effect": effect}
                        for name, (kind, why, effect) in tools.missing.items()},
    }
    meta.update(_isa_info(fa))
    if tpc is not None:
        meta["threadpools"] = _threadpools(tpc)
    return meta


class ThreadLimit:
    """Limit every thread pool in the process (BLAS, OpenMP, torch) to t."""

    def __init__(self, t: int, tpc, torch):
        self.t, self.tpc, self.torch = t, tpc, torch
        self._stack = contextlib.ExitStack()
        self._torch_prev = None

    def __enter__(self):
        if self.tpc is not None:
            self._stack.enter_context(self.tpc.threadpool_limits(limits=self.t))
        if self.torch is not None:
            self._torch_prev = self.torch.get_num_threads()
            self.torch.set_num_threads(self.t)
        return self

    def __exit__(self, *exc):
        if self.torch is not None and self._torch_prev is not None:
            self.torch.set_num_threads(self._torch_prev)
        self._stack.close()
        return False


def measure_peak(dtype: str, n: int, repeats: int) -> dict:
    """Best-of-``repeats`` GFLOP/s of an n x n @ n x n matmul (thread limit
    set by the caller)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.empty((n, n), dtype=dtype)
    np.matmul(a, b, out=c)
    ts = []
    with _no_gc():
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            ts.append(time.perf_counter() - t0)
    best = min(ts)
    return {"dtype": dtype, "n": n, "seconds": best, "times_s": ts,
            "gflops": 2.0 * n ** 3 / best / 1e9}


def measure_fma_peak(core, dtype: str, threads: list, profile: Profile, limits: dict,
                     repeats: int, progress: Progress | None = None) -> list[dict]:
    """GFLOP/s of fastattn's register-only FMA probe (the kernels of the ISA in
    use: no memory traffic, the machine's FMA peak) at each thread count, the
    thread counts timed in the same interleaved rounds; each record also gives
    the speed-up over 1 thread (median of the per-round ratios, per flop)."""
    n = 1 << 14
    while True:                                  # calibrate: a call of ~probe_s
        t0 = time.perf_counter()
        core.fma_probe(dtype, n, 1)
        dt = time.perf_counter() - t0
        if dt >= profile.probe_s / 8 or n >= 1 << 40:
            break
        n *= 4
    n = max(1, int(n * profile.probe_s / max(dt, 1e-9)))
    impls = {f"fma@{t}": (lambda t=t: core.fma_probe(dtype, n, t)) for t in threads}
    res = run_interleaved(impls, profile, repeats, progress, f"FMA peak {dtype}",
                          settle_s=SETTLE_S if max(threads) > 1 else 0.0,
                          context=lambda name: limits[int(name.split("@")[1])],
                          spinning={f"fma@{t}" for t in threads if t > 1})
    out = []
    for t in threads:
        r = res[f"fma@{t}"]
        flops = r["output"]                      # the team's flops (fma_probe's result)
        rec = {"dtype": dtype, "threads": t, "n": n, "flops": flops, "times_s": r["times_s"],
               "gflops": flops / r["min_s"] / 1e9,
               "median_gflops": flops / r["median_s"] / 1e9}
        if 1 in threads and t != 1:
            one = res["fma@1"]
            rec["speedup_vs_1"] = (paired_ratio(one["times_s"], r["times_s"])
                                   * flops / one["output"])
        out.append(rec)
    return out


def measure_read_bandwidth(core, threads: list, limits: dict, repeats: int,
                           nbytes: int = 512 * 2**20) -> list[dict]:
    """GB/s of reading memory (the decode section's bound: a decoding step
    reads its KV cache once) at each thread count: fastattn's read probe
    over an nbytes array (far beyond the caches), split among the threads,
    best of ``repeats``."""
    a = np.ones(nbytes // 8, dtype=np.uint64)
    out = []
    for t in threads:
        with limits[t]:
            core.read_probe(a, t)                     # warm: pages, threads
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                core.read_probe(a, t)
                ts.append(time.perf_counter() - t0)
        out.append({"threads": t, "bytes": a.nbytes, "times_s": ts,
                    "gbps": a.nbytes / min(ts) / 1e9})
    return out
