"""Training steps on packed rows through transformers: fastattn against sdpa.

    python bench/packed_training.py [--rounds 9] [--threads 1] [--docs 16] [--doc-len 128]
                                    [--compile [BACKEND] [--positions-only]]

A random-weight Llama (hidden 256, 4 heads of 64, 2 kv heads, 2 layers,
intermediate 1024, float32) in ``model.train()`` takes one forward, backward
and SGD step on a row of ``docs`` documents of ``doc_len`` tokens packed one
after another (``position_ids`` restarting at each, ``use_cache=False``, so
transformers builds its packed (L, L) mask). Three ways, the same weights and
row, interleaved in each round: ``sdpa`` (torch's SDPA over that mask),
``fastattn`` (the backend runs attention_varlen over the documents) and
``fastattn, mask`` (the backend forced to read the mask, as before the
packed path). Each time is the best of 3 steps; the table gives the median
step time over the rounds and the median of the per-round ratios (lowest and
highest round). The weights are reset before every step so each way trains
the same model.

``--compile`` (``inductor`` unless a torch.compile backend is named) runs the
three ways as ``torch.compile``-d models given the row as a flattening collator
gives it (``cu_seq_lens_q`` / ``cu_seq_lens_k`` too): there ``fastattn`` is
the operator ``fastattn::packed_rows`` (transformers_packed.py), which runs
the documents alone when it finds the mask to be their pattern; ``fastattn,
mask`` is the compiled mask path it replaced.  ``--positions-only`` gives the
row as the collator does by default (``position_ids`` alone: the operator
finds the documents from them when it runs).
"""
import argparse
import copy
import time

import numpy as np
import torch
import transformers

from fastattn.integrations import transformers as fa_tf


def _model():
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=1024,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=4096,
                                   attention_dropout=0.0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).train()


def _step(way, batch, state):
    model, run = way  # the module, and what runs it (the module or its compiled form)
    model.load_state_dict(state)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = run(**batch).loss
    loss.backward()
    opt.step()
    return time.perf_counter() - t0, loss.item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--doc-len", type=int, default=128)
    ap.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND")
    ap.add_argument("--positions-only", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    fa_tf.register(num_threads=args.threads)
    base = _model()
    state = copy.deepcopy(base.state_dict())
    ways = {}
    for name, impl in (("sdpa", "sdpa"), ("fastattn", fa_tf.NAME), ("fastattn, mask", fa_tf.NAME)):
        m = copy.deepcopy(base)
        m.set_attn_implementation(impl)
        ways[name] = (m, m if args.compile is None else torch.compile(m, backend=args.compile))
    n = args.docs * args.doc_len
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (1, n), generator=g)
    pos = torch.arange(args.doc_len).repeat(args.docs)[None]
    batch = {"input_ids": ids, "position_ids": pos, "labels": ids, "use_cache": False}
    if args.compile is not None and not args.positions_only:
        cu = torch.arange(0, n + 1, args.doc_len, dtype=torch.int32)
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=args.doc_len,
                     max_length_k=args.doc_len)
    packed_rows, traced_rows = fa_tf._packed_rows, fa_tf._traced_rows

    def run(name):
        if name == "fastattn, mask":
            fa_tf._packed_rows, fa_tf._traced_rows = (lambda *a: None), (lambda *a: False)
        try:
            return min(_step(ways[name], batch, state) for _ in range(3))
        finally:
            fa_tf._packed_rows, fa_tf._traced_rows = packed_rows, traced_rows

    times = {name: [] for name in ways}
    losses = {}
    for _ in range(args.rounds):
        for name in ways:
            t, loss = run(name)
            times[name].append(t)
            losses[name] = loss
    print(f"row of {args.docs} documents x {args.doc_len} tokens ({n}), {args.threads} "
          f"thread(s), {'torch.compile ' + args.compile + ', ' if args.compile else ''}"
          f"{'position_ids only, ' if args.positions_only else ''}"
          f"{args.rounds} rounds; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; losses: "
          + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
    print("| way | step | sdpa's time / this way's (lowest–highest round) |")
    print("|---|--:|--:|")
    for name, ts in times.items():
        r = np.array(times["sdpa"]) / np.array(ts)
        print(f"| {name} | {np.median(ts) * 1e3:.1f} ms | {np.median(r):.2f}× "
              f"({r.min():.2f}–{r.max():.2f}) |")


if __name__ == "__main__":
    main()
