"""The ``serving`` section's transformers rows: a tiny random-weight Llama
served with ``attn_implementation`` = sdpa and fastattn, on each thread count:

* ``generate_batch`` (continuous batching over transformers' paged cache):
  ``requests`` concurrent requests, prompts spread over ``prompts`` tokens,
  ``batch_new`` greedy new tokens each, generated tokens per second of the
  whole call;
* plain ``generate()``: one ``prompt``-token prompt and ``new`` greedy new
  tokens, new tokens per second (prefill included).

Interleaved rounds, the order rotating; a ratio is the median over rounds of
fastattn's tokens/s over sdpa's in the same round.  ``generate()`` takes
more rounds than ``generate_batch``: a call lasts about half a second and
its ratio lies within a few percent of 1 (attention is a tenth of a step),
so three rounds cannot tell which is faster; sdpa's ``generate_batch`` call
lasts about a minute and its ratio is several times 1.  A row whose fastattn
call fails (e.g. before fastattn's backend takes continuous batching) says
"not available" with the reason; missing torch or transformers is one line.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Models:
    """The sizes of the transformers rows."""
    llama: dict               # LlamaConfig's arguments
    requests: int
    prompts: tuple            # (shortest, longest) prompt of generate_batch
    batch_new: int
    page_size: int
    prompt: int               # generate()'s prompt
    new: int
    rounds: int = 3           # of generate_batch
    generate_rounds: int = 15


FULL = Models(llama=dict(vocab_size=1024, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=4096),
              requests=32, prompts=(256, 2048), batch_new=32, page_size=256, prompt=1024, new=64)
QUICK = Models(llama=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=512),
               requests=4, prompts=(16, 64), batch_new=4, page_size=16, prompt=64, new=4,
               rounds=1, generate_rounds=1)
IMPLS = ("sdpa", "fastattn")


def _model(torch, transformers, m: Models):
    cfg = transformers.LlamaConfig(**m.llama)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _prompts(m: Models) -> list[list[int]]:
    """generate_batch's prompts: lengths evenly spread over m.prompts."""
    import numpy as np
    rng = np.random.default_rng(5)
    lens = np.linspace(m.prompts[0], m.prompts[1], m.requests).astype(int)
    vocab = m.llama["vocab_size"]
    return [rng.integers(3, vocab, n).tolist() for n in lens]


def _batch_call(torch, transformers, model, m: Models, prompts):
    """impl -> a call of generate_batch -> generated tokens."""
    gen = transformers.GenerationConfig(max_new_tokens=m.batch_new, do_sample=False,
                                        pad_token_id=0, eos_token_id=-1)
    pages = sum(-(-(len(p) + m.batch_new) // m.page_size) for p in prompts)
    # sized explicitly: left alone, transformers sizes the cache from the free memory
    cb = dict(page_size=m.page_size, num_blocks=pages + len(prompts),
              max_batch_tokens=min(2048, m.prompts[1]), max_requests_per_batch=len(prompts))

    def run(impl):
        model.set_attn_implementation(impl)
        with torch.inference_mode():
            out = model.generate_batch(
                inputs=prompts, generation_config=gen, progress_bar=False,
                continuous_batching_config=transformers.ContinuousBatchingConfig(**cb))
        return sum(len(o.generated_tokens) for o in out.values())
    return run


def _generate_call(torch, model, m: Models):
    ids = torch.randint(3, m.llama["vocab_size"], (1, m.prompt),
                        generator=torch.Generator().manual_seed(1))

    def run(impl):
        model.set_attn_implementation(impl)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=m.new, min_new_tokens=m.new, do_sample=False,
                                 pad_token_id=0)
        return int(out.shape[1] - m.prompt)
    return run


def _rounds(run, impls, rounds: int) -> tuple[dict, dict]:
    """impl -> seconds per round, impl -> tokens of its last call."""
    times, toks = {i: [] for i in impls}, {}
    for r in range(rounds):
        for impl in impls[r % len(impls):] + impls[:r % len(impls)]:
            gc.collect()
            t0 = time.perf_counter()
            toks[impl] = run(impl)
            times[impl].append(time.perf_counter() - t0)
    return times, toks


def measure_case(case: str, run, t: int, rounds: int) -> dict:
    """One row: sdpa and fastattn on one call, or fastattn "not available"."""
    rec = {"case": case, "threads": t, "unit": "tokens/s"}
    try:
        run("sdpa")                                      # warm-up
    except Exception as e:  # noqa: BLE001 - e.g. a transformers without this API
        rec["not_available"] = f"sdpa: {type(e).__name__}: {e}"
        return rec
    try:
        run("fastattn")
        impls = IMPLS
    except Exception as e:  # noqa: BLE001 - the backend's limits are reported, not fatal
        rec["not_available"] = f"{type(e).__name__}: {e}"
        impls = ("sdpa",)
    times, toks = _rounds(run, impls, rounds)
    for impl in impls:
        rec[impl] = toks[impl] / statistics.median(times[impl])
        rec[f"{impl}_s"] = times[impl]
    if "fastattn" in times:
        r = [s / f for s, f in zip(times["sdpa"], times["fastattn"])]
        rec["fastattn/sdpa"] = {"ratio": statistics.median(r), "low": min(r), "high": max(r)}
    return rec


def run_models(threads, limits: dict, *, quick: bool = False, repeats: int | None = None,
               progress=None) -> dict:
    """The rows -> {"rows": [...]} or {"unavailable": reason}."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"unavailable": f"{e.name or 'torch'} is not installed "
                               "(pip install 'fastattn[torch]')"}
    m = QUICK if quick else FULL
    try:
        from fastattn.integrations.transformers import register
        register()
        model = _model(torch, transformers, m)
    except Exception as e:  # noqa: BLE001 - a transformers the backend does not take
        return {"unavailable": f"fastattn's transformers backend is not available with "
                               f"transformers {transformers.__version__} "
                               f"({type(e).__name__}: {e})"}
    prompts = _prompts(m)
    cases = ((f"generate_batch {m.requests} requests, prompts {m.prompts[0]}–{m.prompts[1]}, "
              f"+{m.batch_new}", _batch_call(torch, transformers, model, m, prompts), m.rounds),
             (f"generate() {m.prompt}+{m.new}", _generate_call(torch, model, m),
              m.generate_rounds))
    rows = []
    for t in threads:
        with limits[t]:
            for case, run, rounds in cases:
                if progress is not None:
                    progress.status(f"serving models: {case}, {t} thread(s)")
                rows.append(measure_case(case, run, t, repeats or rounds))
    return {"rows": rows}


def format_models(doc: dict) -> list[str]:
    """The transformers rows as markdown lines."""
    out = ["### Serving: a tiny Llama through transformers (tokens/s)", ""]
    if "unavailable" in doc:
        return out + [f"skipped: {doc['unavailable']}", ""]
    out += ["| case | thr | sdpa | fastattn | fastattn / sdpa (lowest–highest round) |",
            "|---|--:|--:|--:|--:|"]
    for r in doc["rows"]:
        if "not_available" in r:
            sdpa = f"{r['sdpa']:.1f}" if "sdpa" in r else "—"
            out.append(f"| {r['case']} | {r['threads']} | {sdpa} | not available: "
                       f"{r['not_available']} | — |")
            continue
        x = r["fastattn/sdpa"]
        out.append(f"| {r['case']} | {r['threads']} | {r['sdpa']:.1f} | {r['fastattn']:.1f} "
                   f"| {x['ratio']:.2f}× ({x['low']:.2f}–{x['high']:.2f}) |")
    return out + [""]
