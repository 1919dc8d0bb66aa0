"""attention_varlen on 2 threads while another process keeps a core busy.

    python -c "while True: pass" &                  # the competing process, first
    python bench/varlen_under_load.py CHECKOUT      # a checkout with its extension built

Run it alternately for two builds (the fastattn imported is CHECKOUT's). Per
batch (float32, causal, 8 heads of 64): the median, 90th percentile, maximum
and mean of 60 calls, in ms, as JSON (bench/README.md, "Packed sequences in
one C call").
"""
import json
import sys
import time

import numpy as np

BATCHES = {"64 x 32": (64, 32), "16 x 128": (16, 128)}


def main():
    path = sys.argv[1]
    sys.path.insert(0, path)
    import fastattn
    assert fastattn.__file__.startswith(path), fastattn.__file__
    rng = np.random.default_rng(0)
    res = {}
    for name, (n, L) in BATCHES.items():
        cu = np.arange(0, n * L + 1, L, dtype=np.int64)
        q, k, v = (rng.standard_normal((n * L, 8, 64), dtype=np.float32) for _ in "qkv")
        ts = []
        for _ in range(60):
            t0 = time.perf_counter()
            fastattn.attention_varlen(q, k, v, cu, cu, is_causal=True, num_threads=2)
            ts.append(time.perf_counter() - t0)
        res[name] = [float(x) * 1e3 for x in (np.median(ts), np.percentile(ts, 90), np.max(ts),
                                              np.mean(ts))]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
