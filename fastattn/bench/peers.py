"""The peers fastattn is timed against, and what each run can use: the
one-time discovery of the optional modules (torch, SciPy, threadpoolctl,
matplotlib), the torch and NumPy/SciPy implementations of a case, and the
check of fastattn's output against a peer's."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .cases import (HALF_DTYPES, VARLEN_VARIANTS, Case, make_inputs, variant_has_peers,
                    variant_kwargs, variant_visible, varlen_inputs)

PEERS = ("torch", "numpy")


@dataclass
class Tools:
    """The optional peers and tools of one run, each looked for once.

    Attributes
    ----------
    torch, threadpoolctl, matplotlib, scipy : module or None
        The module, or None where it is not used in this run (not installed,
        broken, or not asked for).
    missing : dict
        name -> ``(kind, reason, effect)`` for each one that is absent, e.g.
        ``("peer", "not installed", "its columns are left out")``; the
        report's header gives one line per entry.
    """
    torch: object = None
    threadpoolctl: object = None
    matplotlib: object = None
    scipy: object = None
    missing: dict = dataclasses.field(default_factory=dict)


def _try_import(name: str, *submodules: str):
    """-> (module or None, why it is absent or None)."""
    import importlib
    try:
        mod = importlib.import_module(name)
        for sub in submodules:
            importlib.import_module(f"{name}.{sub}")
        return mod, None
    except ImportError as e:
        if getattr(e, "name", None) == name:
            return None, "not installed"
        return None, f"could not be imported ({type(e).__name__}: {e})"
    except Exception as e:  # noqa: BLE001 - a broken install: report, don't die
        return None, f"could not be imported ({type(e).__name__}: {e})"


def discover_tools(peers) -> Tools:
    """Look for each optional peer and tool once (``peers``: the requested
    peers; torch is only imported when asked for)."""
    tools = Tools()
    if "torch" in peers:
        tools.torch, why = _try_import("torch", "nn.functional")
        if why:
            tools.missing["torch"] = ("peer", why, "its columns are left out")
    tools.scipy, why = _try_import("scipy", "special")
    if why and "numpy" in peers:
        tools.missing["scipy"] = ("peer", why, "the numpy peer (the NumPy/SciPy "
                                  "composition) is left out")
    tools.threadpoolctl, why = _try_import("threadpoolctl")
    if why:
        tools.missing["threadpoolctl"] = ("tool", why, "BLAS/OpenMP thread pools are NOT "
                                          "limited (pip install 'fastattn[bench]')")
    tools.matplotlib, why = _try_import("matplotlib")
    if why:
        tools.missing["matplotlib"] = ("tool", why, "--plot is unavailable "
                                       "(pip install 'fastattn[plot]')")
    return tools


def available_peers(peers, tools: Tools) -> tuple:
    """The requested ``peers`` this run can time."""
    need = {"torch": tools.torch, "numpy": tools.scipy}
    return tuple(p for p in peers if need[p] is not None)

NUMPY_MAX_BYTES_DEFAULT = 2 * 1024 ** 3


def numpy_composition(softmax, q, k, v, scale, mask):
    """The plain NumPy/SciPy composition (the 'numpy' peer); ``softmax`` is
    ``scipy.special.softmax``."""
    s = q @ k.swapaxes(-1, -2)
    s *= scale
    if mask is not None:
        s += mask
    p = softmax(s, axis=-1)
    return p @ v


def numpy_peak_bytes(case: Case) -> int:
    """Rough peak of the NumPy composition: the score matrix, its softmax
    and SciPy's temporaries (about three L x S matrices per head)."""
    B, H, L, S, D = case.shape
    return 3 * B * H * L * S * np.dtype(case.dtype).itemsize



def _softmax_impls(case: Case, fa, tools: Tools, peers) -> tuple[dict, dict, tuple]:
    """-> (fastattn variant -> (t -> callable), peer -> callable, variants)."""
    x = make_inputs(case)
    x_inplace = x.copy()
    # (softmax takes its thread count from the OpenMP limit around the sample)
    soft = lambda: fa.softmax(x, axis=-1)  # noqa: E731
    soft_inplace = lambda: fa.softmax(x_inplace, axis=-1, out=x_inplace)  # noqa: E731
    fast = {"fastattn": lambda t: soft, "fastattn_inplace": lambda t: soft_inplace}
    peer_fns = {}
    if "torch" in peers:
        torch = tools.torch
        tx = torch.from_numpy(x)
        peer_fns["torch"] = lambda: torch.softmax(tx, dim=-1)
    if "numpy" in peers:
        sp_softmax = tools.scipy.special.softmax
        peer_fns["numpy"] = lambda: sp_softmax(x, axis=-1)
    return fast, peer_fns, ("fastattn", "fastattn_inplace")


