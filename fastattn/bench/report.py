"""The report of a benchmark run: the result rows of each case, the markdown
tables (timings, thread scaling, peak memory) under a header that describes
the machine and the run, and the JSON document."""

from __future__ import annotations

import json
import math

import numpy as np

from .cases import SECTIONS, Case, arith_dtype, variant_kwargs
from .machine import OPENBLAS_VARS
from .timing import paired_ratio


def fmt_time(s: float | None) -> str:
    """Seconds as µs, ms or s."""
    if s is None or not math.isfinite(s):
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def _ratio(a, b):
    """b / a, or None where it means nothing."""
    if a is None or b is None or not (a > 0) or not math.isfinite(b):
        return None
    return b / a



# the options the bfloat16 driver of the amx / avx512_bf16 tiers leaves to the
# float32-arithmetic path (src_c/kernels/kernels.h)
_BF16_DECLINED = ("attn_mask", "softcap", "alibi_slopes", "sinks")


# The fewest query rows the bf16 tile driver takes (FA_BF16_MIN_ROWS,
# src_c/kernels/blocking.h); a decoding step runs the direct 16-bit path.
BF16_MIN_ROWS = 16


def kernel_path(case: Case) -> str:
    """The ISA path that ran the case, and for bfloat16 on the amx or
    avx512_bf16 tiers whether their bfloat16 driver took it (amx: "bf16
    tiles", avx512_bf16: "bf16 dot products") or the float32 arithmetic did."""
    import fastattn
    isa = fastattn.get_isa()
    if case.kind != "attention" or case.dtype != "bfloat16" or isa not in ("amx", "avx512_bf16"):
        return isa
    B, H, L, S, D = case.shape
    kw = variant_kwargs(case.variant, H, L, S) if case.variant else {}
    if any(k in kw for k in _BF16_DECLINED) or D > 256 or L < BF16_MIN_ROWS:
        return f"{isa} (float32 arithmetic)"
    return f"{isa} (bf16 tiles)" if isa == "amx" else f"{isa} (bf16 dot products)"


