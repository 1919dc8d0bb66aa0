"""The score options of the ``backward`` section: a soft cap, a causal
window of 512 keys and sinks, each causal at a long sequence, forward +
backward of fastattn against torch's eager formula (the scores
materialised, softmax, autograd), time and extra peak memory of each.

Each option runs in a fresh subprocess, both implementations there: one
call of each, its extra peak RSS (``VmHWM`` reset through
``/proc/self/clear_refs`` before it, less the RSS before it, as
:mod:`.memory` measures), then the timed rounds, alternating the two (one
call each per round).  The eager formula holds several score-sized
matrices at once (:data:`EAGER_SCORE_COPIES` per option, as measured at
small sizes); where that estimate exceeds the limit (``--eager-max-gib``, and
at most :data:`SAFE_FRACTION` of the memory available when the run starts),
it runs on as many of the heads as fit, and its times and memory are scaled
by the number of heads (every tensor and every step of it is per head); with
not even one head fitting, it is not run, and its row gives the estimate and
says so.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from . import procmem
from .timing import ratio_stats

MIB = 2 ** 20
OPTIONS = ("softcap", "window512", "sinks")
SOFTCAP, WINDOW = 30.0, 512
# what the eager formula holds at its peak beyond its outputs, in score-sized
# (B*H*L*S float32) matrices (the saved tanh and softmax outputs, the
# temporaries of the forward, the weights' and scores' gradients): measured
# 5.1, 4.1 and 4.1 at (1, 2, 4096, 64), where each is a 128 MiB mapping of
# its own as at full size; one more each for safety
EAGER_SCORE_COPIES = {"softcap": 6, "window512": 5, "sinks": 5}
SAFE_FRACTION = 0.7
TARGET_VS_EAGER = 5.0
TARGET_EXTRA_BYTES = 64 * MIB

# Run as ``python -c _SCRIPT OPTION:HEADS,... B H L D threads rounds softcap window``
# (HEADS: those the eager formula runs on, 0 for none); prints one JSON line,
# option -> its record, the options measured one after the other.
_SCRIPT = r"""
import json, sys, time
import numpy as np
jobs = [(o, int(h)) for o, h in (j.split(":") for j in sys.argv[1].split(","))]
B, H, L, D, t, rounds = map(int, sys.argv[2:8])
SOFTCAP, WINDOW = float(sys.argv[8]), int(sys.argv[9])
import fastattn

def inputs(L):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, H, L, D), dtype=np.float32) for _ in range(4)]

def kwargs(opt):
    kw = {"is_causal": True}
    if opt == "softcap":
        kw["softcap"] = SOFTCAP
    elif opt == "window512":
        kw["window"] = (WINDOW - 1, 0)
    else:
        kw["sinks"] = np.linspace(-1.0, 1.0, H).astype(np.float32)
    return kw

def fa_run(opt, q, k, v, do):
    kw = kwargs(opt)
    o, lse = fastattn.attention(q, k, v, return_lse=True, num_threads=t, **kw)
    return fastattn.attention_backward(do, q, k, v, o, lse, num_threads=t, **kw)

