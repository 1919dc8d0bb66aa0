"""The ``backward`` section of the benchmark: :func:`fastattn.attention` with
``return_lse=True`` followed by :func:`fastattn.attention_backward` (forward
+ backward) against torch SDPA's forward + ``out.backward(grad)`` on the same
tensors (torch held to its CPU flash kernel where it has one), fastattn's
backward alone against its own forward, and the thread scaling of both;
then a learned bias's gradient against torch SDPA (:mod:`.backward_bias`),
and the score options at a long sequence against torch's eager formula
(:mod:`.backward_options`, in subprocesses: their memory is the point).

Every implementation of a shape, at every thread count, takes part in the
same interleaved rounds (:func:`.timing.run_interleaved`); each ratio is
the median over the rounds of the two samples of one round, reported with
the quartiles of those per-round ratios (its spread).  The targets are
printed beside the figures; they are not checked here (a shared machine's
timings say little about them).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from .backward_bias import run_bias_rows
from .backward_options import run_options
from .cases import Case, causal_fraction, make_inputs
from .peers import _to_torch, grads_vs_torch
from .report import fmt_time
from .timing import SETTLE_S, ratio_stats, run_interleaved

# the targets: fastattn forward + backward over torch's (float32; bfloat16
# where the machine has AVX512-BF16 or AMX), backward / forward (the FLOP
# ratio, float32), the speed-up on 2 threads over 1
TARGET_VS_TORCH = {"float32": 1.4, "bfloat16": 3.0}
TARGET_BWD_OVER_FWD = 2.5
TARGET_SCALING = 1.8
BF16_TIERS = ("avx512_bf16", "amx")
DTYPES = ("float32", "bfloat16")
# the implementations of one shape, each timed at every thread count
IMPLS = ("fastattn_fwd_bwd", "torch_fwd_bwd", "fastattn_fwd", "fastattn_bwd")
# FLOPs per B*H*L*S*D (x the causal fraction): the forward's two matrix
# products, and the backward's five (Q K^T again, dV, dP, dQ, dK)
FWD_FLOPS, BWD_FLOPS = 4.0, 10.0


def _torch_kernel(torch, dtype: str):
    """-> (a context holding SDPA to the CPU flash kernel, or a null one where
    torch cannot, the note saying so)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        x = torch.ones((1, 1, 8, 8), dtype=tdt, requires_grad=True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(x, x, x).sum().backward()
        return (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)), None
    except Exception as e:  # noqa: BLE001 - an old or unusual torch: its own choice
        return contextlib.nullcontext, (f"torch: the flash kernel is not usable here "
                                        f"({type(e).__name__}: {str(e)[:80]}): torch's own "
                                        "choice of kernel")


def _fastattn_impls(fa, q, k, v, d_o, causal):
    """t -> the three fastattn callables of a shape at t threads."""
    out, lse = fa.attention(q, k, v, is_causal=causal, return_lse=True)

    def fwd_bwd(t):
        o, m = fa.attention(q, k, v, is_causal=causal, return_lse=True, num_threads=t)
        return fa.attention_backward(d_o, q, k, v, o, m, is_causal=causal, num_threads=t)

    return {"fastattn_fwd_bwd": lambda t: (lambda: fwd_bwd(t)),
            "fastattn_fwd": lambda t: (lambda: fa.attention(q, k, v, is_causal=causal,
                                                            return_lse=True, num_threads=t)),
            "fastattn_bwd": lambda t: (lambda: fa.attention_backward(
                d_o, q, k, v, out, lse, is_causal=causal, num_threads=t))}


def _torch_impl(torch, kernel, q, k, v, d_o, causal):
    """torch SDPA forward + backward on leaf tensors sharing the arrays'
    memory -> a callable returning the three gradients, and the name of the
    backward node torch chose (its kernel)."""
    F = torch.nn.functional
    tq, tk, tv = (_to_torch(torch, a).requires_grad_() for a in (q, k, v))
    tdo = _to_torch(torch, d_o)
    node = []

    def run():
        for x in (tq, tk, tv):
            x.grad = None
        with kernel():
            o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        if not node:
            node.append(type(o.grad_fn).__name__)
        o.backward(tdo)
        return tq.grad, tk.grad, tv.grad

    return run, node


def _plan_shape(b, shape, causal, dtype):
    """The impls ("name@t" -> callable) of one shape and dtype, their thread
    counts, and the torch kernel's note and node."""
    q, k, v = make_inputs(Case("backward", "attention", shape, dtype, causal))
    rng = np.random.default_rng(1)
    d_o = rng.standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(q.dtype)
    fast = _fastattn_impls(b.fa, q, k, v, d_o, causal)
    torch_run, note, node = None, None, []
    if b.tools.torch is not None and "torch" in b.peers:
        kernel, note = _torch_kernel(b.tools.torch, dtype)
        torch_run, node = _torch_impl(b.tools.torch, kernel, q, k, v, d_o, causal)
    impls, thread_of = {}, {}
    for t in b.threads:
        for name in IMPLS:
            if name in fast:
                impls[f"{name}@{t}"] = fast[name](t)
            elif torch_run is not None:
                impls[f"{name}@{t}"] = torch_run
            else:
                continue
            thread_of[f"{name}@{t}"] = t
    return impls, thread_of, note, node


