"""A grouped call into an out= whose strides do not join a group's rows.

    python bench/gqa_out_layout.py [--rounds 15] [--threads 1,2]

With ``enable_gqa``, when every query row sees the same keys, a group's query
heads run folded, as the rows of one problem per key/value head
(fastattn/_gqa.py).  An ``out`` whose strides cannot be viewed as
``(..., Hkv, g * L, Ev)`` (a Fortran-order buffer; a ``(B, L, H, Ev)`` buffer
viewed head-first, for L > 1) is filled from a folded result; before, such
an ``out`` made the call run per head (one query row always joins: a
decoding step was never concerned).  This times both in the same process and
rounds (the per-head choice forced by replacing ``_gqa._run_folded``),
float32, Hq 32 over Hkv 8, non-causal, into a ``(B, L, H, Ev)`` buffer viewed
head-first (what the transformers backend passes): 4 rows against 4096 keys,
and two prefills.  Each time is the best of
3 calls; the table gives medians over the rounds and the median of the
per-round ratios (lowest-highest).
"""
import argparse
import timeit

import numpy as np

import fastattn
import fastattn._gqa as gqa

CASES = [  # B, Hq, Hkv, L, S, E
    (1, 32, 8, 4, 4096, 128),
    (1, 32, 8, 512, 512, 128),
    (1, 32, 8, 2048, 2048, 64),
]


def _best(f):
    """The best of 3 calls after one untimed."""
    f()
    return min(timeit.repeat(f, number=1, repeat=3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    fold = gqa._run_folded

    def per_head(*a):
        return False

    print("| B x Hq/Hkv x L x S x E | thr | folded | per head | per head / folded |")
    print("|---|--:|--:|--:|--:|")
    for B, H, hk, L, S, E in CASES:
        q = rng.standard_normal((B, H, L, E), dtype=np.float32)
        k = rng.standard_normal((B, hk, S, E), dtype=np.float32)
        v = rng.standard_normal((B, hk, S, E), dtype=np.float32)
        out = np.empty((B, L, H, E), np.float32).transpose(0, 2, 1, 3)
        for nt in (int(t) for t in args.threads.split(",")):
            def call(nt=nt):
                fastattn.attention(q, k, v, enable_gqa=True, out=out, num_threads=nt)
            new, old = [], []
            try:
                for _ in range(args.rounds):
                    new.append(_best(call))
                    gqa._run_folded = per_head
                    old.append(_best(call))
                    gqa._run_folded = fold
            finally:
                gqa._run_folded = fold
            r = np.array(old) / np.array(new)
            name = f"{B}x{H}/{hk}x{L}x{S}x{E}"
            print(f"| {name} | {nt} | {1e3 * np.median(new):.2f} ms | "
                  f"{1e3 * np.median(old):.2f} ms | {np.median(r):.2f}x "
                  f"({r.min():.2f}-{r.max():.2f}) |")


if __name__ == "__main__":
    main()
