"""attention_varlen and its backward on batches of packed documents.

    python bench/varlen_timing.py [--rounds 7] [--json FILE] [--batch NAME]

Float32, causal; per batch (seed 0; BATCHES below) and thread count (1, 2):
the median of ``--rounds`` calls of the forward (``return_lse=True``) and of
the backward (``grad_out = out``).
To compare two builds, run it alternately from each build's checkout (the
fastattn imported is the one on ``sys.path``; this prints its path) and take
the per-alternation ratios of the ``--json`` files (bench/README.md,
"Packed sequences in one C call").
"""
import argparse
import json
import time

import numpy as np

import fastattn

# name: (documents, shortest, longest, query heads, key/value heads, dims);
# lengths uniform in [shortest, longest], or log-uniform for the decoding
# batch, whose documents have one query row each (is_causal="lower_right")
BATCHES = {
    "64 x 32": (64, 32, 32, 8, 8, 64),
    "16 x 128": (16, 128, 128, 8, 8, 64),
    "256 of 32-96": (256, 32, 96, 8, 8, 64),
    "64 of 128-384": (64, 128, 384, 8, 8, 64),
    "1024 of 8-24": (1024, 8, 24, 8, 8, 64),
    "256 of 32-96, 2 heads": (256, 32, 96, 2, 2, 64),
    "16 of 64-2048": (16, 64, 2048, 8, 8, 64),
    "64 decodes of 128-8192 keys, 32/8 heads of 128": (64, 128, 8192, 32, 8, 128),
    "16 of 64-1024, 32/8 heads of 128": (16, 64, 1024, 32, 8, 128),
}


def _time(batch, threads, rounds):
    n, lo, hi, hq, hkv, dim = BATCHES[batch]
    rng = np.random.default_rng(0)
    decode = "decodes" in batch
    lens = (np.exp(rng.uniform(np.log(lo), np.log(hi), n)).astype(np.int64) if decode
            else rng.integers(lo, hi + 1, n))
    ck = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    cq = np.arange(n + 1, dtype=np.int64) if decode else ck
    q = rng.standard_normal((int(cq[-1]), hq, dim), dtype=np.float32)
    k, v = (rng.standard_normal((int(ck[-1]), hkv, dim), dtype=np.float32) for _ in "kv")
    causal = "lower_right" if decode else True
    fwd, bwd = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out, lse = fastattn.attention_varlen(q, k, v, cq, ck, is_causal=causal, return_lse=True,
                                             num_threads=threads)
        t1 = time.perf_counter()
        fastattn.attention_varlen_backward(out, q, k, v, out, lse, cq, ck, is_causal=causal,
                                           num_threads=threads)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    return float(np.median(fwd)) * 1e3, float(np.median(bwd)) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="also write {batch|threads: [forward ms, backward ms]}")
    ap.add_argument("--batch", default="", help="only the batches whose name contains this")
    args = ap.parse_args(argv)
    print(f"fastattn from {fastattn.__file__}")
    print("| batch | thr | forward | backward |\n|---|--:|--:|--:|")
    res = {}
    for batch in (name for name in BATCHES if args.batch in name):
        for threads in (1, 2):
            f, b = res[f"{batch}|{threads}"] = _time(batch, threads, args.rounds)
            print(f"| {batch} | {threads} | {f:.2f} ms | {b:.2f} ms |", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh)


if __name__ == "__main__":
    main()