def _row(shape, causal, dtype, t, res, targets) -> dict:
    """The row of one shape and dtype at t threads."""
    B, H, L, S, D = shape
    rec = {n.rsplit("@", 1)[0]: r for n, r in res.items() if n.endswith(f"@{t}")}
    work = B * H * L * S * D * causal_fraction(L, S, causal)
    fb = rec["fastattn_fwd_bwd"]
    row = {"section": "backward", "kind": "fwd_bwd",
           "case": f"{B}x{H}x{L}x{D}" if L == S else f"{B}x{H}x{L}x{S}x{D}",
           "shape": dict(zip("BHLSD", shape)), "dtype": dtype, "causal": causal, "threads": t,
           "flops_fwd": FWD_FLOPS * work, "flops_bwd": BWD_FLOPS * work,
           "impls": {n: {kk: vv for kk, vv in r.items() if kk != "output"}
                     for n, r in rec.items()},
           "fastattn_fwd_bwd_s": fb["median_s"],
           "gflops_fwd_bwd": (FWD_FLOPS + BWD_FLOPS) * work / fb["median_s"] / 1e9,
           "bwd_over_fwd": ratio_stats(rec["fastattn_bwd"]["times_s"],
                                       rec["fastattn_fwd"]["times_s"]),
           "bwd_over_fwd_target": TARGET_BWD_OVER_FWD if dtype == "float32" else None,
           "vs_torch": None, "vs_torch_target": targets.get(dtype), "notes": []}
    if "torch_fwd_bwd" in rec:
        row["torch_fwd_bwd_s"] = rec["torch_fwd_bwd"]["median_s"]
        row["vs_torch"] = ratio_stats(rec["torch_fwd_bwd"]["times_s"], fb["times_s"])
    return row


def _scaling(shape_rows: list, res: dict, threads: list) -> list:
    """The speed-up at t threads over 1 of each implementation of one shape."""
    out = []
    if 1 not in threads:
        return out
    base = shape_rows[0]
    for t in threads:
        if t == 1:
            continue
        rec = {"section": "backward", "case": base["case"], "dtype": base["dtype"],
               "causal": base["causal"], "threads": t, "target": TARGET_SCALING}
        for name in IMPLS:
            if f"{name}@1" in res and f"{name}@{t}" in res:
                rec[name] = ratio_stats(res[f"{name}@1"]["times_s"],
                                        res[f"{name}@{t}"]["times_s"])
        out.append(rec)
    return out


def backward_jobs(profile) -> list[tuple]:
    """-> the (shape, causal, dtype) of the timed part, in order."""
    return [(shape, causal, dt) for shape, causal in profile.backward for dt in DTYPES]


def _time_shape(b, shape, causal, dtype, targets) -> tuple[list, list]:
    """One shape and dtype, all implementations and thread counts in the same
    rounds -> (its rows, its scaling records)."""
    label = f"backward {'x'.join(map(str, shape))} {dtype}{' causal' if causal else ''}"
    impls, thread_of, note, node = _plan_shape(b, shape, causal, dtype)
    prof = dataclasses.replace(b.profile, budget_s=b.profile.budget_s * len(b.threads))
    res = run_interleaved(impls, prof, b.repeats, b.progress, label,
                          settle_s=SETTLE_S if max(b.threads) > 1 else 0.0,
                          context=lambda name: b.limits[thread_of[name]],
                          spinning={n for n in impls if thread_of[n] > 1})
    check = grads_vs_torch(res, dtype)
    rows = []
    for t in b.threads:
        row = _row(shape, causal, dtype, t, res, targets)
        row.update(check, path=b.fa.get_isa(), torch_kernel=node[0] if node else None)
        row["notes"] += [note] if note else []
        if dtype == "bfloat16" and targets.get(dtype) is None:
            row["notes"].append("no target: neither AVX512-BF16 nor AMX here")
        if check and not check["grad_ok"]:
            row["notes"].append(f"GRADIENT MISMATCH vs torch (rel {check['grad_rel_diff']:.2g})")
        rows.append(row)
        b.progress.step(f"{label} {t}t: fwd+bwd {fmt_time(row['fastattn_fwd_bwd_s'])}"
                        + (f", torch {fmt_time(row['torch_fwd_bwd_s'])}"
                           if "torch_fwd_bwd_s" in row else ""))
    return rows, _scaling(rows, res, b.threads)


def run_backward_section(b, *, quick: bool, eager_max_bytes: int) -> dict:
    """The section's measurements on the run's :class:`.runner.Bench` ``b``
    -> ``{"rows", "scaling", "bias", "options"}`` (the JSON's ``backward``)."""
    bf16 = any(i in b.fa.available_isas() for i in BF16_TIERS)
    targets = {k: v for k, v in TARGET_VS_TORCH.items() if k == "float32" or bf16}
    rows, scaling = [], []
    for shape, causal, dtype in backward_jobs(b.profile):
        r, s = _time_shape(b, shape, causal, dtype, targets)
        rows += r
        scaling += s
    bias = run_bias_rows(b)
    options = run_options(b.profile.backward_options, max(b.threads), b.repeats or
                          (2 if quick else 3), torch=b.tools.torch is not None
                          and "torch" in b.peers, eager_max_bytes=eager_max_bytes,
                          progress=b.progress, one_process=quick)
    return {"rows": rows, "scaling": scaling, "bias": bias, "options": options}

