#!/usr/bin/env python
"""attention_varlen against padding to the longest sequence.

16 causal sequences, lengths spread over 64..2048, H=8, D=64, float32:
``fastattn.attention_varlen`` on the packed batch (each sequence its own
length) against one ``fastattn.attention`` call on the batch padded to the
longest sequence, padding hidden by ``key_padding_mask``.  Both are timed in
this one process; the medians are printed.

    python bench/varlen.py [--threads 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fastattn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    H, D, n = 8, 64, 16
    lengths = np.linspace(64, 2048, n).astype(int)
    rng = np.random.default_rng(0).permutation(lengths)
    cu = np.concatenate([[0], np.cumsum(rng)]).astype(np.int32)
    total, longest = int(cu[-1]), int(lengths.max())
    gen = np.random.default_rng(1)
    q, k, v = (gen.standard_normal((total, H, D)).astype(np.float32) for _ in range(3))

    # The padded batch: (n, H, longest, D), keys past each length hidden.
    def pad(x):
        p = np.zeros((n, H, longest, D), np.float32)
        for b in range(n):
            p[b, :, :cu[b + 1] - cu[b]] = np.moveaxis(x[cu[b]:cu[b + 1]], 1, 0)
        return p
    qp, kp, vp = pad(q), pad(k), pad(v)
    kpm = np.arange(longest)[None, :] >= np.diff(cu)[:, None]      # True = padding

    def varlen():
        return fastattn.attention_varlen(q, k, v, cu, cu, is_causal=True,
                                         num_threads=args.threads)

    def padded():
        return fastattn.attention(qp, kp, vp, is_causal=True, key_padding_mask=kpm,
                                  num_threads=args.threads)

    a, b = varlen(), padded()
    for i in range(n):       # the same numbers, on the real rows
        np.testing.assert_allclose(np.moveaxis(a[cu[i]:cu[i + 1]], 1, 0),
                               b[i, :, :cu[i + 1] - cu[i]], rtol=1e-4, atol=1e-5)
    times = {"varlen": [], "padded": []}
    for _ in range(args.repeats):
        for name, f in (("varlen", varlen), ("padded", padded)):
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    tv, tp = statistics.median(times["varlen"]), statistics.median(times["padded"])
    print(f"{n} causal sequences of {lengths.min()}..{longest} tokens (total {total}), "
          f"H={H}, D={D}, float32, {args.threads} threads, medians of {args.repeats}:")
    print(f"  attention_varlen            {tv * 1e3:8.1f} ms")
    print(f"  padded + key_padding_mask   {tp * 1e3:8.1f} ms")
    print(f"  speed-up                    {tp / tv:8.2f}x")


if __name__ == "__main__":
    main()
