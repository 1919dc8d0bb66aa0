"""Benchmark harness behind ``python -m fastattn bench`` (and ``bench/run.py``).

Times :func:`fastattn.attention` (and :func:`fastattn.softmax`) against
``torch.nn.functional.scaled_dot_product_attention`` (when torch is
installed) and the plain NumPy/SciPy composition, in one process:

* every implementation is warmed up first, then timed once per *round*, in an
  order that rotates from round to round (interleaved), and the median over
  the rounds is reported; rounds are added while the samples are spread (a
  disturbed spell of a shared machine); calls much shorter than a
  millisecond are timed as a loop of many calls per sample;
* every implementation runs under the same thread limit: ``num_threads=t``
  for fastattn, ``torch.set_num_threads(t)`` for torch and
  ``threadpoolctl.threadpool_limits(t)`` (BLAS *and* OpenMP) around all of
  them, set before each sample (outside the timed loop);
* a case's thread counts are timed in the same rounds (``fastattn@1``,
  ``torch@1``, ``fastattn@2``, ...), and the ratios (vs a peer, thread
  scaling) are medians of the per-round ratios, so that a slow spell of a
  shared machine does not land on one side of a ratio only;
* GFLOP/s counts ``4*B*H*L*S*D`` floating point operations per attention
  call (half of that for a causal square mask), and each fastattn figure is
  also given as a fraction of the float matmul peak (``np.matmul`` of two
  large square matrices, same dtype, same thread limit) measured in the
  same run; the machine's FMA peak (fastattn's register-only FMA probe) and
  its thread scaling are measured too, on their own and, as ``machine@t``,
  in the rounds of every case (the cores' scaling while that case ran).

The harness never touches ``OPENBLAS_*`` environment variables; see
``bench/README.md`` for how to run it so that NumPy's BLAS is not slowed.
The progress display goes to stderr, the result tables (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["main", "build_parser"]

PEERS = ("torch", "numpy")
SECTIONS = ("attention", "decode", "overhead", "float64", "softmax", "memory")
SUITES = {
    # name: sections it runs
    "default": SECTIONS,
    "quick": SECTIONS,
    "targets": SECTIONS,
    "all": SECTIONS,
}
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# --------------------------------------------------------------------------
# Suite definitions
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """Timing budgets of a suite."""
    budget_s: float        # aim for this much timed work per measurement
    min_repeats: int
    max_repeats: int
    min_sample_s: float    # a sample lasts at least this long (loops of calls)
    slow_budget_s: float   # at most this much for one very slow implementation
    peak_n: int            # size of the square matmul for the FLOP peak
    peak_repeats: int
    probe_s: float         # one call of the FMA peak probe lasts about this long
    round_probe_s: float   # the FMA probe timed in every round of a case (1 thread)
    attention: tuple       # (B, H, L, S, D) shapes
    decode: tuple
    overhead: tuple
    float64: tuple
    softmax: tuple         # (M, N) shapes
    memory: tuple          # (H, L, S, D)


DEFAULT = Profile(
    budget_s=1.5, min_repeats=7, max_repeats=11, min_sample_s=0.02, slow_budget_s=3.5,
    peak_n=2048, peak_repeats=5, probe_s=0.05, round_probe_s=0.02,
    attention=((1, 8, 1024, 1024, 64), (1, 8, 2048, 2048, 64),
               (1, 4, 4096, 4096, 64), (1, 8, 1024, 1024, 128),
               (4, 16, 256, 256, 64)),
    decode=((1, 32, 1, 4096, 128),),
    overhead=((1, 1, 3, 3, 2),),
    float64=((1, 8, 1024, 1024, 64),),
    softmax=((2048, 4096),),
    memory=(1, 8192, 8192, 64),
)

QUICK = Profile(
    budget_s=0.1, min_repeats=3, max_repeats=4, min_sample_s=0.005, slow_budget_s=0.5,
    peak_n=1024, peak_repeats=3, probe_s=0.01, round_probe_s=0.005,
    attention=((1, 4, 256, 256, 64), (2, 2, 128, 128, 32)),
    decode=((1, 8, 1, 1024, 64),),
    overhead=((1, 1, 3, 3, 2),),
    float64=((1, 4, 256, 256, 64),),
    softmax=((256, 1024),),
    memory=(1, 1024, 1024, 64),
)


@dataclass
class Case:
    section: str
    kind: str               # "attention" | "softmax"
    shape: tuple            # (B, H, L, S, D) or (M, N)
    dtype: str
    causal: bool = False

    @property
    def label(self) -> str:
        if self.kind == "softmax":
            return "softmax %dx%d" % self.shape
        B, H, L, S, D = self.shape
        s = f"{B}x{H}x{L}x{D}" if L == S else f"{B}x{H}x{L}x{S}x{D}"
        return f"{self.section} {s}" if self.section != "attention" else s

    def flops(self) -> float:
        if self.kind != "attention":
            return float("nan")
        B, H, L, S, D = self.shape
        return 4.0 * B * H * L * S * D * causal_fraction(L, S, self.causal)


def causal_fraction(L: int, S: int, causal: bool) -> float:
    """Fraction of the L x S score matrix a (top-left) causal mask keeps."""
    if not causal:
        return 1.0
    if L == S:
        return 0.5          # the usual convention for square causal attention
    visible = sum(min(i + 1, S) for i in range(L))
    return visible / float(L * S)


def parse_shapes(text: str) -> list[tuple]:
    """``"B,H,L,D;B,H,L,S,D"`` -> list of (B, H, L, S, D)."""
    shapes = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        try:
            dims = tuple(int(x) for x in part.replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"bad shape {part!r}: expected integers B,H,L,D or B,H,L,S,D")
        if len(dims) == 4:
            B, H, L, D = dims
            dims = (B, H, L, L, D)
        if len(dims) != 5:
            raise ValueError(f"bad shape {part!r}: expected B,H,L,D or B,H,L,S,D")
        if min(dims) < 1:
            raise ValueError(f"bad shape {part!r}: all sizes must be >= 1")
        shapes.append(dims)
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"bad {what} {text!r}: expected comma-separated integers")
    if not vals or min(vals) < 1:
        raise ValueError(f"bad {what} {text!r}: expected integers >= 1")
    return list(dict.fromkeys(vals))


def build_cases(args, profile: Profile, sections) -> list[Case]:
    dt = args.dtype
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    cases = []
    if "attention" in sections:
        shapes = args.shapes_parsed if args.shapes_parsed else profile.attention
        for shp in shapes:
            for c in causals:
                cases.append(Case("attention", "attention", shp, dt, c))
    if "decode" in sections:
        for shp in profile.decode:
            cases.append(Case("decode", "attention", shp, dt, False))
    if "overhead" in sections:
        for shp in profile.overhead:
            cases.append(Case("overhead", "attention", shp, dt, False))
    if "float64" in sections:
        for shp in profile.float64:
            cases.append(Case("float64", "attention", shp, "float64", False))
    if "softmax" in sections:
        for shp in profile.softmax:
            cases.append(Case("softmax", "softmax", shp, dt, False))
    return cases


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------

@dataclass
class Tools:
    """The optional peers and tools of one run, each looked for once.

    Attributes
    ----------
    torch, threadpoolctl, matplotlib, scipy : module or None
        The module, or None where it is not used in this run (not installed,
        broken, or not asked for).
    missing : dict
        name -> ``(kind, reason, effect)`` for each one that is absent, e.g.
        ``("peer", "not installed", "its columns are left out")``; the
        report's header gives one line per entry.
    """
    torch: object = None
    threadpoolctl: object = None
    matplotlib: object = None
    scipy: object = None
    missing: dict = dataclasses.field(default_factory=dict)


def _try_import(name: str, *submodules: str):
    """-> (module or None, why it is absent or None)."""
    import importlib
    try:
        mod = importlib.import_module(name)
        for sub in submodules:
            importlib.import_module(f"{name}.{sub}")
        return mod, None
    except ImportError as e:
        if getattr(e, "name", None) == name:
            return None, "not installed"
        return None, f"could not be imported ({type(e).__name__}: {e})"
    except Exception as e:  # noqa: BLE001 - a broken install: report, don't die
        return None, f"could not be imported ({type(e).__name__}: {e})"


def discover_tools(peers) -> Tools:
    """Look for each optional peer and tool once (``peers``: the requested
    peers; torch is only imported when asked for)."""
    tools = Tools()
    if "torch" in peers:
        tools.torch, why = _try_import("torch", "nn.functional")
        if why:
            tools.missing["torch"] = ("peer", why, "its columns are left out")
    tools.scipy, why = _try_import("scipy", "special")
    if why and "numpy" in peers:
        tools.missing["scipy"] = ("peer", why, "the numpy peer (the NumPy/SciPy "
                                  "composition) is left out")
    tools.threadpoolctl, why = _try_import("threadpoolctl")
    if why:
        tools.missing["threadpoolctl"] = ("tool", why, "BLAS/OpenMP thread pools are NOT "
                                          "limited (pip install 'fastattn[bench]')")
    tools.matplotlib, why = _try_import("matplotlib")
    if why:
        tools.missing["matplotlib"] = ("tool", why, "--plot is unavailable "
                                       "(pip install 'fastattn[plot]')")
    return tools


def available_peers(peers, tools: Tools) -> tuple:
    """The requested ``peers`` this run can time."""
    need = {"torch": tools.torch, "numpy": tools.scipy}
    return tuple(p for p in peers if need[p] is not None)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
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
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_seconds():
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
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def collect_meta(fa, tools: Tools, args) -> dict:
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
    try:
        meta["isa"] = fa.get_isa()
        if meta["isa"] == "avx512" and fa._core.avx512_emulated():
            meta["isa"] = "avx512 (EMULATED by SIMDe: a test build, timings meaningless)"
    except Exception as e:  # noqa: BLE001 - report, don't die
        meta["isa"] = f"unknown ({type(e).__name__}: {e})"
    try:
        meta["available_isas"] = list(fa.available_isas())
    except Exception:  # noqa: BLE001
        meta["available_isas"] = None
    if tpc is not None:
        try:
            meta["threadpools"] = [
                {k: info.get(k) for k in ("user_api", "internal_api", "prefix",
                                          "version", "num_threads",
                                          "threading_layer", "architecture")}
                for info in tpc.threadpool_info()]
        except Exception:  # noqa: BLE001
            meta["threadpools"] = None
    return meta


# --------------------------------------------------------------------------
# Progress display (stderr)
# --------------------------------------------------------------------------

class Progress:
    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self._width = 0

    def _elapsed(self) -> str:
        e = time.perf_counter() - self.t0
        return f"{int(e // 60):d}:{e % 60:04.1f}"

    def status(self, text: str) -> None:
        """Transient status line (only on a terminal)."""
        if not self.tty:
            return
        line = f"[{min(self.done + 1, self.total)}/{self.total} {self._elapsed()}] {text}"
        cols = 120
        line = line[:cols]
        pad = max(0, self._width - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._width = len(line)

    def step(self, text: str) -> None:
        """A finished measurement: one permanent line."""
        self.done += 1
        if not self.enabled:
            return
        line = f"[{self.done}/{self.total} {self._elapsed()}] {text}"
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad + "\n")
            self._width = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


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


def _time_loop(fn, loops: int) -> float:
    t0 = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t0) / loops


@contextlib.contextmanager
def _no_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# After a multi-threaded call, a thread pool keeps its workers spinning for a
# while (OpenBLAS about 2**28 cycles, ~0.1 s; libgomp a few ms): on a small
# machine they would steal the cores of whichever implementation is timed next.
# Between two different implementations the harness waits this long.
SETTLE_S = 0.15
# ... and then runs the implementation about to be timed, untimed, for
# REWARM_S (at least one call): after the pause its own workers sleep, and a
# virtual machine's idle CPU wakes slowly (measured here: after a 0.15 s pause
# the first one or two 2-thread calls of ~0.1 ms took 1-5 ms each, and the
# next ~20 calls were up to 2x slower than later ones), which the first calls
# of a sample would pay: a bias against more threads.  Calls slower than
# REWARM_MAX_S get no untimed call (a wake-up is < 2% of them).
REWARM_S = 0.01
REWARM_MAX_S = 0.25
# Rounds are added (up to Profile.max_repeats) while some implementation's
# samples have an interquartile range above this fraction of their median.
NOISY_SPREAD = 0.10


def _rewarm(fn, est_s: float) -> None:
    if est_s >= REWARM_MAX_S:
        return
    t_end = time.perf_counter() + REWARM_S
    fn()
    while time.perf_counter() < t_end:
        fn()


def run_interleaved(impls: dict, profile: Profile, repeats: int | None,
                    progress: Progress | None = None, label: str = "",
                    settle_s: float = 0.0, context=None, spinning=None) -> dict:
    """Warm up, calibrate and time ``impls`` (name -> zero-arg callable).

    ``settle_s``: in a multi-threaded run, pause before a sample that follows
    another implementation's (let its pools go idle) -- only after those in
    ``spinning`` (the multi-threaded ones; None: all) -- and make untimed
    calls before every sample (see REWARM_S).
    ``context``: name -> a context manager entered around that
    implementation's warm-up and each of its samples, outside the timed loop
    (the thread limit, when one run mixes thread counts).

    Returns name -> {"median_s", "min_s", "times_s", "loops", "output"};
    ``times_s[r]`` is the sample of round r, so two implementations' samples
    with the same index were taken moments apart.
    """
    names = list(impls)
    ctx = context or (lambda name: contextlib.nullcontext())
    est, outputs = {}, {}
    for name in names:
        if progress:
            progress.status(f"{label}: warm-up {name}")
        fn = impls[name]
        with ctx(name):
            t0 = time.perf_counter()
            outputs[name] = fn()                 # first call: lazy init, page faults
            t = time.perf_counter() - t0
            if t < 1.5:                          # cheap enough: a clean second call
                t = _time_loop(fn, 1)
            if t < 1e-3:                         # tiny: estimate from a short loop
                n = max(1, int(0.02 / max(t, 1e-7)))
                t = _time_loop(fn, n)
        est[name] = t
    loops = {n: max(1, math.ceil(profile.min_sample_s / max(est[n], 1e-9)))
             for n in names}
    # Very slow implementations (typically the NumPy composition on big
    # shapes) get fewer samples: as many as fit in slow_budget_s, at least 1.
    cap = {}
    if repeats is None:
        for n in names:
            if est[n] * loops[n] > profile.slow_budget_s / profile.min_repeats:
                cap[n] = max(1, int(profile.slow_budget_s / (est[n] * loops[n])))
    round_s = sum(loops[n] * est[n] for n in names if n not in cap)
    if repeats is None:
        reps = int(profile.budget_s / max(round_s, 1e-9))
        reps = max(profile.min_repeats, min(profile.max_repeats, reps))
    else:
        reps = repeats
    times = {n: [] for n in names}
    prev = names[-1]                             # the last one warmed up
    # Adaptive: rounds beyond the planned ones (up to max_repeats) while the
    # samples of some implementation are spread (a disturbed spell of a
    # shared machine): the medians then rest on more undisturbed rounds.
    limit = reps if repeats is not None else max(reps, profile.max_repeats)
    with _no_gc():
        r = 0
        while r < reps or (r < limit and _spread(times, cap) > NOISY_SPREAD):
            if progress:
                progress.status(f"{label}: round {r + 1}/{reps if r < reps else limit}")
            k = r % len(names)
            for name in names[k:] + names[:k]:
                if name not in cap or len(times[name]) < cap[name]:
                    if settle_s and prev != name and (spinning is None or prev in spinning):
                        time.sleep(settle_s)
                    prev = name
                    with ctx(name):
                        if settle_s:
                            _rewarm(impls[name], est[name])
                        times[name].append(_time_loop(impls[name], loops[name]))
            r += 1
    return {n: {"median_s": statistics.median(times[n]), "min_s": min(times[n]),
                "times_s": times[n], "loops": loops[n], "output": outputs[n]}
            for n in names}


def _spread(times: dict, cap: dict) -> float:
    """The largest relative interquartile range, (q3 - q1) / median, of the
    samples of the implementations timed every round (0 before 3 rounds)."""
    worst = 0.0
    for n, ts in times.items():
        if n in cap or len(ts) < 3:
            continue
        q1, q2, q3 = statistics.quantiles(ts, n=4)
        worst = max(worst, (q3 - q1) / q2)
    return worst


def paired_ratio(num: list, den: list) -> float:
    """Median over rounds of num[r] / den[r]: the ratio of two
    implementations timed in the same rounds, each round's pair taken moments
    apart, so a slow spell of the machine cancels out of it."""
    n = min(len(num), len(den))
    return statistics.median(a / b for a, b in zip(num[:n], den[:n]))


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


# --------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------

NUMPY_MAX_BYTES_DEFAULT = 2 * 1024 ** 3


def numpy_composition(softmax, q, k, v, scale, mask):
    """The plain NumPy/SciPy composition (the 'numpy' peer); ``softmax`` is
    ``scipy.special.softmax``."""
    s = q @ k.swapaxes(-1, -2)
    s *= scale
    if mask is not None:
        s += mask
    p = softmax(s, axis=-1)
    return p @ v


def numpy_peak_bytes(case: Case) -> int:
    """Rough peak of the NumPy composition: the score matrix, its softmax
    and SciPy's temporaries (about three L x S matrices per head)."""
    B, H, L, S, D = case.shape
    return 3 * B * H * L * S * np.dtype(case.dtype).itemsize


