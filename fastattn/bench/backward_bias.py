"""The ``backward`` section's learned-bias rows: T5's relative position bias
(one float bias per head, shared by the batch, that requires grad), forward
+ backward with the bias's gradient, fastattn against torch SDPA.

fastattn: ``attention(q, k, v, bias, return_lse=True)`` then
``attention_backward(..., bias, return_mask_grad=True)``; also the same
call with the bias held constant (no ``return_mask_grad``), which says
what asking for its gradient costs.  torch: ``scaled_dot_product_attention``
with ``attn_mask=bias`` on leaf tensors sharing the arrays' memory, every one
of them requiring grad, ``out.backward(grad)``; torch chooses its kernel (its
CPU flash kernel has no gradient for a mask; the row names the backward node
it ran).  Every implementation at every thread count takes part in the same
interleaved rounds, as in :mod:`.backward_section`.  No target: the issue
behind the section asks for none here; the rows are for users training
T5-style models.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .cases import Case, make_inputs, storage_dtype
from .peers import _to_torch, grads_vs_torch
from .report import fmt_time
from .timing import SETTLE_S, ratio_stats, run_interleaved

DTYPES = ("float32", "bfloat16")
IMPLS = ("fastattn_fwd_bwd", "fastattn_fwd_bwd_no_bias_grad", "torch_fwd_bwd")


def _inputs(shape, bias_shape, dtype):
    """q, k, v, the bias and the output's gradient of one row."""
    q, k, v = make_inputs(Case("backward", "attention", shape, dtype, False))
    rng = np.random.default_rng(2)
    dt = storage_dtype(dtype)
    bias = rng.standard_normal(bias_shape).astype(dt)
    d_o = rng.standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(dt)
    return q, k, v, bias, d_o


def _fastattn_impls(fa, q, k, v, bias, d_o):
    """name -> (t -> a zero-arg callable at t threads)."""
    def run(t, grad):
        o, m = fa.attention(q, k, v, bias, return_lse=True, num_threads=t)
        return fa.attention_backward(d_o, q, k, v, o, m, bias, num_threads=t,
                                     return_mask_grad=grad)

    return {"fastattn_fwd_bwd": lambda t: (lambda: run(t, True)),
            "fastattn_fwd_bwd_no_bias_grad": lambda t: (lambda: run(t, False))}


def _torch_impl(torch, q, k, v, bias, d_o):
    """torch SDPA forward + backward with the bias as a leaf mask -> a
    callable returning (dq, dk, dv, dbias), and the list that receives the
    name of the backward node torch chose."""
    F = torch.nn.functional
    leaves = [_to_torch(torch, a).requires_grad_() for a in (q, k, v, bias)]
    tdo = _to_torch(torch, d_o)
    node = []

    def run():
        for x in leaves:
            x.grad = None
        tq, tk, tv, tb = leaves
        o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb)
        if not node:
            node.append(type(o.grad_fn).__name__)
        o.backward(tdo)
        return tuple(x.grad for x in leaves)

    return run, node


def _plan(b, shape, bias_shape, dtype):
    """-> (impls "name@t" -> callable, thread_of, torch's node list)."""
    q, k, v, bias, d_o = _inputs(shape, bias_shape, dtype)
    fast = _fastattn_impls(b.fa, q, k, v, bias, d_o)
    torch_run, node = None, []
    if b.tools.torch is not None and "torch" in b.peers:
        torch_run, node = _torch_impl(b.tools.torch, q, k, v, bias, d_o)
    impls, thread_of = {}, {}
    for t in b.threads:
        for name in IMPLS:
            fn = fast[name](t) if name in fast else torch_run
            if fn is not None:
                impls[f"{name}@{t}"] = fn
                thread_of[f"{name}@{t}"] = t
    return impls, thread_of, node


def _row(shape, bias_shape, dtype, t, res) -> dict:
    """The row of one shape and dtype at t threads."""
    rec = {n.rsplit("@", 1)[0]: r for n, r in res.items() if n.endswith(f"@{t}")}
    B, H, L, S, D = shape
    fb = rec["fastattn_fwd_bwd"]
    row = {"section": "backward", "kind": "learned_bias",
           "case": f"{B}x{H}x{L}x{D}" if L == S else f"{B}x{H}x{L}x{S}x{D}",
           "shape": dict(zip("BHLSD", shape)), "bias_shape": list(bias_shape),
           "dtype": dtype, "threads": t,
           "impls": {n: {kk: vv for kk, vv in r.items() if kk != "output"}
                     for n, r in rec.items()},
           "fastattn_fwd_bwd_s": fb["median_s"],
           "bias_grad_cost": ratio_stats(fb["times_s"],
                                         rec["fastattn_fwd_bwd_no_bias_grad"]["times_s"]),
           "vs_torch": None, "notes": []}
    if "torch_fwd_bwd" in rec:
        row["torch_fwd_bwd_s"] = rec["torch_fwd_bwd"]["median_s"]
        row["vs_torch"] = ratio_stats(rec["torch_fwd_bwd"]["times_s"], fb["times_s"])
    return row


def bias_jobs(profile) -> list[tuple]:
    """-> the (shape, bias shape, dtype) of the learned-bias rows, in order."""
    return [(shape, bias_shape, dt) for shape, bias_shape in profile.backward_bias
            for dt in DTYPES]


def run_bias_rows(b) -> list[dict]:
    """Every learned-bias job of ``b``'s profile at every thread count of the
    run :class:`.runner.Bench` ``b`` -> their rows."""
    rows = []
    prof = dataclasses.replace(b.profile, budget_s=b.profile.budget_s * len(b.threads))
    for shape, bias_shape, dtype in bias_jobs(b.profile):
        label = f"backward bias {'x'.join(map(str, shape))} {dtype}"
        impls, thread_of, node = _plan(b, shape, bias_shape, dtype)
        res = run_interleaved(impls, prof, b.repeats, b.progress, label,
                              settle_s=SETTLE_S if max(b.threads) > 1 else 0.0,
                              context=lambda name: b.limits[thread_of[name]],
                              spinning={n for n in impls if thread_of[n] > 1})
        check = grads_vs_torch(res, dtype)
        for t in b.threads:
            row = _row(shape, bias_shape, dtype, t, res)
            row.update(check, path=b.fa.get_isa(), torch_kernel=node[0] if node else None)
            if check and not check["grad_ok"]:
                row["notes"].append(f"GRADIENT MISMATCH vs torch (rel "
                                    f"{check['grad_rel_diff']:.2g})")
            rows.append(row)
            b.progress.step(f"{label} {t}t: fwd+bwd {fmt_time(row['fastattn_fwd_bwd_s'])}"
                            + (f", torch {fmt_time(row['torch_fwd_bwd_s'])}"
                               if "torch_fwd_bwd_s" in row else ""))
    return rows