def eager_run(opt, q, k, v, do):
    import torch
    h = q.shape[1]
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    hidden = (j > i) | ((j < i - (WINDOW - 1)) if opt == "window512" else False)
    s = (tq @ tk.transpose(-1, -2)) * (1.0 / D ** 0.5)
    if opt == "softcap":
        s = SOFTCAP * torch.tanh(s / SOFTCAP)
    s = s.masked_fill(hidden, float("-inf"))
    grads = [tq, tk, tv]
    if opt == "sinks":
        sk = torch.linspace(-1.0, 1.0, H)[:h].clone().requires_grad_()
        s = torch.cat([s, sk.view(1, h, 1, 1).expand(B, h, n, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1]
        grads.append(sk)
    else:
        p = torch.softmax(s, dim=-1)
    (p @ tv).backward(torch.from_numpy(do))
    return [g.grad.numpy() for g in grads]

def measure(opt, heads, full):
    impls = {"fastattn": fa_run, **({"eager": eager_run} if heads else {})}
    small = inputs(16)
    want = {n: f(opt, *small) for n, f in impls.items()}
    rec = {"grad_max_abs_diff_small": max(float(np.max(np.abs(a - b))) for a, b in zip(
        want["fastattn"], want["eager"])) if heads else None}
    args = {"fastattn": full}
    if heads:         # its heads (all, or the first ones: a copy, made here)
        args["eager"] = [a if heads == H else np.ascontiguousarray(a[:, :heads]) for a in full]
    for name, f in impls.items():
        reset = reset_peak()
        before = status()
        out = f(opt, *args[name])
        after = status()
        rec[name] = {"extra_peak_bytes": after["VmHWM"] - before["VmRSS"],
                     "hwm_reset": reset, "times_s": [],
                     "output_bytes": int(sum(np.asarray(a).nbytes for a in out))}
        del out
    for r in range(rounds):
        for name in list(impls)[r % len(impls):] + list(impls)[:r % len(impls)]:
            t0 = time.perf_counter()
            impls[name](opt, *args[name])
            rec[name]["times_s"].append(time.perf_counter() - t0)
    return rec

if any(h for _, h in jobs):
    import torch
    torch.set_num_threads(t)
full = inputs(L)
print(json.dumps({opt: measure(opt, heads, full) for opt, heads in jobs}))
"""


def estimate_eager_bytes(option: str, shape: tuple) -> int:
    """The eager formula's extra peak, estimated: EAGER_SCORE_COPIES[option]
    float32 score matrices (and the boolean mask)."""
    B, H, L, S, D = shape
    return EAGER_SCORE_COPIES[option] * B * H * L * S * 4 + L * S


def eager_heads(option: str, shape: tuple, torch: bool,
                eager_max_bytes: int) -> tuple[int, str | None]:
    """-> (the heads the eager formula runs on, 0 for none; why not all of
    them, or None)."""
    if not torch:
        return 0, "torch is not installed (or not asked for): no eager formula"
    B, H, L, S, D = shape
    avail = procmem.available_bytes()
    limit = eager_max_bytes if avail is None else min(eager_max_bytes,
                                                      int(SAFE_FRACTION * avail))
    need = estimate_eager_bytes(option, shape)
    h = next((h for h in range(H, 0, -1)
              if estimate_eager_bytes(option, (B, h, L, S, D)) <= limit), 0)
    if h == H:
        return H, None
    why = (f"would need ~{need / 2 ** 30:.1f} GiB (estimate), over the limit of "
           f"{limit / 2 ** 30:.1f} GiB (--eager-max-gib, at most {SAFE_FRACTION:.0%} of the "
           "memory available)")
    if h == 0:
        return 0, f"not run: it {why}"
    return h, f"run on {h} of the {H} heads, its times and memory x {H / h:g}: the whole {why}"


def _measure(jobs: list, shape, threads, rounds) -> dict:
    """One subprocess measuring the (option, eager heads) ``jobs`` -> option
    -> its record (or, for each, ``error``)."""
    B, H, L, S, D = shape
    cmd = [sys.executable, "-c", procmem.source() + _SCRIPT, ",".join(f"{o}:{h}" for o, h in jobs),
           *map(str, (B, H, L, D, threads, rounds)), str(SOFTCAP), str(WINDOW)]
    fail = None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        fail = "timed out after 1800 s"
    else:
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
            fail = f"exit {p.returncode}: {tail[0][:200]}"
        else:
            try:
                return json.loads(p.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                fail = "could not parse the subprocess output"
    return {o: {"error": fail} for o, _ in jobs}


def _option_row(option, shape, threads, rec, heads, why) -> dict:
    """The JSON row of one option from its subprocess record (the eager
    formula's figures scaled to all heads where it ran on ``heads`` < H)."""
    H = shape[1]
    row = {"section": "backward", "kind": "score_option", "option": option,
           "shape": dict(zip("BHLSD", shape)), "dtype": "float32", "causal": True,
           "threads": threads, "eager_estimate_bytes": estimate_eager_bytes(option, shape),
           "vs_eager": None, "vs_eager_target": TARGET_VS_EAGER,
           "extra_target_bytes": TARGET_EXTRA_BYTES, "notes": [], **rec}
    for name, factor in (("fastattn", 1.0), ("eager", H / heads if heads else 1.0)):
        if name in rec:
            r = rec[name]
            r["scaled_by"] = factor
            r["times_s"] = [x * factor for x in r["times_s"]]
            r["median_s"] = statistics.median(r["times_s"])
            r["extra_peak_bytes"] = int(r["extra_peak_bytes"] * factor)
            r["output_bytes"] = int(r["output_bytes"] * factor)
            r["beyond_outputs_bytes"] = r["extra_peak_bytes"] - r["output_bytes"]
    if heads == 0:
        row["eager"] = {"skipped": why}
    elif "fastattn" in rec and "eager" in rec:
        row["eager"]["heads"] = heads
        row["vs_eager"] = ratio_stats(rec["eager"]["times_s"], rec["fastattn"]["times_s"])
        if why:
            row["notes"].append(f"eager {why}")
    return row


def option_note(row: dict) -> str:
    """The progress line of an option's row."""
    if "error" in row:
        return f"backward {row['option']}: {row['error']}"
    fa = row["fastattn"]
    text = (f"backward {row['option']} L={row['shape']['L']}: fastattn "
            f"{fa['median_s']:.3g} s, {fa['extra_peak_bytes'] / MIB:.0f} MiB extra")
    eg = row.get("eager", {})
    if "median_s" in eg:
        text += f"; eager {eg['median_s']:.3g} s, {eg['extra_peak_bytes'] / MIB:.0f} MiB extra"
    return text


def run_options(shape, threads: int, rounds: int, *, torch: bool, eager_max_bytes: int,
                progress, one_process: bool = False) -> list[dict]:
    """Every option at ``shape`` on ``threads`` threads, each in a fresh
    subprocess (``one_process``: all in one, as ``--quick`` does: small
    shapes, where starting torch three times would be most of the time)
    -> their rows."""
    if not shape:
        return []
    plans = {o: eager_heads(o, shape, torch, eager_max_bytes) for o in OPTIONS}
    groups = [list(OPTIONS)] if one_process else [[o] for o in OPTIONS]
    rows = []
    for group in groups:
        progress.status(f"backward {', '.join(group)} (subprocess)")
        recs = _measure([(o, plans[o][0]) for o in group], shape, threads, rounds)
        for o in group:
            rows.append(_option_row(o, shape, threads, recs.get(o, {"error": "no record"}),
                                    *plans[o]))
            progress.step(option_note(rows[-1]))
    return rows