def _numpy_attention(case: Case, q, k, v, softmax):
    """The numpy peer's call for an attention case (mask built once, here);
    16-bit inputs are widened to float32 in the call (NumPy's BLAS has no
    16-bit matmul) and the result rounded back."""
    half = case.dtype in HALF_DTYPES
    dt = np.dtype("float32" if half else case.dtype)
    scale = dt.type(1.0 / math.sqrt(case.shape[-1]))
    mask = None
    L, S = case.shape[2], case.shape[3]
    if case.variant:
        mask = np.where(variant_visible(case.variant, L, S), dt.type(0), dt.type(-np.inf))
    elif case.causal:
        mask = np.triu(np.full((L, S), -np.inf, dtype=dt), k=1)
    if case.kv_heads:  # NumPy has no grouping: each K/V head repeated for its query heads
        k, v = (np.repeat(x, case.shape[1] // case.kv_heads, axis=1) for x in (k, v))
    if half:
        return lambda: numpy_composition(softmax, q.astype(dt), k.astype(dt), v.astype(dt),
                                         scale, mask).astype(q.dtype)
    return lambda: numpy_composition(softmax, q, k, v, scale, mask)


INT8_CACHE = "fastattn_int8cache"  # the decode section's variant: an int8 KV cache


def int8_cache(fa, k, v):
    """k, v (B, H, S, D) in a full int8 KVCache (decode: the query attends to
    all of it, lower-right aligned, which for one query is no mask at all)."""
    B, H, S, D = k.shape
    cache = fa.KVCache(B, H, D, S, dtype="int8", value_dim=v.shape[-1])
    cache.append(k, v)
    return cache


def _varlen_impls(case: Case, fa) -> dict:
    """The varlen case: attention_varlen on the packed sequences ("fastattn")
    and one causal call on them padded, with a key_padding_mask
    ("fastattn_padded"), each on t threads."""
    (q, k, v), cu, (pq, pk, pv), pad = varlen_inputs(case)
    return {"fastattn": lambda t: (lambda: fa.attention_varlen(
                q, k, v, cu, cu, is_causal=True, num_threads=t)),
            "fastattn_padded": lambda t: (lambda: fa.attention(
                pq, pk, pv, is_causal=True, key_padding_mask=pad, num_threads=t))}


def _attention_impls(case: Case, fa, tools: Tools, peers,
                     numpy_max_bytes) -> tuple[dict, dict, dict]:
    """-> (fastattn -> (t -> callable), peer -> callable, skipped: peer -> reason)."""
    if case.variant in VARLEN_VARIANTS:
        return _varlen_impls(case, fa), {}, {}
    q, k, v = make_inputs(case)
    causal = case.causal
    kw = {"is_causal": causal, "enable_gqa": bool(case.kv_heads)}
    L, S = case.shape[2], case.shape[3]
    if case.variant:  # the variants section: the peers get the equivalent dense mask
        kw = variant_kwargs(case.variant, case.shape[1], L, S)
    fast = {"fastattn": lambda t: (lambda: fa.attention(q, k, v, num_threads=t, **kw))}
    if case.section == "decode" and case.dtype == "float32":  # K, V in an int8 KV cache
        cache = int8_cache(fa, k, v)
        fast[INT8_CACHE] = lambda t: (lambda: cache.attend(q, num_threads=t))
    peer_fns, skipped = {}, {}
    if case.variant and not variant_has_peers(case.variant):  # the score options
        return fast, peer_fns, skipped
    if "torch" in peers:
        F = tools.torch.nn.functional
        tq, tk, tv = (_to_torch(tools.torch, a) for a in (q, k, v))
        tkw = {"is_causal": causal, **({"enable_gqa": True} if case.kv_heads else {})}
        if case.variant:
            tkw = {"attn_mask": tools.torch.from_numpy(
                np.ascontiguousarray(variant_visible(case.variant, L, S)))}
        peer_fns["torch"] = lambda: F.scaled_dot_product_attention(tq, tk, tv, **tkw)
    if "numpy" in peers:
        need = numpy_peak_bytes(case)
        if need > numpy_max_bytes:
            skipped["numpy"] = (f"skipped: would need ~{need / 2 ** 30:.1f} GiB "
                                f"(> {numpy_max_bytes / 2 ** 30:.1f} GiB)")
        else:
            peer_fns["numpy"] = _numpy_attention(case, q, k, v, tools.scipy.special.softmax)
    return fast, peer_fns, skipped


def _to_torch(torch, a: np.ndarray):
    """a as a torch tensor of its dtype, sharing memory (bfloat16 by its bits)."""
    if a.dtype.itemsize == 2 and a.dtype != np.float16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# gradients against torch's: the largest |difference| over the largest
# |gradient| allowed, float32 rounding, and bfloat16 inputs whose gradients
# both round to bfloat16
GRAD_TOL = {"float32": 1e-3, "bfloat16": 3e-2}


def grads_vs_torch(res: dict, dtype: str) -> dict:
    """In a timing run's results ``res`` (name@threads -> record with the
    first call's ``output``), fastattn's gradients (``fastattn_fwd_bwd@``)
    against torch's (``torch_fwd_bwd@``, tensors in the same order): the
    worst of each one's largest |difference| over its largest |torch
    gradient|, and whether it is within GRAD_TOL[dtype]; {} without torch."""
    if not any(n.startswith("torch_fwd_bwd@") for n in res):
        return {}
    got = next(r["output"] for n, r in res.items() if n.startswith("fastattn_fwd_bwd@"))
    want = next(r["output"] for n, r in res.items() if n.startswith("torch_fwd_bwd@"))
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        ref = b.detach().float().numpy().astype(np.float64)
        diff = np.abs(np.asarray(a, dtype=np.float64) - ref)
        worst = max(worst, float(np.max(diff)) / max(float(np.abs(ref).max()), 1e-30))
    return {"grad_rel_diff": worst, "grad_ok": worst <= GRAD_TOL[dtype]}


def build_impls(case: Case, threads: list, fa, tools: Tools, peers, numpy_max_bytes,
                machine=None):
    """-> (impls: "name@t" -> callable, thread_of: "name@t" -> t,
    skipped: name -> reason, variants).  ``peers``: those this run can time
    (see :func:`available_peers`), from the modules in ``tools``.
    ``machine``: None, or t -> a callable (the FMA probe on t threads), timed
    as "machine@t".

    The inputs are made once for all thread counts; fastattn.attention takes
    its count as ``num_threads``, the others from the thread limit around each
    sample.
    Order: fastattn and torch side by side at each thread count (the pairs of
    the `vs torch` ratios, then of the thread speed-ups, are neighbours in
    every round), the numpy peer last (its calls at L = 4096 take seconds and
    allocate GiBs)."""
    if case.kind == "softmax":
        fast, peer_fns, variants = _softmax_impls(case, fa, tools, peers)
        skipped = {}
    else:
        fast, peer_fns, skipped = _attention_impls(case, fa, tools, peers, numpy_max_bytes)
        variants = tuple(fast)
    impls, thread_of = {}, {}
    for t in threads:
        for name, make in fast.items():
            impls[f"{name}@{t}"], thread_of[f"{name}@{t}"] = make(t), t
        if "torch" in peer_fns:
            impls[f"torch@{t}"], thread_of[f"torch@{t}"] = peer_fns["torch"], t
        if machine is not None:
            impls[f"machine@{t}"], thread_of[f"machine@{t}"] = machine(t), t
    if "numpy" in peer_fns:
        for t in threads:
            impls[f"numpy@{t}"], thread_of[f"numpy@{t}"] = peer_fns["numpy"], t
    return impls, thread_of, skipped, variants


def check_outputs(case: Case, res: dict) -> tuple[float | None, str | None, bool]:
    """Compare fastattn's output to a peer's -> (max_abs_diff, against, ok)."""
    ref_name = next((p for p in ("torch", "numpy") if p in res), None)
    if ref_name is None:
        return None, None, True
    ref = res[ref_name]["output"]
    if hasattr(ref, "numpy"):
        ref = ref.float().numpy() if str(ref.dtype) == "torch.bfloat16" else ref.numpy()
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(res["fastattn"]["output"], dtype=np.float64)
    if got.shape != ref.shape:
        return None, ref_name, False
    with np.errstate(all="ignore"):
        diff = float(np.max(np.abs(got - ref))) if got.size else 0.0
    if case.dtype == "float64":
        ok = np.allclose(got, ref, rtol=1e-7, atol=1e-9)
    elif case.dtype in HALF_DTYPES:  # a few ulps of the dtype (either rounds once)
        tol = 4e-3 if case.dtype == "float16" else 3e-2
        ok = np.allclose(got, ref, rtol=tol, atol=tol)
    else:
        ok = np.allclose(got, ref, rtol=2e-3, atol=2e-4)
    return diff, ref_name, bool(ok)
