"""A grouped-query decoding step against torch SDPA, in one process.

    python bench/decode_gqa.py [ROUNDS]     # needs torch

One query row of 32 heads over a 4096-key bfloat16 cache of 8 KV heads
(enable_gqa, D 128: 16 MiB of K and V) and of 32 KV heads (no grouping), one
thread each; fastattn and torch alternate in every round, and the ratio is
the median over the rounds of torch's time / fastattn's, with its quartiles.
The bench CLI's decode section times the grouped step too (kv_heads=8, every
cache dtype); this script puts it beside the ungrouped one in one process.
"""
import statistics
import sys
import time

import numpy as np
import torch

import fastattn
from fastattn import _half

torch.set_num_threads(1)
BF16 = _half.bfloat16()
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
rng = np.random.default_rng(0)
print("fastattn ISA path:", fastattn.get_isa(), "| torch", torch.__version__)
for hkv in (8, 32):
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32).astype(BF16)
    k, v = (rng.standard_normal((1, hkv, 4096, 128), dtype=np.float32).astype(BF16)
            for _ in range(2))
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v))

    def ours():
        return fastattn.attention(q, k, v, enable_gqa=True, num_threads=1)

    def theirs():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

    ours(), theirs()
    a, b, r = [], [], []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        ours()
        t1 = time.perf_counter()
        theirs()
        t2 = time.perf_counter()
        a.append(t1 - t0), b.append(t2 - t1), r.append((t2 - t1) / (t1 - t0))
    r.sort()
    print(f"32 query heads, {hkv} KV heads: fastattn {statistics.median(a) * 1e3:.3f} ms, "
          f"torch {statistics.median(b) * 1e3:.3f} ms, vs torch {statistics.median(r):.2f}x "
          f"[{r[len(r) // 4]:.2f}, {r[3 * len(r) // 4]:.2f}]")
