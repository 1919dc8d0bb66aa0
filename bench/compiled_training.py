"""A compiled training step through transformers: fastattn against sdpa.

    python bench/compiled_training.py [--rounds 5] [--threads 1] [--batch 1] [--seq 4096]
                                      [--backend inductor] [--window W]

A random-weight Llama (hidden 256, 4 heads of 64, 2 kv heads, 2 layers,
intermediate 1024, float32, plain causal; with ``--window W`` a Mistral of
the same sizes, every layer with a sliding window of W) in ``model.train()``
takes one forward and backward on ``batch`` rows of ``seq`` tokens (with more
than one row, the second left-padded by a quarter). Three ways, the same
weights, interleaved in each round: ``sdpa`` and ``fastattn`` under
``torch.compile``, and ``fastattn`` eager. Each time is the best of 2 steps; the table gives the
median step time over the rounds and the median of the per-round ratios of
compiled sdpa's time to each way's (lowest and highest round). The fastattn
imported is the one on ``sys.path`` (its path is printed), so two builds can
be compared from their checkouts.
"""
import argparse
import copy
import time

import numpy as np
import torch
import transformers

import fastattn
from fastattn.integrations import transformers as fa_tf


def _step(way, batch):
    model, run = way
    model.zero_grad()
    t0 = time.perf_counter()
    loss = run(**batch).loss
    loss.backward()
    return time.perf_counter() - t0, loss.item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--window", type=int, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    fa_tf.register(num_threads=args.threads)
    sizes = dict(vocab_size=1000, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                 attention_dropout=0.0)
    torch.manual_seed(0)
    if args.window is None:
        base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)).train()
    else:
        cfg = transformers.MistralConfig(sliding_window=args.window, head_dim=64, **sizes)
        base = transformers.MistralForCausalLM(cfg).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (args.batch, args.seq), generator=g)
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    if args.batch > 1:
        mask[1, :args.seq // 4] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids, "use_cache": False}
    ways = {}
    for name, impl, compiled in (("sdpa, compiled", "sdpa", True),
                                 ("fastattn, compiled", fa_tf.NAME, True),
                                 ("fastattn, eager", fa_tf.NAME, False)):
        m = copy.deepcopy(base)
        m.set_attn_implementation(impl)
        ways[name] = (m, torch.compile(m, backend=args.backend) if compiled else m)
    losses = {name: _step(way, batch)[1] for name, way in ways.items()}  # compiles
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            times[name].append(min(_step(way, batch)[0] for _ in range(2)))
    print(f"fastattn from {fastattn.__file__}")
    print(f"{args.batch} x {args.seq} tokens"
          + (f", sliding window {args.window}" if args.window else "")
          + f", {args.threads} thread(s), torch.compile "
          f"{args.backend}, {args.rounds} rounds; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; losses: "
          + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
    print("| way | step | compiled sdpa's time / this way's (lowest–highest round) |")
    print("|---|--:|--:|")
    ref = np.array(times["sdpa, compiled"])
    for name, ts in times.items():
        r = ref / np.array(ts)
        print(f"| {name} | {np.median(ts) * 1e3:.1f} ms | {np.median(r):.2f}× "
              f"({r.min():.2f}–{r.max():.2f}) |")


if __name__ == "__main__":
    main()
