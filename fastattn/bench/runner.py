"""The measurements of one benchmark run, in order: the matmul peaks, the FMA
peaks, every case at every thread count in the same interleaved rounds, the
matmul peaks once more, and the fractions of the peaks."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from .cases import Case, Profile, arith_dtype
from .machine import ThreadLimit, measure_fma_peak, measure_peak, measure_read_bandwidth
from .peers import Tools, build_impls, check_outputs
from .progress import Progress
from .report import cache_bytes, fmt_time, make_rows
from .timing import SETTLE_S, run_interleaved


@dataclass
class Bench:
    """What the measurements of one run share."""
    fa: object                  # the fastattn package
    core: object                # fastattn._core (the FMA probe)
    tools: Tools
    profile: Profile
    threads: list
    peers: tuple                # the peers this run times
    repeats: int | None
    numpy_max_bytes: int
    progress: Progress
    limits: dict = dataclasses.field(init=False)   # t -> ThreadLimit
    read_bw: list = dataclasses.field(default_factory=list)  # measure_read_bandwidth's

    def __post_init__(self):
        self.limits = {t: ThreadLimit(t, self.tools.threadpoolctl, self.tools.torch)
                       for t in self.threads}


def peak_dtypes(cases: list[Case]) -> list[str]:
    """The dtypes whose peaks are measured: float32, and the arithmetic dtypes
    of the cases (float32 for the 16-bit ones)."""
    dtypes = ["float32"] + [arith_dtype(c.dtype) for c in cases if c.kind == "attention"]
    return list(dict.fromkeys(dtypes)) if cases else []


def _matmul_peaks(b: Bench, dtypes: list[str], again: bool = False):
    """Yield (dtype, t, record) of a matmul peak per dtype and thread count,
    each measured under its thread limit."""
    for t in b.threads:
        with b.limits[t]:
            for dt in dtypes:
                b.progress.status(f"matmul peak {dt} {t}t" + (" (again)" if again else ""))
                yield dt, t, measure_peak(dt, b.profile.peak_n, b.profile.peak_repeats)


def measure_peaks(b: Bench, dtypes: list[str]) -> dict:
    """The matmul peak of each dtype at each thread count -> (dtype, t) -> record."""
    peaks = {}
    for dt, t, pk in _matmul_peaks(b, dtypes):
        pk["threads"] = t
        peaks[(dt, t)] = pk
        b.progress.note(f"matmul peak {dt}, {t} thread(s): {pk['gflops']:.1f} GFLOP/s")
    return peaks


def remeasure_peaks(b: Bench, dtypes: list[str], peaks: dict) -> None:
    """Measure the matmul peaks once more and keep the best in ``peaks``."""
    for dt, t, pk in _matmul_peaks(b, dtypes, again=True):
        old = peaks[(dt, t)]
        old["times_s"] = old["times_s"] + pk["times_s"]
        if pk["gflops"] > old["gflops"]:
            old.update(seconds=pk["seconds"], gflops=pk["gflops"])
            b.progress.note(f"matmul peak {dt}, {t} thread(s), again: "
                            f"{pk['gflops']:.1f} GFLOP/s (kept)")


def measure_fma(b: Bench, dtypes: list[str]) -> list[dict]:
    """The FMA peak of each dtype, all thread counts in the same rounds."""
    fma = []
    for dt in dtypes:
        b.progress.status(f"FMA peak {dt}")
        fma += measure_fma_peak(b.core, dt, b.threads, b.profile, b.limits,
                                b.profile.peak_repeats, b.progress)
        b.progress.note(f"FMA peak {dt}: " + ", ".join(
            f"{r['threads']} thread(s) {r['gflops']:.1f} GFLOP/s"
            for r in fma if r["dtype"] == dt))
    return fma


def _machine_probe(b: Bench, case: Case, probe_steps: dict):
    """t -> the FMA probe on t threads, timed as "machine@t" in the rounds of
    ``case`` (the cores' own scaling at that time: on a shared VM two threads
    sometimes get one core's worth), or None."""
    steps = probe_steps.get(arith_dtype(case.dtype))
    if steps and 1 in b.threads and len(b.threads) > 1:
        return (lambda t, dt=arith_dtype(case.dtype), n=steps:
                lambda: b.core.fma_probe(dt, n, t))
    return None


def _step_line(label: str, t: int, new: list[dict]) -> str:
    """The progress line of a case at t threads."""
    parts = []
    for n in ("fastattn", "fastattn_inplace", "fastattn_int8cache", "torch", "numpy"):
        r0 = new[0]["impls"].get(n)
        if r0:
            parts.append(f"{n} {fmt_time(r0['median_s'])}")
    if new[0]["gflops"]:
        parts.append(f"{new[0]['gflops']:.1f} GFLOP/s")
    if new[0].get("output_ok") is False:
        parts.append("MISMATCH")
    return f"{label} {t}t: " + ", ".join(parts)


def time_case(b: Bench, case: Case, peaks: dict, probe_steps: dict) -> list[dict]:
    """Time ``case`` at every thread count in the same rounds (each sample under
    its own thread limit) -> its result rows."""
    label = f"{case.label} {case.dtype}{' causal' if case.causal else ''}"
    impls, thread_of, skipped, variants = build_impls(
        case, b.threads, b.fa, b.tools, b.peers, b.numpy_max_bytes,
        _machine_probe(b, case, probe_steps))
    profile_all = dataclasses.replace(b.profile, budget_s=b.profile.budget_s * len(b.threads))
    res_all = run_interleaved(impls, profile_all, b.repeats, b.progress, label,
                              settle_s=SETTLE_S if max(b.threads) > 1 else 0.0,
                              context=lambda name: b.limits[thread_of[name]],
                              spinning={n for n in impls if thread_of[n] > 1})
    rows = []
    for t in b.threads:
        res = {n.rsplit("@", 1)[0]: r for n, r in res_all.items() if thread_of[n] == t}
        check = check_outputs(case, res) if case.kind == "attention" else None
        new = make_rows(case, t, res, skipped, variants, peaks, check)
        if case.section == "decode":
            _add_read_rate(case, t, new, b.read_bw)
        rows.extend(new)
        b.progress.step(_step_line(label, t, new))
    return rows


def _add_read_rate(case: Case, t: int, rows: list[dict], read_bw: list[dict]) -> None:
    """A decoding row's GB/s of K and V (the cache) read, beside the
    machine's measured read bandwidth at t threads."""
    bw = next((r["gbps"] for r in read_bw if r["threads"] == t), None)
    for r in rows:
        r["kv_gbps"] = cache_bytes(case, r["variant"]) / r["fastattn_s"] / 1e9
        r["read_bw_gbps"] = bw
        r["notes"].append(f"K+V read {r['kv_gbps']:.1f} GB/s"
                          + (f" (machine {bw:.1f} GB/s)" if bw else ""))


def update_fractions(rows: list[dict], peaks: dict, fma: list[dict]) -> None:
    """The fractions of the peaks, from the final peaks (they may have moved)."""
    fma_by = {(f["dtype"], f["threads"]): f["gflops"] for f in fma}
    for r in rows:
        if r["gflops"]:
            adt = arith_dtype(r["dtype"])
            r["peak_gflops"] = peaks[(adt, r["threads"])]["gflops"]
            r["frac_peak"] = r["gflops"] / r["peak_gflops"]
            r["frac_peak_f32"] = r["gflops"] / peaks[("float32", r["threads"])]["gflops"]
            r["frac_fma_peak"] = r["gflops"] / fma_by[(adt, r["threads"])]


def run_cases(b: Bench, cases: list[Case]) -> tuple[dict, list[dict], list[dict]]:
    """Peaks, then every case, then the peaks again -> (peaks, fma, rows).

    Every case is timed at all thread counts in the same interleaved rounds,
    so that the thread scaling compares samples taken moments apart, not
    minutes apart on a machine whose speed drifts."""
    torch = b.tools.torch
    dtypes = peak_dtypes(cases)
    rows = []
    with torch.inference_mode() if torch is not None else contextlib.nullcontext():
        peaks = measure_peaks(b, dtypes)
        fma = measure_fma(b, dtypes)
        if any(c.section == "decode" for c in cases):
            b.progress.status("read bandwidth")
            b.read_bw = measure_read_bandwidth(b.core, b.threads, b.limits,
                                               b.profile.peak_repeats)
            b.progress.note("read bandwidth: " + ", ".join(
                f"{r['threads']} thread(s) {r['gbps']:.1f} GB/s" for r in b.read_bw))
        # FMA probe steps per thread for ~round_probe_s on one thread
        probe_steps = {f["dtype"]: max(1, int(f["n"] * b.profile.round_probe_s
                                              / b.profile.probe_s))
                       for f in fma if f["threads"] == 1}
        for case in cases:
            rows += time_case(b, case, peaks, probe_steps)
        remeasure_peaks(b, dtypes, peaks)    # once more at the end: keep the best
    update_fractions(rows, peaks, fma)
    return peaks, fma, rows
