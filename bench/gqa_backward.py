"""The grouped-query backward against the same problem with K, V repeated per
query head, and against torch.

    python bench/gqa_backward.py [--rounds 9] [--threads 1,2] [--json FILE]
    python bench/gqa_backward.py --peak 4096

Causal, per shape (SHAPES below: batch, query heads, key/value heads, L, D),
dtype and thread count, each round in one process: fastattn's
``attention_backward(..., enable_gqa=True)``; the same call on K, V repeated
to one head per query head (the same products, with no sum over the group:
what the grouped call costs beyond the products); with torch installed,
torch SDPA's forward + backward with ``enable_gqa=True`` next to fastattn's
forward + backward.  Printed: medians of the per-round ratios, with their
lowest and highest round.  The fastattn imported is the one on ``sys.path``
(its path is printed), so two builds can be compared from their checkouts.

``--peak L``: one grouped backward at (1, 32 query heads, 8 key/value heads,
L, 128), float32, causal, the process's first (its memory fresh, as a
training step's gradients are): its time, and the peak of NumPy's
allocations during it (tracemalloc) beside the gradients' own bytes.
"""
import argparse
import json
import time

import ml_dtypes
import numpy as np

import fastattn

SHAPES = [(1, 32, 8, 1024, 64), (1, 16, 4, 2048, 64), (4, 8, 2, 512, 128)]
DTYPES = ["float32", "bfloat16"]


def _inputs(shape, dtype, rng):
    b, hq, hkv, n, d = shape
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q = rng.standard_normal((b, hq, n, d), dtype=np.float32).astype(dt)
    k, v = (rng.standard_normal((b, hkv, n, d), dtype=np.float32).astype(dt) for _ in "kv")
    return q, k, v, rng.standard_normal((b, hq, n, d), dtype=np.float32).astype(dt)


def _clock(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _torch_fwd_bwd(torch, q, k, v, do, threads):
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(
        torch.bfloat16 if x.dtype.itemsize == 2 else torch.float32).requires_grad_()
        for x in (q, k, v))
    tdo = torch.from_numpy(do.astype(np.float32)).to(tq.dtype)

    def run():
        torch.set_num_threads(threads)
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                               enable_gqa=True)
        out.backward(tdo)
        tq.grad = tk.grad = tv.grad = None
    return run


def _measure(shape, dtype, threads, rounds, torch):
    rng = np.random.default_rng(0)
    q, k, v, do = _inputs(shape, dtype, rng)
    g = shape[1] // shape[2]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    out, lse = fastattn.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True,
                                  num_threads=threads)
    kw = dict(is_causal=True, num_threads=threads)

    def grouped():
        fastattn.attention_backward(do, q, k, v, out, lse, enable_gqa=True, **kw)

    def repeated():
        fastattn.attention_backward(do, q, kr, vr, out, lse, **kw)

    def fwd_bwd():
        o, s = fastattn.attention(q, k, v, enable_gqa=True, return_lse=True, **kw)
        fastattn.attention_backward(do, q, k, v, o, s, enable_gqa=True, **kw)

    tfb = None if torch is None else _torch_fwd_bwd(torch, q, k, v, do, threads)
    rows = {"grouped": [], "repeated": [], "fwd_bwd": [], "torch": []}
    for fn in (grouped, repeated, fwd_bwd) + ((tfb,) if tfb else ()):
        fn()  # warm
    for _ in range(rounds):
        rows["grouped"].append(_clock(grouped))
        rows["repeated"].append(_clock(repeated))
        rows["fwd_bwd"].append(_clock(fwd_bwd))
        if tfb:
            rows["torch"].append(_clock(tfb))
    med = {k: float(np.median(x)) * 1e3 for k, x in rows.items() if x}
    over = np.array(rows["grouped"]) / np.array(rows["repeated"])
    res = {"shape": shape, "dtype": dtype, "threads": threads, "ms": med,
           "grouped/repeated": [float(np.median(over)), float(over.min()), float(over.max())]}
    if tfb:
        sp = np.array(rows["torch"]) / np.array(rows["fwd_bwd"])
        res["torch/fastattn fwd+bwd"] = [float(np.median(sp)), float(sp.min()), float(sp.max())]
    return res


def _peak(n):
    import tracemalloc
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, n, 128), dtype=np.float32)
    k, v = (rng.standard_normal((1, 8, n, 128), dtype=np.float32) for _ in "kv")
    out, lse = fastattn.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True)
    tracemalloc.start()
    t0 = time.perf_counter()
    grads = fastattn.attention_backward(out, q, k, v, out, lse, is_causal=True, enable_gqa=True)
    t = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    print(f"(1, 32, 8, {n}, 128) float32 causal, first call: backward {t * 1e3:.0f} ms, NumPy's "
          f"peak {peak / 2 ** 20:.1f} MiB, the gradients "
          f"{sum(g.nbytes for g in grads) / 2 ** 20:.1f} MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--peak", type=int, metavar="L")
    args = ap.parse_args()
    if args.peak:
        print("fastattn from", fastattn.__file__)
        return _peak(args.peak)
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch is not installed: its column is left out")
    print("fastattn from", fastattn.__file__)
    results = []
    for shape in SHAPES:
        for dtype in DTYPES:
            for t in (int(x) for x in args.threads.split(",")):
                r = _measure(shape, dtype, t, args.rounds, torch)
                results.append(r)
                ms, ratio = r["ms"], r["grouped/repeated"]
                line = (f"{shape} {dtype:8} {t} thr: grouped bwd {ms['grouped']:8.2f} ms, "
                        f"repeated {ms['repeated']:8.2f} ms, grouped/repeated {ratio[0]:.3f} "
                        f"[{ratio[1]:.3f}, {ratio[2]:.3f}]")
                if "torch" in ms:
                    tr = r["torch/fastattn fwd+bwd"]
                    line += (f"; fwd+bwd {ms['fwd_bwd']:8.2f} ms, torch {ms['torch']:8.2f} ms, "
                             f"{tr[0]:.2f}x [{tr[1]:.2f}, {tr[2]:.2f}]")
                print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
