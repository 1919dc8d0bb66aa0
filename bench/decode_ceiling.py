"""How far a paged decoding step is from its compute ceiling on this CPU.

    python bench/decode_ceiling.py [--rounds 9] [--threads 1]

The serving section's decode batch (64 sequences, contexts log-uniform in
128..8192, seed 0; Hq 32, Hkv 8, D 128; HND pools of bfloat16, float32 and
int8 with per-row scales; block sizes 16 and 128) is timed two ways in the
same rounds: with its block table over the whole pool, so that K and V come
from memory (the bench's case), and with every entry of the table on pool
block 0, so that the same work reads K and V from the caches (the arithmetic
and the kernels' own overheads alone).  The read probe runs in the same
rounds.  A call that reaches a large share of the probe only from the caches
is bound by its arithmetic; one far below its cache speed from memory is
bound by how its reads overlap its arithmetic.  Each time is the best of 3
calls; the table gives medians over the rounds (GB/s: lowest and highest).
"""
import argparse
import time

import numpy as np

import fastattn
from fastattn import _core


def _best(f, n=3):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def _tables(rng, lens, bs):
    nblk = [(int(n) + bs - 1) // bs for n in lens]
    tot = sum(nblk)
    perm = rng.permutation(tot).astype(np.int32)
    mem = np.zeros((len(lens), max(nblk)), np.int32)
    o = 0
    for b, n in enumerate(nblk):
        mem[b, :n] = perm[o:o + n]
        o += n
    return tot, mem, np.zeros_like(mem)


def _pools(rng, dtype, shape):
    if dtype == "int8":
        k = rng.integers(-127, 128, shape, dtype=np.int8)
        s = rng.uniform(0.001, 0.01, (shape[0], shape[2], shape[1])).astype(np.float32)
        return k, k.copy(), dict(key_scales=s, value_scales=s.copy())
    if dtype == "bfloat16":
        import ml_dtypes
        dt = ml_dtypes.bfloat16
    else:
        dt = np.dtype(dtype)
    k = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    return k, k.copy(), {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="bfloat16,float32,int8")
    ap.add_argument("--blocks", default="16,128")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    B, Hq, Hkv, D = 64, 32, 8, 128
    lens = np.exp(rng.uniform(np.log(128), np.log(8192), B)).astype(np.int64)
    q = rng.standard_normal((B, Hq, D), dtype=np.float32)
    out = np.empty((B, Hq, D), np.float32)
    probe = np.ones(512 * 2**20 // 8, np.uint64)
    print(f"isa {fastattn.get_isa()}, {args.threads} thread(s), {int(lens.sum())} cached tokens, "
          f"{args.rounds} rounds")
    print("| cache | block | from memory | GB/s | from the caches | GB/s | read probe GB/s "
          "| memory / probe | caches / probe |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for dtype in args.dtypes.split(","):
        for bs in map(int, args.blocks.split(",")):
            tot, mem, hot = _tables(rng, lens, bs)
            kc, vc, kw = _pools(rng, dtype, (tot, Hkv, bs, D))
            nbytes = int(lens.sum()) * Hkv * D * 2 * kc.itemsize

            def call(table, kc=kc, vc=vc, kw=kw):  # this iteration's pools, bound now
                fastattn.attention_paged(q, kc, vc, table, lens, layout="HND", out=out,
                                         num_threads=args.threads, **kw)
            tm, th, tp = [], [], []
            for _ in range(args.rounds):
                tm.append(_best(lambda: call(mem)))
                th.append(_best(lambda: call(hot)))
                tp.append(_best(lambda: _core.read_probe(probe, args.threads)))
            tm, th, tp = map(np.array, (tm, th, tp))
            gm, gh, gp = nbytes / tm / 1e9, nbytes / th / 1e9, probe.nbytes / tp / 1e9

            def gb(x):
                return f"{np.median(x):.1f} ({x.min():.1f}–{x.max():.1f})"
            print(f"| {dtype} | {bs} | {np.median(tm) * 1e3:.1f} ms | {gb(gm)} "
                  f"| {np.median(th) * 1e3:.1f} ms | {gb(gh)} | {gb(gp)} "
                  f"| {100 * np.median(gm / gp):.0f}% | {100 * np.median(gh / gp):.0f}% |",
                  flush=True)
            del kc, vc, kw


if __name__ == "__main__":
    main()
