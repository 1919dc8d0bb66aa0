"""Training with a learned attention bias (T5's relative position bias):
forward + backward with the bias's gradient, fastattn against torch.

    python bench/learned_bias_backward.py [--rounds 9] [--threads 1,2]
                                          [--dtypes float32,bfloat16] [--json FILE]
    python bench/learned_bias_backward.py --peak

Per shape (SHAPES below: batch, heads, L = S, D, and the bias's shape), dtype
(the inputs' and the bias's), each round in one process, every
implementation at every thread count:
fastattn's ``attention(..., return_lse=True)`` then ``attention_backward(...,
return_mask_grad=True)``; torch SDPA's forward + backward with the bias as an
``attn_mask`` that requires grad (torch's own choice of kernel: its backward
node is printed); and the eager formula T5's ``eager`` backend runs (scores,
bias, softmax, weights times values, under autograd).  Printed: each one's
median time, and the medians of the per-round ratios of the peers' time over
fastattn's, with their lowest and highest round.  The gradients are compared
with torch SDPA's once (largest difference over the largest gradient).  The
fastattn imported is the one on ``sys.path`` (its path is printed).

``--peak``: each implementation's first call at each shape (float32, 2
threads) in a fresh subprocess: the growth of its peak resident memory
(VmHWM, reset just before the call) over its resident memory before it,
beside the gradients' own bytes.
"""
import argparse
import json
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

import fastattn

# (batch, heads, L = S, D, the bias's shape): a T5-style bias shared by the
# batch, and one bias per head at a longer sequence
SHAPES = [(4, 8, 512, 64, (1, 8, 512, 512)), (1, 8, 1024, 64, (8, 1024, 1024)),
          (16, 8, 512, 64, (1, 8, 512, 512))]


def _clock(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _impls(torch, shape, dtype, threads):
    b, h, n, d, bshape = shape
    rng = np.random.default_rng(0)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q, k, v, do = (rng.standard_normal((b, h, n, d), dtype=np.float32).astype(dt)
                   for _ in range(4))
    bias = rng.standard_normal(bshape, dtype=np.float32).astype(dt)

    def fastattn_run():
        out, lse = fastattn.attention(q, k, v, bias, return_lse=True, num_threads=threads)
        return fastattn.attention_backward(do, q, k, v, out, lse, bias, num_threads=threads,
                                           return_mask_grad=True)

    impls = {"fastattn": fastattn_run}
    if torch is None:
        return impls, None
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32

    def tensor(x):
        return torch.from_numpy(x.astype(np.float32)).to(tdt)

    tq, tk, tv = (tensor(x).requires_grad_() for x in (q, k, v))
    tb = tensor(bias).requires_grad_()
    tdo = tensor(do)
    F = torch.nn.functional
    node = []

    def torch_sdpa():
        torch.set_num_threads(threads)
        out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb)
        node[:] = [type(out.grad_fn).__name__]
        out.backward(tdo)
        grads = (tq.grad, tk.grad, tv.grad, tb.grad)
        tq.grad = tk.grad = tv.grad = tb.grad = None
        return grads

    def eager():
        torch.set_num_threads(threads)
        w = torch.softmax(tq @ tk.transpose(-1, -2) * d ** -0.5 + tb, dim=-1)
        (w @ tv).backward(tdo)
        tq.grad = tk.grad = tv.grad = tb.grad = None

    impls.update({"torch_sdpa": torch_sdpa, "eager": eager})
    return impls, node


def _max_rel(got, want):
    pairs = [(np.asarray(a, np.float64), b.double().numpy()) for a, b in zip(got, want)]
    return max(float(np.max(np.abs(a - b))) / max(float(np.abs(b).max()), 1e-30)
               for a, b in pairs)


def _measure(torch, shape, dtype, threads, rounds):
    """One shape, dtype and thread count -> (its JSON row, its printed line)."""
    impls, node = _impls(torch, shape, dtype, threads)
    for fn in impls.values():  # warm up: first-touch faults, torch's graphs
        fn()
    diff = _max_rel(impls["fastattn"](), impls["torch_sdpa"]()) if torch else None
    times = {n: [] for n in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            times[name].append(_clock(fn))
    fa = np.array(times["fastattn"])
    row = {"shape": shape[:4], "bias": shape[4], "dtype": dtype, "threads": threads,
           "median_s": {n: float(np.median(t)) for n, t in times.items()},
           "torch_node": node[0] if node else None, "grad_rel_diff": diff}
    line = (f"{shape[:4]} {dtype} bias {shape[4]} {threads}t: fastattn "
            f"{row['median_s']['fastattn'] * 1e3:.1f} ms")
    for name in ("torch_sdpa", "eager"):
        if name in times:
            r = np.array(times[name]) / fa
            row[f"{name}_over_fastattn"] = [float(np.median(r)), float(r.min()), float(r.max())]
            line += (f", {name} {row['median_s'][name] * 1e3:.1f} ms "
                     f"{np.median(r):.2f}x ({r.min():.2f}-{r.max():.2f})")
    if node:
        line += f"; torch's backward {node[0]}, grads differ by {diff:.1e}"
    return row, line


def _status_mib(field):
    with open("/proc/self/status") as f:
        return int(f.read().split(field + ":")[1].split()[0]) / 1024


def _one_peak(torch, shape_index, name):
    """In this (fresh) process: one call of ``name`` -> the growth of the
    peak resident memory during it over the resident memory before it."""
    impls, _ = _impls(torch, SHAPES[shape_index], "float32", 2)
    before = _status_mib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    impls[name]()
    print(json.dumps({"peak_growth_mib": _status_mib("VmHWM") - before}))


def _peaks(torch):
    """Every implementation's peak growth at every shape, each in a fresh
    subprocess."""
    for i, (b, h, n, d, bshape) in enumerate(SHAPES):
        grads = (3 * b * h * n * d + int(np.prod(bshape))) * 4 / 2 ** 20
        line = f"{(b, h, n, d)} bias {bshape} float32 2t, gradients {grads:.0f} MiB: peak growth"
        for name in ("fastattn",) + (("torch_sdpa", "eager") if torch else ()):
            r = subprocess.run([sys.executable, __file__, "--one-peak", f"{i},{name}"],
                               capture_output=True, text=True, check=True)
            line += f", {name} {json.loads(r.stdout.splitlines()[-1])['peak_growth_mib']:.0f} MiB"
        print(line, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--json", default=None)
    p.add_argument("--peak", action="store_true")
    p.add_argument("--one-peak", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    if a.one_peak:
        i, name = a.one_peak.split(",")
        _one_peak(torch, int(i), name)
        return
    print(f"fastattn {fastattn.__file__} isa {fastattn.get_isa()}; torch "
          f"{torch.__version__ if torch else 'not installed'}")
    if a.peak:
        _peaks(torch)
        return
    rows = []
    for shape in SHAPES:
        for dtype in a.dtypes.split(","):
            for threads in map(int, a.threads.split(",")):
                row, line = _measure(torch, shape, dtype, threads, a.rounds)
                print(line, flush=True)
                rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"isa": fastattn.get_isa(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