def _base_row(case: Case, t: int, res: dict, var: str, skipped: dict, peaks: dict) -> dict:
    """The row of fastattn variant ``var`` at ``t`` threads, before the peers."""
    flops = case.flops()
    peak = peaks.get((arith_dtype(case.dtype), t))
    fa_s = res[var]["median_s"]
    gflops = flops / fa_s / 1e9 if math.isfinite(flops) else None
    return {
        "section": case.section,
        "case": case.label + (" out=x" if var.endswith("_inplace") else
                              " int8 cache" if var.endswith("_int8cache") else
                              " padded+key_padding_mask" if var.endswith("_padded") else ""),
        "kind": case.kind,
        "variant": var,
        "shape": (dict(zip("BHLSD", case.shape)) if case.kind == "attention"
                  else dict(zip("MN", case.shape))),
        "kv_heads": case.heads_kv if case.kind == "attention" else None,
        "dtype": case.dtype,
        "path": kernel_path(case),
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


def _add_peers(row: dict, res: dict, var: str, flops: float) -> None:
    """The peers' GFLOP/s and their ratios to fastattn's time."""
    for n in ("torch", "numpy"):
        if n in res:
            row["impls"][n]["gflops"] = (flops / res[n]["median_s"] / 1e9
                                         if math.isfinite(flops) else None)
            # the median over rounds of the peer's time / fastattn's time in
            # the same round (paired: a slow spell hits both), and the
            # ratio of the two medians, for reference
            row["speedup"][n] = paired_ratio(res[n]["times_s"], res[var]["times_s"])
            row.setdefault("speedup_of_medians", {})[n] = _ratio(row["fastattn_s"],
                                                                 res[n]["median_s"])


def _add_check(row: dict, check) -> None:
    """The output check (see peers.check_outputs), noted when it failed."""
    diff, against, ok = check
    row["max_abs_diff"] = diff
    row["checked_against"] = against
    row["output_ok"] = ok
    if not ok:
        row["notes"].append(f"MISMATCH vs {against} (max|Δ|="
                            + ("shape" if diff is None else f"{diff:.2g}") + ")")


def _other_notes(case: Case, res: dict, skipped: dict, fa_s: float) -> list[str]:
    """Skipped peers, peers with few samples, softmax bandwidth."""
    notes = [f"{n}: {why}" for n, why in skipped.items()]
    for n in ("torch", "numpy"):
        if n in res and len(res[n]["times_s"]) < 3:
            k = len(res[n]["times_s"])
            notes.append(f"{n}: slow, {k} sample{'s' if k > 1 else ''}")
    if "fastattn_padded" in res:  # the varlen case: the padded call's time over its own
        x = paired_ratio(res["fastattn_padded"]["times_s"], res["fastattn"]["times_s"])
        if x is not None:
            notes.append(f"padded {x:.2f}x slower")
    if case.kind == "softmax":
        nbytes = 2 * int(np.prod(case.shape)) * np.dtype(case.dtype).itemsize
        notes.append(f"{nbytes / fa_s / 1e9:.1f} GB/s")
    return notes


def cache_bytes(case: Case, var: str) -> int:
    """Bytes of K and V a decode case reads: its dtype's, or int8 levels and
    one float32 scale per row for the int8 cache."""
    B, _, _, S, D = case.shape
    if var.endswith("_int8cache"):
        return 2 * B * case.heads_kv * S * (D + 4)
    return case.kv_bytes()


def make_rows(case: Case, t: int, res: dict, skipped: dict, variants, peaks: dict,
              check) -> list[dict]:
    """The result rows of ``case`` at ``t`` threads (one per fastattn variant)
    from its timings ``res`` (name -> run_interleaved's record)."""
    rows = []
    for var in variants:
        if var not in res:
            continue
        row = _base_row(case, t, res, var, skipped, peaks)
        _add_peers(row, res, var, case.flops())
        if check is not None:
            _add_check(row, check)
        row["notes"] += _other_notes(case, res, skipped, row["fastattn_s"])
        rows.append(row)
    return rows


def sort_rows(rows: list[dict]) -> list[dict]:
    """Order rows by section, case (in the order first seen), then thread count."""
    order = {s: i for i, s in enumerate(SECTIONS)}
    case_order = {}
    for r in rows:
        case_order.setdefault((r["section"], r["case"], r["dtype"], r["causal"]), len(case_order))
    return sorted(rows, key=lambda r: (order.get(r["section"], 99),
                                       case_order[(r["section"], r["case"], r["dtype"],
                                                   r["causal"])],
                                       r["threads"]))


def _cell_speed(row, peer):
    """The `vs peer` cell of a row."""
    if peer in row["skipped"]:
        return "skip" if row["skipped"][peer].startswith("skipped") else "n/a"
    x = row["speedup"].get(peer)
    return "—" if x is None else f"{x:.2f}×"


def format_table(rows: list[dict], peers) -> str:
    """The timings table (markdown), one line per row."""
    hdr = ["case", "dtype", "path", "causal", "thr", "fastattn", "GFLOP/s", "% peak"]
    for p in peers:
        hdr += [p, f"vs {p}"]
    hdr.append("notes")
    lines = ["| " + " | ".join(hdr) + " |",
             "|" + "|".join("---" if i < 4 else "--:" for i in range(len(hdr) - 1))
             + "|---|"]
    for r in rows:
        cells = [r["case"], r["dtype"], r.get("path", "?"), "yes" if r["causal"] else "no",
                 str(r["threads"]), fmt_time(r["fastattn_s"]),
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
    """The thread scaling table (markdown)."""
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
    """The peak memory table (markdown)."""
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
    """The report's header: the machine, versions, missing peers and tools,
    thread pools, environment, background load and the two peaks."""
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
    for r in meta.get("read_bandwidth") or []:
        lines.append(f"- read bandwidth {r['threads']} thread(s): {r['gbps']:.1f} GB/s "
                     f"(fastattn's read probe over {r['bytes'] / 2**20:.0f} MiB: a decoding "
                     f"step's bound)")
    for f in fma:
        lines.append(f"- FMA peak {f['dtype']} {f['threads']} thread(s): "
                     f"{f['gflops']:.1f} GFLOP/s (fastattn's register-only FMA probe, "
                     f"{meta['isa']} kernels"
                     + (f"; {f['speedup_vs_1']:.2f}× 1 thread" if "speedup_vs_1" in f else "")
                     + ")")
    return "\n".join(lines)



def _scaling_section(scaling: list[dict], fma: list[dict], peers) -> list[str]:
    """The thread scaling table and the machine's own ceiling under it."""
    out = ["## Thread scaling", "", format_scaling(scaling, peers), ""]
    ceil = [f for f in fma if "speedup_vs_1" in f]
    if ceil:
        out += ["The machine's own ceiling, the register-only FMA probe (no memory "
                "traffic): " + ", ".join(f"{f['dtype']} {f['speedup_vs_1']:.2f}× at "
                                         f"{f['threads']} threads" for f in ceil)
                + " (median of the per-round ratios) when measured on its own; the "
                "`machine` column times the same probe in every round of each case, "
                "so a low speed-up there is the machine's at that time (on a shared VM "
                "two threads sometimes get one core's worth), not the code's.", ""]
    return out


def format_report(meta: dict, peaks: list[dict], fma: list[dict], rows: list[dict],
                  scaling: list[dict], mem: list[dict], peers, elapsed: float,
                  sections: str = "") -> str:
    """The whole markdown report (header, then the tables there is data for,
    then ``sections``: the markdown of the sections with tables of their own)."""
    out = [format_header(meta, peaks, fma), ""]
    if rows:
        out += ["## Timings (median of interleaved rounds)", "",
                format_table(rows, peers), "",
                "fastattn/peer columns: median time per call; `vs X` = median over the "
                "rounds of X's time / fastattn's time in the same round (> 1: fastattn is "
                "faster); % peak = fastattn GFLOP/s over the same-dtype np.matmul peak at "
                "the same thread count.", ""]
    if scaling:
        out += _scaling_section(scaling, fma, peers)
    if mem:
        out += ["## Peak memory (one call, fresh subprocess, VmHWM)", "",
                format_memory(mem), ""]
    if sections:
        out.append(sections)
    out.append(f"total benchmark time: {elapsed:.1f} s")
    return "\n".join(out) + "\n"


def _json_default(o):
    """NumPy scalars as JSON numbers and booleans."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_json(path: str, meta: dict, peaks: list[dict], fma: list[dict], rows: list[dict],
               scaling: list[dict], mem: list[dict], extra: dict | None = None) -> None:
    """Everything (metadata, peaks, every sample, scaling, memory) as JSON;
    ``extra``: the records of sections with their own modules, by name."""
    doc = {"schema": "fastattn-bench/1", "meta": meta, "peaks": peaks,
           "fma_peaks": fma,
           "results": rows, "scaling": scaling, "memory": mem, **(extra or {})}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=_json_default)
        f.write("\n")
