"""The ``backward`` section's markdown: forward + backward against torch and
the backward against the forward, the thread scaling, a learned bias's
gradient against torch SDPA, the score options against the eager formula
(see :mod:`.backward_section`)."""

from __future__ import annotations

from .report import fmt_time

MIB = 2 ** 20


def _ratio(stats: dict | None) -> str:
    """A median of per-round ratios with its quartiles: ``1.52× [1.48, 1.60]``."""
    if not stats:
        return "—"
    return f"{stats['median']:.2f}× [{stats['q1']:.2f}, {stats['q3']:.2f}]"


def _target(value, sign: str = "≥") -> str:
    return "—" if value is None else f"{sign} {value:g}"


def _timing_table(rows: list) -> list[str]:
    out = ["| case | dtype | causal | thr | fastattn fwd+bwd | GFLOP/s | torch fwd+bwd "
           "| vs torch [q1, q3] | target | fastattn fwd | fastattn bwd | bwd / fwd [q1, q3] "
           "| target | grads vs torch | notes |",
           "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in rows:
        imp = r["impls"]
        grads = ("—" if "grad_rel_diff" not in r else
                 f"{r['grad_rel_diff']:.1e} {'ok' if r['grad_ok'] else 'MISMATCH'}")
        out.append("| " + " | ".join([
            r["case"], r["dtype"], "yes" if r["causal"] else "no", str(r["threads"]),
            fmt_time(r["fastattn_fwd_bwd_s"]), f"{r['gflops_fwd_bwd']:.1f}",
            fmt_time(r.get("torch_fwd_bwd_s")), _ratio(r["vs_torch"]),
            _target(r["vs_torch_target"]), fmt_time(imp["fastattn_fwd"]["median_s"]),
            fmt_time(imp["fastattn_bwd"]["median_s"]), _ratio(r["bwd_over_fwd"]),
            _target(r["bwd_over_fwd_target"], "≤"), grads, "; ".join(r["notes"])]) + " |")
    return out


def _scaling_table(recs: list) -> list[str]:
    out = ["| case | dtype | causal | thr | fastattn fwd+bwd vs 1 thread | torch fwd+bwd "
           "| fastattn fwd | fastattn bwd | target |", "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in recs:
        out.append("| " + " | ".join([
            r["case"], r["dtype"], "yes" if r["causal"] else "no", str(r["threads"]),
            *(_ratio(r.get(n)) for n in ("fastattn_fwd_bwd", "torch_fwd_bwd", "fastattn_fwd",
                                         "fastattn_bwd")),
            _target(r["target"])]) + " |")
    return out


def _torch_path(node: str | None) -> str:
    """torch's backward node, named by the kernel behind it: a fused kernel's
    node names it; otherwise torch composed the math path of plain
    operators, whose last node is given."""
    if not node:
        return "—"
    return node if "ScaledDotProduct" in node else f"math path (ends in {node})"


def _bias_table(rows: list) -> list[str]:
    out = ["| case | bias | dtype | thr | fastattn fwd+bwd | torch fwd+bwd | vs torch [q1, q3] "
           "| bias gradient's cost [q1, q3] | grads vs torch | torch's backward | notes |",
           "|---|---|---|--:|--:|--:|--:|--:|--:|---|---|"]
    for r in rows:
        grads = ("—" if "grad_rel_diff" not in r else
                 f"{r['grad_rel_diff']:.1e} {'ok' if r['grad_ok'] else 'MISMATCH'}")
        out.append("| " + " | ".join([
            r["case"], "x".join(map(str, r["bias_shape"])), r["dtype"], str(r["threads"]),
            fmt_time(r["fastattn_fwd_bwd_s"]), fmt_time(r.get("torch_fwd_bwd_s")),
            _ratio(r["vs_torch"]), _ratio(r["bias_grad_cost"]), grads,
            _torch_path(r["torch_kernel"]), "; ".join(r["notes"])]) + " |")
    return out


def _mib(n) -> str:
    return "—" if n is None else f"{n / MIB:.1f} MiB"


def _option_cells(r: dict) -> list[str]:
    """The cells of one score option's row after its name and shape."""
    if "error" in r:
        return ["—"] * 7 + [r["error"]]
    fa, eg = r["fastattn"], r.get("eager", {})
    notes = list(r["notes"])
    if "skipped" in eg:
        notes.append(f"eager {eg['skipped']}")
        eager_mem = f"~{r['eager_estimate_bytes'] / MIB:.0f} MiB (estimate)"
    else:
        eager_mem = _mib(eg.get("beyond_outputs_bytes"))
    if r.get("grad_max_abs_diff_small") is not None:
        notes.append(f"grads vs eager at L=16: max |Δ| {r['grad_max_abs_diff_small']:.1e}")
    return [fmt_time(fa["median_s"]), fmt_time(eg.get("median_s")), _ratio(r["vs_eager"]),
            _target(r["vs_eager_target"]), _mib(fa["beyond_outputs_bytes"]),
            _target(r["extra_target_bytes"] / MIB, "≤") + " MiB", eager_mem, "; ".join(notes)]


def _options_table(rows: list) -> list[str]:
    out = ["| option | shape (B,H,L,D) | thr | fastattn fwd+bwd | eager fwd+bwd "
           "| vs eager [q1, q3] | target | fastattn extra peak beyond outputs | target "
           "| eager extra peak beyond outputs | notes |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in rows:
        s = r["shape"]
        out.append("| " + " | ".join([r["option"], f"{s['B']},{s['H']},{s['L']},{s['D']}",
                                      str(r["threads"]), *_option_cells(r)]) + " |")
    return out


def format_backward(sec: dict) -> str:
    """The section's markdown from :func:`.backward_section.run_backward_section`'s result."""
    out = ["## Backward (fastattn.attention + attention_backward vs torch SDPA forward + "
           "backward)", "",
           "Forward + backward: `fastattn.attention(return_lse=True)` then "
           "`fastattn.attention_backward`, against torch SDPA on `requires_grad` tensors "
           "sharing the same arrays, `out.backward(grad)` (torch held to its CPU flash kernel "
           "by `sdpa_kernel(FLASH_ATTENTION)`; the JSON's `torch_kernel` names the backward "
           "node it ran); every implementation and thread count of a shape in the same "
           "interleaved rounds; times are medians; `vs torch` = median over the rounds of "
           "torch's time / fastattn's, `bwd / fwd` = fastattn's backward alone over its "
           "forward alone (target: the FLOP ratio 10/4), each with the quartiles of the "
           "per-round ratios. GFLOP/s counts 14·B·H·L·S·D (x 1/2 causal). The targets are "
           "for a quiet machine; this run does not check them.", ""]
    out += _timing_table(sec["rows"]) + [""]
    if sec["scaling"]:
        out += ["### Backward: thread scaling (median of the per-round ratios [q1, q3])", ""]
        out += _scaling_table(sec["scaling"]) + [""]
    if sec.get("bias"):
        out += ["### Backward: a learned bias (T5's relative position bias) vs torch SDPA", "",
                "The bias (one per head, shared by the batch) requires grad: fastattn's "
                "`attention(q, k, v, bias, return_lse=True)` then `attention_backward(..., "
                "return_mask_grad=True)`, against torch SDPA with `attn_mask=bias` (torch's "
                "choice of kernel: its backward node is named), in the same interleaved "
                "rounds. `bias gradient's cost` = fastattn's time with the bias's gradient over "
                "its time with the bias held constant. No target.", ""]
        out += _bias_table(sec["bias"]) + [""]
    if sec["options"]:
        out += ["### Backward: score options vs the eager formula (in subprocesses)", "",
                "Causal, float32, forward + backward, in a fresh subprocess per option (one "
                "for all three in `--quick`): fastattn with `softcap=30`, "
                "`window=(511, 0)` or `sinks`, against torch's eager formula (the scores "
                "materialised, soft cap, mask, softmax, autograd). Extra peak = VmHWM growth "
                "during one call over the RSS before it, less the call's outputs (the "
                "gradients); the eager formula is not run where its estimate exceeds the "
                "limit.", ""]
        out += _options_table(sec["options"]) + [""]
    return "\n".join(out) + "\n"
