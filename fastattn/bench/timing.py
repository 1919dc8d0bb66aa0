"""Timing: implementations warmed up, then timed in interleaved rounds (the
order rotating from round to round, rounds added while the samples spread),
with the medians and the paired (same-round) ratios of the samples."""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from dataclasses import dataclass

from .cases import Profile
from .progress import Progress


def _time_loop(fn, loops: int) -> float:
    """Seconds per call of ``loops`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t0) / loops


@contextlib.contextmanager
def _no_gc():
    """Garbage collection off (after a collection) within the block."""
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
    """Untimed calls of ``fn`` for REWARM_S (see above)."""
    if est_s >= REWARM_MAX_S:
        return
    t_end = time.perf_counter() + REWARM_S
    fn()
    while time.perf_counter() < t_end:
        fn()


@dataclass
class _Plan:
    """How the rounds of one :func:`run_interleaved` go."""
    loops: dict       # name -> calls per sample
    cap: dict         # name -> at most this many samples (very slow ones)
    reps: int         # rounds planned
    limit: int        # rounds at most (added while the samples spread)


def _warm_up(impls: dict, ctx, progress, label: str) -> tuple[dict, dict]:
    """Call each implementation (in its context) until its time per call is
    known -> (name -> estimated seconds per call, name -> first output)."""
    est, outputs = {}, {}
    for name, fn in impls.items():
        if progress:
            progress.status(f"{label}: warm-up {name}")
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
    return est, outputs


def _plan(est: dict, profile: Profile, repeats: int | None) -> _Plan:
    """Loop counts, sample caps and the number of rounds from the estimates."""
    names = list(est)
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
    # Adaptive: rounds beyond the planned ones (up to max_repeats) while the
    # samples of some implementation are spread (a disturbed spell of a
    # shared machine): the medians then rest on more undisturbed rounds.
    limit = reps if repeats is not None else max(reps, profile.max_repeats)
    return _Plan(loops, cap, reps, limit)


def _run_rounds(impls: dict, est: dict, plan: _Plan, ctx, progress, label: str,
                settle_s: float, spinning) -> dict:
    """The timed rounds -> name -> list of samples (seconds per call)."""
    names = list(impls)
    times = {n: [] for n in names}
    prev = names[-1]                             # the last one warmed up
    with _no_gc():
        r = 0
        while r < plan.reps or (r < plan.limit and _spread(times, plan.cap) > NOISY_SPREAD):
            if progress:
                progress.status(f"{label}: round {r + 1}/"
                                f"{plan.reps if r < plan.reps else plan.limit}")
            k = r % len(names)
            for name in names[k:] + names[:k]:
                if name not in plan.cap or len(times[name]) < plan.cap[name]:
                    if settle_s and prev != name and (spinning is None or prev in spinning):
                        time.sleep(settle_s)
                    prev = name
                    with ctx(name):
                        if settle_s:
                            _rewarm(impls[name], est[name])
                        times[name].append(_time_loop(impls[name], plan.loops[name]))
            r += 1
    return times


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
    ctx = context or (lambda name: contextlib.nullcontext())
    est, outputs = _warm_up(impls, ctx, progress, label)
    plan = _plan(est, profile, repeats)
    times = _run_rounds(impls, est, plan, ctx, progress, label, settle_s, spinning)
    return {n: {"median_s": statistics.median(times[n]), "min_s": min(times[n]),
                "times_s": times[n], "loops": plan.loops[n], "output": outputs[n]}
            for n in impls}


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


def ratio_stats(num: list, den: list) -> dict | None:
    """The per-round ratios num[r] / den[r] (see :func:`paired_ratio`): their
    median, quartiles (the spread) and number -> ``{"median", "q1", "q3",
    "rounds"}``, or None without a pair."""
    n = min(len(num), len(den))
    if n == 0:
        return None
    r = sorted(a / b for a, b in zip(num[:n], den[:n]))
    q1, q3 = (statistics.quantiles(r, n=4, method="inclusive")[::2] if n > 1
              else (r[0], r[0]))
    return {"median": statistics.median(r), "q1": q1, "q3": q3, "rounds": n}