def make_inputs(case: Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(case.dtype)
    if case.kind == "softmax":
        return (rng.standard_normal(case.shape) * 4).astype(dt)
    B, H, L, S, D = case.shape
    q = rng.standard_normal((B, H, L, D)).astype(dt)
    k = rng.standard_normal((B, H, S, D)).astype(dt)
    v = rng.standard_normal((B, H, S, D)).astype(dt)
    return q, k, v


def build_impls(case: Case, threads: list, fa, tools: Tools, peers, numpy_max_bytes,
                machine=None):
    """-> (impls: "name@t" -> callable, thread_of: "name@t" -> t,
    skipped: name -> reason, variants).  ``peers``: those this run can time
    (see :func:`available_peers`), from the modules in ``tools``.
    ``machine``: None, or t -> a callable (the FMA probe on t threads), timed
    as "machine@t".

    The inputs are made once for all thread counts; fastattn.attention takes
    its count as ``num_threads``, the others from the thread limit around each
    sample.
    Order: fastattn and torch side by side at each thread count (the pairs of
    the `vs torch` ratios, then of the thread speed-ups, are neighbours in
    every round), the numpy peer last (its calls at L = 4096 take seconds and
    allocate GiBs)."""
    fast, peer_fns, skipped = {}, {}, {}
    torch = tools.torch
    sp_softmax = tools.scipy.special.softmax if "numpy" in peers else None
    if case.kind == "softmax":
        x = make_inputs(case)
        x_inplace = x.copy()
        # (softmax takes its thread count from the OpenMP limit around the sample)
        soft = lambda: fa.softmax(x, axis=-1)  # noqa: E731
        soft_inplace = lambda: fa.softmax(x_inplace, axis=-1, out=x_inplace)  # noqa: E731
        fast["fastattn"] = lambda t: soft
        fast["fastattn_inplace"] = lambda t: soft_inplace
        variants = ("fastattn", "fastattn_inplace")
        if "torch" in peers:
            tx = torch.from_numpy(x)
            peer_fns["torch"] = lambda: torch.softmax(tx, dim=-1)
        if "numpy" in peers:
            peer_fns["numpy"] = lambda: sp_softmax(x, axis=-1)
    else:
        q, k, v = make_inputs(case)
        causal = case.causal
        D = case.shape[-1]
        fast["fastattn"] = lambda t: (
            lambda: fa.attention(q, k, v, is_causal=causal, num_threads=t))
        variants = ("fastattn",)
        if "torch" in peers:
            F = torch.nn.functional
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            peer_fns["torch"] = lambda: F.scaled_dot_product_attention(tq, tk, tv,
                                                                       is_causal=causal)
        if "numpy" in peers:
            need = numpy_peak_bytes(case)
            if need > numpy_max_bytes:
                skipped["numpy"] = (f"skipped: would need ~{need / 2 ** 30:.1f} GiB "
                                    f"(> {numpy_max_bytes / 2 ** 30:.1f} GiB)")
            else:
                dt = np.dtype(case.dtype)
                scale = dt.type(1.0 / math.sqrt(D))
                mask = None
                if causal:
                    L, S = case.shape[2], case.shape[3]
                    mask = np.triu(np.full((L, S), -np.inf, dtype=dt), k=1)
                peer_fns["numpy"] = lambda: numpy_composition(sp_softmax, q, k, v, scale, mask)
    impls, thread_of = {}, {}
    for t in threads:
        for name, make in fast.items():
            impls[f"{name}@{t}"], thread_of[f"{name}@{t}"] = make(t), t
        if "torch" in peer_fns:
            impls[f"torch@{t}"], thread_of[f"torch@{t}"] = peer_fns["torch"], t
        if machine is not None:
            impls[f"machine@{t}"], thread_of[f"machine@{t}"] = machine(t), t
    if "numpy" in peer_fns:
        for t in threads:
            impls[f"numpy@{t}"], thread_of[f"numpy@{t}"] = peer_fns["numpy"], t
    return impls, thread_of, skipped, variants


def check_outputs(case: Case, res: dict) -> tuple[float | None, str | None, bool]:
    """Compare fastattn's output to a peer's -> (max_abs_diff, against, ok)."""
    ref_name = next((p for p in ("torch", "numpy") if p in res), None)
    if ref_name is None:
        return None, None, True
    ref = res[ref_name]["output"]
    if hasattr(ref, "numpy"):
        ref = ref.numpy()
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(res["fastattn"]["output"], dtype=np.float64)
    if got.shape != ref.shape:
        return None, ref_name, False
    with np.errstate(all="ignore"):
        diff = float(np.max(np.abs(got - ref))) if got.size else 0.0
    if case.dtype == "float64":
        ok = np.allclose(got, ref, rtol=1e-7, atol=1e-9)
    else:
        ok = np.allclose(got, ref, rtol=2e-3, atol=2e-4)
    return diff, ref_name, bool(ok)


# --------------------------------------------------------------------------
# Peak memory (fresh subprocess per measurement)
# --------------------------------------------------------------------------

_MEM_SCRIPT = r"""
import json, sys
impl, H, L, S, D, dtype, t = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], int(sys.argv[7])
use_tpc = sys.argv[8] == "1"        # threadpoolctl: looked for once, by the parent
import numpy as np

def status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                d[k] = int(v.split()[0]) * 1024
    return d

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
import gc
gc.collect()
try:                                # hand freed heap pages back to the OS, so that
    import ctypes                   # reusing them during the call counts as growth
    ctypes.CDLL(None).malloc_trim(0)
except (OSError, AttributeError):
    pass
reset = True
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                # reset VmHWM to the current RSS
except OSError:
    reset = False
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
    cmd = [sys.executable, "-c", _MEM_SCRIPT, impl, str(H), str(L), str(S), str(D),
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


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _ratio(a, b):
    if a is None or b is None or not (a > 0) or not math.isfinite(b):
        return None
    return b / a


def make_rows(case: Case, t: int, res: dict, skipped: dict, variants, peaks: dict,
              check) -> list[dict]:
    rows = []
    flops = case.flops()
    peak = peaks.get((case.dtype, t))
    for var in variants:
        if var not in res:
            continue
        fa_s = res[var]["median_s"]
        gflops = flops / fa_s / 1e9 if math.isfinite(flops) else None
        row = {
            "section": case.section,
            "case": case.label + (" out=x" if var.endswith("_inplace") else ""),
            "kind": case.kind,
            "variant": var,
            "shape": (dict(zip("BHLSD", case.shape)) if case.kind == "attention"
                      else dict(zip("MN", case.shape))),
            "dtype": case.dtype,
            "causal": case.causal,
            "threads": t,
            "flops": flops if math.isfinite(flops) else None,
            "fastattn_s": fa_s,
            "gflops": gflops,
            "peak_gflops": peak["gflops"] if peak else None,
            "frac_peak": (gflops / peak["gflops"]) if (gflops and peak) else None,
            "frac_peak_f32": (gflops / peaks[("float32", t)]["gflops"])
            if (gflops and ("float32", t) in peaks) else None,
            "impls": {n: {kk: vv for kk, vv in r.items() if kk != "output"}
                      for n, r in res.items()},
            "speedup": {},
            "skipped": dict(skipped),
            "notes": [],
        }
        for n in ("torch", "numpy"):
            if n in res:
                row["impls"][n]["gflops"] = (flops / res[n]["median_s"] / 1e9
                                             if math.isfinite(flops) else None)
                # the median over rounds of the peer's time / fastattn's time in
                # the same round (paired: a slow spell hits both), and the
                # ratio of the two medians, for reference
                row["speedup"][n] = paired_ratio(res[n]["times_s"], res[var]["times_s"])
                row.setdefault("speedup_of_medians", {})[n] = _ratio(fa_s, res[n]["median_s"])
        if check is not None:
            diff, against, ok = check
            row["max_abs_diff"] = diff
            row["checked_against"] = against
            row["output_ok"] = ok
            if not ok:
                row["notes"].append(f"MISMATCH vs {against} (max|Δ|="
                                    + ("shape" if diff is None else f"{diff:.2g}") + ")")
        for n, why in skipped.items():
            row["notes"].append(f"{n}: {why}")
        for n in ("torch", "numpy"):
            if n in res and len(res[n]["times_s"]) < 3:
                k = len(res[n]["times_s"])
                row["notes"].append(f"{n}: slow, {k} sample{'s' if k > 1 else ''}")
        if case.kind == "softmax":
            nbytes = 2 * int(np.prod(case.shape)) * np.dtype(case.dtype).itemsize
            row["notes"].append(f"{nbytes / fa_s / 1e9:.1f} GB/s")
        rows.append(row)
    return rows


def _cell_speed(row, peer):
    if peer in row["skipped"]:
        return "skip" if row["skipped"][peer].startswith("skipped") else "n/a"
    x = row["speedup"].get(peer)
    return "—" if x is None else f"{x:.2f}×"


def format_table(rows: list[dict], peers) -> str:
    hdr = ["case", "dtype", "causal", "thr", "fastattn", "GFLOP/s", "% peak"]
    for p in peers:
        hdr += [p, f"vs {p}"]
    hdr.append("notes")
    lines = ["| " + " | ".join(hdr) + " |",
             "|" + "|".join("---" if i < 3 else "--:" for i in range(len(hdr) - 1))
             + "|---|"]
    for r in rows:
        cells = [r["case"], r["dtype"], "yes" if r["causal"] else "no", str(r["threads"]),
                 fmt_time(r["fastattn_s"]),
                 "—" if r["gflops"] is None else f"{r['gflops']:.1f}",
                 "—" if r["frac_peak"] is None else f"{100 * r['frac_peak']:.0f}%"]
        for p in peers:
            imp = r["impls"].get(p)
            cells.append(fmt_time(imp["median_s"]) if imp else
                         ("skip" if p in r["skipped"] else "—"))
            cells.append(_cell_speed(r, p))
        cells.append("; ".join(r["notes"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scaling_rows(rows: list[dict]) -> list[dict]:
    """fastattn's (and the peers') speed-up at t threads over 1 thread: the
    median over rounds of the paired ratio (both thread counts are timed in
    the same interleaved rounds)."""
    by = {}
    for r in rows:
        by.setdefault((r["case"], r["dtype"], r["causal"]), {})[r["threads"]] = r
    out = []
    for (case, dtype, causal), per_t in by.items():
        if 1 not in per_t or len(per_t) < 2:
            continue
        base = per_t[1]
        for t, r in sorted(per_t.items()):
            if t == 1:
                continue
            v = r["variant"]            # fastattn, or fastattn_inplace (softmax out=x)
            rec = {"case": case, "dtype": dtype, "causal": causal, "threads": t,
                   "fastattn": paired_ratio(base["impls"][v]["times_s"],
                                            r["impls"][v]["times_s"])}
            for p in ("torch", "numpy", "machine"):
                if p in base["impls"] and p in r["impls"]:
                    rec[p] = paired_ratio(base["impls"][p]["times_s"],
                                          r["impls"][p]["times_s"])
            if "machine" in rec:        # the probe does t times the work at t threads
                rec["machine"] *= t
            out.append(rec)
    return out


def format_scaling(recs: list[dict], peers) -> str:
    cols = list(peers) + (["machine"] if any("machine" in r for r in recs) else [])
    hdr = ["case", "dtype", "causal", "thr", "fastattn speed-up vs 1 thread"]
    hdr += [f"{p} speed-up vs 1 thread" if p != "machine" else
            "machine: FMA probe speed-up, same rounds" for p in cols]
    lines = ["| " + " | ".join(hdr) + " |",
             "|---|---|---|--:|" + "|".join("--:" for _ in hdr[4:]) + "|"]
    for r in recs:
        cells = [r["case"], r["dtype"], "yes" if r["causal"] else "no", str(r["threads"]),
                 f"{r['fastattn']:.2f}×"]
        cells += [f"{r[p]:.2f}×" if p in r else "—" for p in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_memory(recs: list[dict]) -> str:
    lines = ["| impl | shape (B,H,L,S,D) | dtype | thr | extra peak RSS | "
             "one L·S score matrix | notes |",
             "|---|---|---|--:|--:|--:|---|"]
    for r in recs:
        s = r["shape"]
        shape = f"{s['B']},{s['H']},{s['L']},{s['S']},{s['D']}"
        notes = []
        if "error" in r:
            extra = "—"
            notes.append(r["error"])
        else:
            extra = f"{r['extra_peak_bytes'] / 2 ** 20:.1f} MiB"
            if not r.get("exact", True):
                extra = "≤ " + extra
            notes.append(f"incl. {r['output_bytes'] / 2 ** 20:.1f} MiB output")
        lines.append(f"| {r['impl']} | {shape} | {r['dtype']} | {r['threads']} | {extra} | "
                     f"{r['scores_bytes'] / 2 ** 20:.0f} MiB | {'; '.join(notes)} |")
    return "\n".join(lines)


def format_header(meta: dict, peaks: list[dict], fma: list[dict] = ()) -> str:
    lines = [
        "# fastattn benchmark",
        "",
        f"- date: {meta['date']}",
        f"- cpu: {meta['cpu_model']} ({meta['usable_cpus']} usable of "
        f"{meta['logical_cpus']} logical CPUs; flags: {' '.join(meta['cpu_flags']) or '?'})",
        f"- fastattn {meta['fastattn']}: ISA in use **{meta['isa']}**"
        + (f" (available: {', '.join(meta['available_isas'])})"
           if meta.get("available_isas") else ""),
        f"- python {meta['python']}, numpy {meta['numpy']}, scipy {meta['scipy']}, "
        f"torch {meta['torch'] or 'not installed'}, "
        f"threadpoolctl {meta['threadpoolctl'] or 'not installed'}",
        f"- threads: {', '.join(map(str, meta['threads']))}; suite: {meta['suite']} "
        f"({', '.join(meta['sections'])})",
    ]
    for name, u in (meta.get("unavailable") or {}).items():
        lines.append(f"- {u['kind']}: {name} {u['reason']}: {u['effect']}")
    for tp in meta.get("threadpools") or []:
        lines.append(f"- thread pool: {tp.get('user_api')}/{tp.get('internal_api')} "
                     f"{tp.get('version') or ''} {tp.get('architecture') or ''} "
                     f"({tp.get('prefix')}, default {tp.get('num_threads')} threads)")
    if meta["env"]:
        lines.append("- environment: " + ", ".join(f"{k}={v}" for k, v in meta["env"].items()))
    if any(k in meta["env"] for k in OPENBLAS_VARS):
        lines.append("- **warning**: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE is set, which can "
                     "slow NumPy's BLAS (the numpy peer and the matmul peak); see "
                     "bench/README.md")
    bg = meta.get("background_cpus")
    if bg is not None:
        busy = bg >= 0.2
        lines.append(f"- {'**warning**: ' if busy else ''}other processes used "
                     f"~{bg:.2f} CPU on average during the run"
                     + (" (timings, above all multi-threaded ones, are disturbed)"
                        if busy else ""))
    for p in peaks:
        lines.append(f"- matmul peak {p['dtype']} {p['threads']} thread(s): "
                     f"{p['gflops']:.1f} GFLOP/s (np.matmul {p['n']}²)")
    for f in fma:
        lines.append(f"- FMA peak {f['dtype']} {f['threads']} thread(s): "
                     f"{f['gflops']:.1f} GFLOP/s (fastattn's register-only FMA probe, "
                     f"{meta['isa']} kernels"
                     + (f"; {f['speedup_vs_1']:.2f}× 1 thread" if "speedup_vs_1" in f else "")
                     + ")")
    return "\n".join(lines)


def write_plot(path: str, rows: list[dict], peaks: list[dict], peers) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["kind"] == "attention" and r["gflops"] is not None
            and r["section"] != "overhead"]
    cases = list(dict.fromkeys((r["case"], r["dtype"], r["causal"]) for r in rows))
    threads = sorted({r["threads"] for r in rows})
    impls = ["fastattn"] + [p for p in peers if any(p in r["impls"] for r in rows)]
    series = [(imp, t) for imp in impls for t in threads]
    colors = {"fastattn": "tab:blue", "torch": "tab:orange", "numpy": "tab:green"}
    idx = {(r["case"], r["dtype"], r["causal"], r["threads"]): r for r in rows}

    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cases) + 2), 4.8))
    for si, (imp, t) in enumerate(series):
        ys = []
        for c in cases:
            r = idx.get(c + (t,))
            if r is None:
                ys.append(0.0)
            elif imp == "fastattn":
                ys.append(r["gflops"])
            else:
                g = r["impls"].get(imp, {}).get("gflops")
                ys.append(g or 0.0)
        xs = [i - 0.4 + width * (si + 0.5) for i in range(len(cases))]
        alpha = 0.45 + 0.55 * (threads.index(t) + 1) / len(threads)
        ax.bar(xs, ys, width, label=f"{imp} {t}t", color=colors.get(imp, "gray"),
               alpha=alpha, hatch="" if threads.index(t) == 0 else "//",
               edgecolor="black", linewidth=0.3)
    for p in peaks:
        if p["dtype"] == "float32" and p["threads"] in threads:
            ax.axhline(p["gflops"], linestyle="--", linewidth=0.8, color="gray")
            ax.text(len(cases) - 0.5, p["gflops"], f" f32 matmul peak {p['threads']}t",
                    va="bottom", ha="right", fontsize=7, color="gray")
    labels = [f"{c}\n{d}{' causal' if k else ''}" for c, d, k in cases]
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("GFLOP/s (4·B·H·L·S·D, causal halved)")
    ax.set_title("fastattn attention throughput by shape and thread count")
    ax.legend(fontsize=7, ncol=max(1, len(threads)))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

EPILOG = textwrap.dedent("""\
    sections of a suite: attention (the shape grid; --shapes replaces it),
    decode (1 query against a 4096-key cache), overhead (the 3-token call),
    float64, softmax (fastattn.softmax, also in place, vs SciPy and torch),
    memory (extra peak RSS of one call in a fresh subprocess).
    --suite also takes a comma-separated list of sections, e.g.
    --suite attention,memory.  When benchmarking the numpy peer, run with
    OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, e.g.
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m fastattn bench
    """)


def build_parser(prog: str = "python -m fastattn bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Time fastattn.attention against torch SDPA and the NumPy/SciPy "
                    "composition (interleaved, medians, equal thread limits).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default=None, metavar="NAME",
                   help="default (all targets, ~5.5 min on 2 cores), quick (~35 s "
                        "smoke run), targets/all (= default), or a comma-separated "
                        "list of sections: " + ", ".join(SECTIONS))
    p.add_argument("--quick", action="store_true",
                   help="quick smoke run: small shapes, few repeats (= --suite quick)")
    p.add_argument("--shapes", metavar="'B,H,L,D;B,H,L,S,D'",
                   help="attention shapes, ';'-separated (S defaults to L); runs only "
                        "the attention section unless --suite is given")
    p.add_argument("--threads", default="1,2", metavar="T1,T2",
                   help="thread counts (default: 1,2)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="dtype of the attention/decode/softmax cases (default float32)")
    p.add_argument("--causal", default="both", choices=("no", "yes", "both"),
                   help="causal variants of the attention shapes (default both)")
    p.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="interleaved rounds per measurement (default: adaptive, "
                        "3..11, fewer for big shapes, more while samples spread)")
    p.add_argument("--peers", default="torch,numpy", metavar="LIST",
                   help="peers to time: comma-separated from torch,numpy, or 'none' "
                        "(default torch,numpy)")
    p.add_argument("--numpy-max-gib", type=float, default=2.0, metavar="GIB",
                   help="skip the numpy peer where it would need more memory (default 2)")
    p.add_argument("--isa", default=None, metavar="NAME",
                   help="call fastattn.set_isa(NAME) first")
    p.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="bar chart of GFLOP/s per shape and thread count (needs matplotlib)")
    p.add_argument("--list", action="store_true",
                   help="list the measurements that would run, then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    return p


def _resolve(args, parser) -> Profile:
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not (args.numpy_max_gib > 0):
        parser.error("--numpy-max-gib must be > 0")
    try:
        args.threads_parsed = parse_int_list(args.threads, "--threads")
    except ValueError as e:
        parser.error(str(e))
    try:
        args.shapes_parsed = parse_shapes(args.shapes) if args.shapes is not None else None
    except ValueError as e:
        parser.error(f"--shapes: {e}")
    peers = [x for x in args.peers.replace(" ", "").split(",") if x]
    if peers == ["none"]:
        peers = []
    bad = [x for x in peers if x not in PEERS]
    if bad:
        parser.error(f"--peers: unknown peer(s) {', '.join(bad)} (choose from torch, numpy, none)")
    args.peers_parsed = tuple(x for x in PEERS if x in peers)

    suite = args.suite
    profile = QUICK if (args.quick or suite == "quick") else DEFAULT
    if suite is None:
        if args.shapes_parsed:
            sections = ("attention",)
            name = "custom"
        else:
            sections = SECTIONS
            name = "quick" if args.quick else "default"
    elif suite in SUITES:
        sections, name = SUITES[suite], suite
    else:
        sections = tuple(x for x in suite.replace(" ", "").split(",") if x)
        bad = [x for x in sections if x not in SECTIONS]
        if bad or not sections:
            parser.error(f"--suite: unknown suite or section(s) {', '.join(bad) or suite!r} "
                         f"(suites: {', '.join(SUITES)}; sections: {', '.join(SECTIONS)})")
        name = suite
    if args.quick and name != "quick":
        name += " (quick)"
    args.sections = tuple(x for x in SECTIONS if x in sections)
    args.suite_name = name
    return profile


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    profile = _resolve(args, parser)
    tools = discover_tools(args.peers_parsed)
    args.peers_parsed = available_peers(args.peers_parsed, tools)

    if args.plot and tools.matplotlib is None:
        parser.error("--plot needs matplotlib, which is "
                     + tools.missing["matplotlib"][1]
                     + " (pip install 'fastattn[plot]' or pip install matplotlib)")

    cases = build_cases(args, profile, args.sections)
    threads = args.threads_parsed
    mem_jobs = []
    if "memory" in args.sections:
        H, L, S, D = profile.memory
        for t in threads:
            mem_jobs.append(("fastattn", t))
        for p in args.peers_parsed:
            mem_jobs.append((p, max(threads)))

    if args.list:
        for t in threads:
            for c in cases:
                print(f"{c.label:<28} {c.dtype:<8} causal={'yes' if c.causal else 'no':<3} "
                      f"threads={t}")
        for imp, t in mem_jobs:
            H, L, S, D = profile.memory
            print(f"memory {imp} 1x{H}x{L}x{S}x{D} threads={t}")
        return 0

    import fastattn as fa
    import fastattn._core as fa_core
    if args.isa:
        try:
            fa.set_isa(args.isa)
        except Exception as e:  # noqa: BLE001
            parser.error(f"--isa {args.isa}: {e}")

    torch, tpc = tools.torch, tools.threadpoolctl
    progress = Progress(len(cases) * len(threads) + len(mem_jobs),
                        enabled=not args.no_progress)
    for name, (kind, why, effect) in tools.missing.items():
        if name != "matplotlib":
            progress.note(f"note: {name} {why}: {effect}")
    if any(k in os.environ for k in OPENBLAS_VARS):
        progress.note("note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE is set and may slow the "
                      "numpy peer; see bench/README.md")

    meta = collect_meta(fa, tools, args)
    la = meta["loadavg_1min_at_start"]
    if la is not None and la >= 0.5:
        progress.note(f"warning: the machine is busy (1-min load average {la:.2f}); "
                      "timings will be noisy")
    if max(threads) > usable_cpus():
        progress.note(f"warning: --threads {max(threads)} exceeds the {usable_cpus()} "
                      "usable CPUs; threads will share cores")
    cpu0 = _cpu_seconds()
    numpy_max_bytes = int(args.numpy_max_gib * 2 ** 30)
    t_start = time.perf_counter()
    peaks, rows, fma = {}, [], []
    torch_ctx = torch.inference_mode() if torch is not None else contextlib.nullcontext()
    # Every case is timed at all thread counts in the same interleaved rounds
    # (each sample under its own thread limit), so the thread scaling compares
    # samples taken moments apart, not minutes apart on a machine whose speed
    # drifts.
    peak_dtypes = ["float32"] + [c.dtype for c in cases if c.kind == "attention"]
    peak_dtypes = list(dict.fromkeys(peak_dtypes)) if cases else []
    limits = {t: ThreadLimit(t, tpc, torch) for t in threads}
    profile_all = dataclasses.replace(profile, budget_s=profile.budget_s * len(threads))
    with torch_ctx:
        for t in threads:
            with limits[t]:
                for dt in peak_dtypes:
                    progress.status(f"matmul peak {dt} {t}t")
                    pk = measure_peak(dt, profile.peak_n, profile.peak_repeats)
                    pk["threads"] = t
                    peaks[(dt, t)] = pk
                    progress.note(f"matmul peak {dt}, {t} thread(s): {pk['gflops']:.1f} GFLOP/s")
        for dt in peak_dtypes:
            progress.status(f"FMA peak {dt}")
            fma += measure_fma_peak(fa_core, dt, threads, profile, limits,
                                    profile.peak_repeats, progress)
            progress.note(f"FMA peak {dt}: " + ", ".join(
                f"{r['threads']} thread(s) {r['gflops']:.1f} GFLOP/s"
                for r in fma if r["dtype"] == dt))
        # FMA probe steps per thread for ~round_probe_s on one thread
        probe_steps = {f["dtype"]: max(1, int(f["n"] * profile.round_probe_s / profile.probe_s))
                       for f in fma if f["threads"] == 1}
        for case in cases:
            label = f"{case.label} {case.dtype}{' causal' if case.causal else ''}"
            # The machine's own thread scaling in the same rounds: the
            # register-only FMA probe at each thread count, so that a case's
            # speed-up can be read against what the cores gave at that time
            # (on a shared VM two threads sometimes get one core's worth).
            steps = probe_steps.get(case.dtype)
            machine = None
            if steps and 1 in threads and len(threads) > 1:
                machine = (lambda t, dt=case.dtype, n=steps:
                           lambda: fa_core.fma_probe(dt, n, t))
            impls, thread_of, skipped, variants = build_impls(
                case, threads, fa, tools, args.peers_parsed, numpy_max_bytes, machine)
            res_all = run_interleaved(impls, profile_all, args.repeats, progress, label,
                                      settle_s=SETTLE_S if max(threads) > 1 else 0.0,
                                      context=lambda name: limits[thread_of[name]],
                                      spinning={n for n in impls if thread_of[n] > 1})
            for t in threads:
                res = {n.rsplit("@", 1)[0]: r for n, r in res_all.items() if thread_of[n] == t}
                check = check_outputs(case, res) if case.kind == "attention" else None
                new = make_rows(case, t, res, skipped, variants, peaks, check)
                rows.extend(new)
                parts = []
                for n in ("fastattn", "fastattn_inplace", "torch", "numpy"):
                    r0 = new[0]["impls"].get(n)
                    if r0:
                        parts.append(f"{n} {fmt_time(r0['median_s'])}")
                if new[0]["gflops"]:
                    parts.append(f"{new[0]['gflops']:.1f} GFLOP/s")
                if new[0].get("output_ok") is False:
                    parts.append("MISMATCH")
                progress.step(f"{label} {t}t: " + ", ".join(parts))
            del impls, res_all, res
        for t in threads:
            with limits[t]:
                for dt in peak_dtypes:       # once more at the end: keep the best
                    progress.status(f"matmul peak {dt} {t}t (again)")
                    pk = measure_peak(dt, profile.peak_n, profile.peak_repeats)
                    old = peaks[(dt, t)]
                    old["times_s"] = old["times_s"] + pk["times_s"]
                    if pk["gflops"] > old["gflops"]:
                        old.update(seconds=pk["seconds"], gflops=pk["gflops"])
                        progress.note(f"matmul peak {dt}, {t} thread(s), again: "
                                      f"{pk['gflops']:.1f} GFLOP/s (kept)")
    fma_by = {(f["dtype"], f["threads"]): f["gflops"] for f in fma}
    for r in rows:                           # the peaks may have moved: recompute
        if r["gflops"]:
            r["peak_gflops"] = peaks[(r["dtype"], r["threads"])]["gflops"]
            r["frac_peak"] = r["gflops"] / r["peak_gflops"]
            r["frac_peak_f32"] = r["gflops"] / peaks[("float32", r["threads"])]["gflops"]
            r["frac_fma_peak"] = r["gflops"] / fma_by[(r["dtype"], r["threads"])]
    mem = []
    if mem_jobs:
        H, L, S, D = profile.memory
        dt = args.dtype
        for imp, t in mem_jobs:
            progress.status(f"memory {imp} L=S={L} {t}t (subprocess)")
            rec = measure_memory(imp, H, L, S, D, dt, t, threadpoolctl=tpc is not None)
            mem.append(rec)
            progress.step(f"memory {imp} 1x{H}x{L}x{S}x{D} {t}t: " +
                          (rec["error"] if "error" in rec else
                           f"{rec['extra_peak_bytes'] / 2 ** 20:.1f} MiB extra peak RSS"))
    elapsed = time.perf_counter() - t_start
    meta["elapsed_s"] = round(elapsed, 2)
    cpu1 = _cpu_seconds()
    if cpu0 is not None and cpu1 is not None and elapsed > 0:
        bg = ((cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1])) / elapsed
        meta["background_cpus"] = round(max(0.0, bg), 3)
    else:
        meta["background_cpus"] = None

    # Order rows by section, case, then thread count.
    order = {s: i for i, s in enumerate(SECTIONS)}
    case_order = {}
    for r in rows:
        case_order.setdefault((r["section"], r["case"], r["dtype"], r["causal"]), len(case_order))
    rows.sort(key=lambda r: (order.get(r["section"], 99),
                             case_order[(r["section"], r["case"], r["dtype"], r["causal"])],
                             r["threads"]))
    peak_list = sorted(peaks.values(), key=lambda p: (p["dtype"], p["threads"]))
    scaling = scaling_rows(rows)

    out = [format_header(meta, peak_list, fma), ""]
    if rows:
        out += ["## Timings (median of interleaved rounds)", "",
                format_table(rows, args.peers_parsed), "",
                "fastattn/peer columns: median time per call; `vs X` = median over the "
                "rounds of X's time / fastattn's time in the same round (> 1: fastattn is "
                "faster); % peak = fastattn GFLOP/s over the same-dtype np.matmul peak at "
                "the same thread count.", ""]
    if scaling:
        out += ["## Thread scaling", "", format_scaling(scaling, args.peers_parsed), ""]
        ceil = [f for f in fma if "speedup_vs_1" in f]
        if ceil:
            out += ["The machine's own ceiling, the register-only FMA probe (no memory "
                    "traffic): " + ", ".join(f"{f['dtype']} {f['speedup_vs_1']:.2f}× at "
                                             f"{f['threads']} threads" for f in ceil)
                    + " (median of the per-round ratios) when measured on its own; the "
                    "`machine` column times the same probe in every round of each case, "
                    "so a low speed-up there is the machine's at that time (on a shared VM "
                    "two threads sometimes get one core's worth), not the code's.", ""]
    if mem:
        out += ["## Peak memory (one call, fresh subprocess, VmHWM)", "",
                format_memory(mem), ""]
    out.append(f"total benchmark time: {elapsed:.1f} s")
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()

    if args.json:
        doc = {"schema": "fastattn-bench/1", "meta": meta, "peaks": peak_list,
               "fma_peaks": fma,
               "results": rows, "scaling": scaling, "memory": mem}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=_json_default)
            f.write("\n")
        progress.note(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, rows, peak_list, args.peers_parsed)
        progress.note(f"wrote {args.plot}")
    return 0


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
