"""Attention over Dask arrays: split over batch, heads, queries and keys,
merged exactly.

:func:`attention` takes ``dask.array`` inputs (NumPy arrays are wrapped as one
chunk) and returns a lazy ``dask.array`` chunked as the query along batch,
heads and queries.  Each (batch, head, query) block against each key chunk
is one task (:mod:`fastattn._dask_tasks`): it computes that key chunk's
partial ``(out, lse)`` and merges it, with :func:`fastattn.merge_attention`,
into the result of the block's previous key chunk, which is its one
dependency besides the chunks.  A block's key chunks thus form a chain in
key order: one partial alive per block at a time (inside its task), merged
as soon as it exists, and in a fixed order, so the result does not depend on
the scheduler, the workers or their threads.  Each task runs where the most
of its inputs' bytes are (its key/value chunk, or the query chunk and the
running result), as the scheduler places it.

Needs the ``[dask]`` extra: ``pip install "fastattn[dask]"`` (``dask[array]``
and ``distributed``).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

try:
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise ImportError("fastattn.dask needs dask[array] (and distributed for a cluster), "
                      "which are not installed: pip install 'fastattn[dask]'") from e

from . import _api, _half, _scores, _validate
from . import _dask_tasks as _t
from ._masks import causal_offset, check_window, resolve

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import ArrayLike

__all__ = ["attention"]


def _known(x, name: str):
    """x (a dask array), its chunk sizes checked to be known."""
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(f"{name} has unknown chunk sizes {x.chunks}: call "
                         f"{name}.compute_chunk_sizes() first")
    return x


def _array_arg(x, name: str):
    """An optional array argument: None, a dask array (chunk sizes checked)
    or a NumPy array."""
    if x is None or isinstance(x, da.Array):
        return x if x is None else _known(x, name)
    return _validate.as_array(x, name)


def _pad_dims(x, nd: int):
    return x[(None,) * (nd - x.ndim)] if x.ndim < nd else x


def _stand_in(shape: tuple, dtype) -> np.ndarray:
    """A read-only array of ``shape`` that takes no memory, for the checks."""
    return np.broadcast_to(np.zeros((), dtype), shape)


class _Problem(NamedTuple):
    """The whole problem, checked, with the inputs padded to one rank and
    rechunked to line up."""
    q: Any
    k: Any
    v: Any
    mask: Any                 # dask array or None
    pad: Any                  # dask array or None
    pad_visible: Any          # NumPy key_padding_mask: (blocks of its N axis, key chunks)
    batch: tuple
    out_chunks: tuple         # batch chunks (heads included)
    kv_heads: list | None     # per query head chunk: (kv chunk, start, stop, index)
    L: int
    S: int
    Ev: int
    cdt: np.dtype
    odt: np.dtype


def _pick_chunks(arrays, d: int, n: int) -> tuple:
    """The chunks of axis d (size n): those of the first input of that size,
    the caller's dask arrays first."""
    ranked = [x for x, given in arrays if given] + [x for x, given in arrays if not given]
    return next(x.chunks[d] for x in ranked if x.shape[d] == n)


def _kv_head_chunks(q_chunks: tuple, g: int, hk: int) -> tuple[tuple, list]:
    """Key/value head chunks such that each query head chunk's kv heads lie in
    one chunk, and for each query chunk (kv chunk, start, stop, index): its kv
    heads in that chunk, and None if its heads are whole groups, else the kv
    head (within start:stop) of each of its query heads.  No query heads
    (``g == 0``): the kv heads in one chunk, which no block reads."""
    if g == 0:
        return (hk,), [(0, 0, 0, None)] * len(q_chunks)
    spans, h = [], 0
    for c in q_chunks:
        a, b = h // g, (h + c - 1) // g + 1 if c else h // g
        spans.append((a, b, h, h + c))
        h += c
    bounds: list[list[int]] = []
    for a, b, _, _ in spans:
        if bounds and a < bounds[-1][1]:
            bounds[-1][1] = max(bounds[-1][1], b)
        elif not bounds or b > a:
            bounds.append([a, b])
    kmap = []
    for a, b, h0, h1 in spans:
        ci = next((i for i, (s, e) in enumerate(bounds) if s <= a and b <= e), 0)
        s = bounds[ci][0] if bounds else 0
        index = None if (h0 % g == 0 and h1 % g == 0) else np.arange(h0, h1) // g - a
        kmap.append((ci, a - s, b - s, index))
    chunks = tuple(e - s for s, e in bounds)
    return (chunks if sum(chunks) == hk else (hk,)), kmap


# Dask's rechunk iterates over blocks with NumPy's nditer: at most 32 dimensions.
_RECHUNK_MAX_DIMS = 32


def _rechunk(x, chunks: tuple, name: str, source=None):
    """x (argument ``name``) with ``chunks``: the NumPy array it wraps
    (``source``) wrapped again, a dask array rechunked where they differ."""
    if x.chunks == chunks:
        return x
    if source is not None:
        return da.from_array(source, chunks=chunks)
    if x.ndim > _RECHUNK_MAX_DIMS:
        raise ValueError(f"{name} of shape {x.shape} must be rechunked to line up with the "
                         f"other inputs, which Dask cannot do for more than "
                         f"{_RECHUNK_MAX_DIMS} dimensions: give {name} the chunks {chunks}")
    return x.rechunk(chunks)


def _align(q, k, v, sources: dict, batch: tuple, gqa, cdt, odt) -> tuple:
    """q, k, v rechunked to line up -> (q, k, v, out_chunks, kv_heads);
    ``sources``: the NumPy array each wraps, None for a dask array."""
    nb = q.ndim - 2
    given = {n: s is None for n, s in sources.items()}
    named = [(q, given["query"]), (k, given["key"]), (v, given["value"])]
    hd = nb - 1 if gqa is not None else None
    out_chunks = tuple(q.chunks[d] if d == hd else _pick_chunks(named, d, batch[d])
                       for d in range(nb))
    kv_heads = None
    kv_batch = list(out_chunks)
    if hd is not None:
        kv_chunks, kv_heads = _kv_head_chunks(q.chunks[hd], gqa[1], gqa[0])
        kv_batch[hd] = kv_chunks
    s_chunks = _pick_chunks([(k, given["key"]), (v, given["value"])], -2, k.shape[-2])

    def target(x, bchunks, rows):
        return tuple(bchunks[d] if x.shape[d] == batch[d] or d == hd else (x.shape[d],)
                     for d in range(nb)) + (rows, (x.shape[-1],))
    q = _rechunk(q, target(q, out_chunks, q.chunks[-2]), "query", sources["query"])
    k = _rechunk(k, target(k, kv_batch, s_chunks), "key", sources["key"])
    v = _rechunk(v, target(v, kv_batch, s_chunks), "value", sources["value"])
    return q, k, v, out_chunks, kv_heads


def _mask_array(attn_mask, batch, out_chunks, q, k):
    """attn_mask as a dask array of the problem's rank, chunked as the blocks
    along every axis where it is not broadcast."""
    m = attn_mask if isinstance(attn_mask, da.Array) else np.asarray(attn_mask)
    m = m[(None,) * (len(batch) + 2 - m.ndim)]
    axes = out_chunks + (q.chunks[-2], k.chunks[-2])
    chunks = tuple((1,) if m.shape[d] == 1 else axes[d] for d in range(m.ndim))
    if isinstance(m, da.Array):
        return _rechunk(m, chunks, "attn_mask")
    return da.from_array(m, chunks=chunks)


def _pad_array(kpm, batch, out_chunks, k, query_ndim):
    """key_padding_mask as a dask array chunked as the keys (and as the batch
    axis its N lies on), and for a NumPy one which (N block, key chunk) pairs
    have a key that is not padding."""
    p = kpm if isinstance(kpm, da.Array) else np.asarray(kpm)
    s_chunks = k.chunks[-2]
    if p.ndim == 1:
        chunks = (s_chunks,)
    else:
        dk = len(batch) - (query_ndim - 2)
        chunks = ((1,) if p.shape[0] == 1 else out_chunks[dk], s_chunks)
    if isinstance(p, da.Array):
        return _rechunk(p, chunks, "key_padding_mask"), None
    starts = [np.cumsum((0,) + c) for c in chunks]
    p2 = p.reshape((1,) * (2 - p.ndim) + p.shape)
    n_starts = starts[0] if p.ndim == 2 else np.array([0, 1])
    visible = np.array([[not p2[n_starts[i]:n_starts[i + 1], starts[-1][j]:starts[-1][j + 1]].all()
                         for j in range(len(s_chunks))] for i in range(len(n_starts) - 1)])
    return da.from_array(p, chunks=chunks), visible


def _problem(query, key, value, attn_mask, is_causal, enable_gqa, key_padding_mask,
             window) -> tuple[_Problem, tuple]:
    """Check and line up the inputs (the in-memory call's checks, on shapes)."""
    given = {n: _array_arg(x, n) for n, x in (("query", query), ("key", key), ("value", value))}
    # dtypes and shapes checked before NumPy inputs are wrapped (and hashed)
    cdt, odt = _validate.kernel_dtypes(tuple((n, a.dtype) for n, a in given.items()))
    cdt = _half.arith(cdt)  # partials in float32 for 16-bit inputs, rounded once at the end
    batch, gqa, L, S, E, Ev = _api.problem_shape(*(a.shape for a in given.values()), enable_gqa)
    # each as a dask array, and the NumPy array it wraps (None for a dask array)
    sources = {n: None if isinstance(x, da.Array) else x for n, x in given.items()}
    arrays = {n: x if s is None else da.from_array(s, chunks=-1)
              for (n, x), s in zip(given.items(), sources.values())}
    q, k, v = arrays["query"], arrays["key"], arrays["value"]
    query_ndim = q.ndim
    m_in = _array_arg(attn_mask, "attn_mask")
    p_in = _array_arg(key_padding_mask, "key_padding_mask")
    resolve(None if m_in is None else _stand_in(m_in.shape, cdt if m_in.dtype.kind == "f"
                                                else m_in.dtype),
            is_causal, None if p_in is None else _stand_in(p_in.shape, p_in.dtype),
            batch, L, S, cdt, query_ndim, window)
    nd = len(batch) + 2
    q, k, v = (_pad_dims(x, nd) for x in (q, k, v))
    sources = {n: None if a is None else _pad_dims(a, nd) for n, a in sources.items()}
    q, k, v, out_chunks, kv_heads = _align(q, k, v, sources, batch, gqa, cdt, odt)
    mask = None if m_in is None else _mask_array(m_in, batch, out_chunks, q, k)
    pad, visible = (None, None) if p_in is None else _pad_array(p_in, batch, out_chunks, k,
                                                                query_ndim)
    prob = _Problem(q, k, v, mask, pad, visible, batch, out_chunks, kv_heads, L, S, Ev, cdt,
                    odt)
    return prob, (E, query_ndim, gqa)


def _starts(chunks: tuple) -> list[int]:
    return [0, *itertools.accumulate(chunks)]


def _block_key(x, name_dims: tuple, idx: tuple) -> tuple:
    """The key of x's block at the problem's block index idx (0 on a broadcast axis)."""
    return (x.name,) + tuple(0 if n == 1 and len(x.chunks[d]) == 1 else i
                             for d, (n, i) in enumerate(zip(name_dims, idx)))


def attention(query: ArrayLike | da.Array, key: ArrayLike | da.Array,
              value: ArrayLike | da.Array, attn_mask: ArrayLike | da.Array | None = None,
              is_causal: bool | Literal["upper_left", "lower_right"] = False,
              scale: float | None = None, enable_gqa: bool = False, *,
              key_padding_mask: ArrayLike | da.Array | None = None,
              window: int | tuple[int | None, int | None] | None = None,
              alibi_slopes: ArrayLike | None = None, softcap: float | None = None,
              sinks: ArrayLike | None = None, return_lse: bool = False,
              num_threads: int | None = None) -> da.Array | tuple[da.Array, da.Array]:
    """:func:`fastattn.attention` on Dask arrays, lazily, exactly merged over keys.

    Parameters
    ----------
    query, key, value : dask.array.Array or array_like
        As for :func:`fastattn.attention` (NumPy arrays are wrapped as one
        chunk).  The result is chunked as ``query`` along the batch axes
        (heads included) and the query rows; the key rows are split as
        ``key``'s chunks.  Inputs whose chunks do not line up are
        *rechunked*: ``key`` and ``value`` to the query's batch chunks (to
        whole groups of heads with ``enable_gqa``), ``value`` to ``key``'s
        row chunks, and the feature axes to one chunk.  Chunk sizes must be
        known.
    attn_mask : dask.array.Array or array_like, optional
        Dense, broadcastable to ``(..., L, S)``: chunked with the query rows
        and key rows (a NumPy mask is wrapped so), never materialised whole.
    is_causal, scale, enable_gqa, window, alibi_slopes, softcap, sinks
        As for :func:`fastattn.attention`.  Each (query chunk, key chunk)
        task sees the global positions: causality, the window and ALiBi are
        exact; the sinks are joined once, when a block's parts are merged.
    key_padding_mask : dask.array.Array or array_like of bool, optional
        ``(S,)`` or ``(N, S)``.  A NumPy mask is inspected when the graph is
        built: key chunks that are all padding are not scheduled (a Dask mask
        cannot be inspected then, and is only applied).
    return_lse : bool, optional
        Also return the log-sum-exp, a lazy ``(..., L)`` array.
    num_threads : int, optional
        Threads per task; None: the threads of the ``dask.distributed``
        worker running it (the OpenMP default under the local schedulers).
        Tasks release the GIL, so a threaded worker runs several at once.

    Returns
    -------
    output : dask.array.Array, shape (..., L, Ev)
        The dtype of :func:`fastattn.attention`'s output.
    lse : dask.array.Array, shape (..., L)
        Only with ``return_lse=True``.

    Raises
    ------
    ValueError, TypeError
        For what :func:`fastattn.attention` rejects (checked on the shapes
        and dtypes, when the graph is built), for unknown chunk sizes, and
        for a Dask input of more than 32 dimensions whose chunks must be
        rechunked to line up (Dask's rechunk stops at 32).

    Notes
    -----
    Key chunks that causality, the window or a NumPy ``key_padding_mask``
    hide from a whole query block are pruned from the graph.  The other key
    chunks of a block are visited in key order, each task merging its
    chunk's partial into the running result of the ones before: the order
    is fixed by the chunks alone, so the result is bitwise the same on every
    scheduler and any number of workers or threads, and equals the
    in-memory call to float32 (float64) rounding.  A block has one partial
    alive at a time, so a worker holds little beyond its chunks and its
    share of the result; the key chunks of one block are visited one after
    another (the parallelism is over the blocks of batch, heads and
    queries).  Memory per task is bounded by the chunk sizes; nothing of
    size ``L x S`` is ever built,
    except an ``Lq x Sk`` boolean band per task where ALiBi meets a window
    side wider than a (query chunk, key chunk) pair.

    Examples
    --------
    >>> import numpy as np, dask.array as da, fastattn
    >>> from fastattn.dask import attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 4, 256, 32), dtype=np.float32) for _ in range(3))
    >>> qd = da.from_array(q, chunks=(1, 2, 128, 32))
    >>> kd, vd = (da.from_array(x, chunks=(1, 2, 64, 32)) for x in (k, v))
    >>> out = attention(qd, kd, vd, is_causal=True)
    >>> out.chunks
    ((1,), (2, 2), (128, 128), (32,))
    >>> want = fastattn.attention(q, k, v, is_causal=True)
    >>> bool(np.allclose(out.compute(), want, rtol=1e-5, atol=1e-6))
    True
    """
    prob, (E, query_ndim, gqa) = _problem(query, key, value, attn_mask, is_causal, enable_gqa,
                                          key_padding_mask, window)
    cdt = prob.cdt
    sc = (_validate.check_scale(scale, cdt) if scale is not None
          else 1.0 / math.sqrt(E) if E > 0 else 1.0)
    nt = _validate.thread_count(num_threads)
    _scores.resolve(None, softcap, None, (), cdt)         # softcap's checks
    cap = _scores.check_softcap(softcap)
    slopes = _scores.per_head("alibi_slopes", _array_arg(alibi_slopes, "alibi_slopes"),
                              prob.batch, cdt, in_range=True)
    sink = _scores.per_head("sinks", _array_arg(sinks, "sinks"), prob.batch, cdt,
                            neg_inf_ok=True, in_range=True)
    causal, off = causal_offset(is_causal, prob.L, prob.S)
    left, right = check_window(window)
    hi = off if causal else (None if right is None else right)
    lo = None if left is None else off - left
    token = tokenize(prob.q.name, prob.k.name, prob.v.name,
                     None if prob.mask is None else prob.mask.name,
                     None if prob.pad is None else prob.pad.name, causal, off, lo, hi, sc,
                     gqa, query_ndim, slopes, cap, sink, nt, "chain")
    return _build(prob, token, _Options(sc, lo, hi, off, slopes, cap, sink, nt, query_ndim,
                                        gqa), return_lse)


class _Options(NamedTuple):
    scale: float
    lo: int | None            # query i sees keys i + lo <= j <= i + hi
    hi: int | None
    off: int                  # query i sits at key position i + off (ALiBi)
    slopes: Any
    softcap: float | None
    sinks: Any
    num_threads: int
    query_ndim: int
    gqa: Any


class _Block(NamedTuple):
    """One block of the batch axes (heads included): its index, shape, key/value
    block index, and what its tasks take besides their chunks."""
    bidx: tuple
    bshape: tuple
    kv_bidx: tuple
    kv_heads: tuple | None    # (start, stop, index or None) within the kv block
    gqa: bool                 # the query heads are whole groups of the kv heads
    slopes: Any
    sinks: Any


def _blocks(prob: _Problem, o: _Options):
    """The blocks of the batch axes, in index order."""
    bstarts = [_starts(c) for c in prob.out_chunks]
    hd = len(prob.batch) - 1
    for bidx in itertools.product(*(range(len(c)) for c in prob.out_chunks)):
        bsl = tuple(slice(bstarts[d][i], bstarts[d][i + 1]) for d, i in enumerate(bidx))
        kv_bidx = list(bidx)
        kv_heads = None
        if prob.kv_heads is not None:
            ci, s, e, index = prob.kv_heads[bidx[hd]]
            kv_bidx[hd] = ci
            kv_heads = (s, e, index)
        gqa_ok = o.gqa is not None and (kv_heads is None or kv_heads[2] is None)
        yield _Block(bidx, tuple(s.stop - s.start for s in bsl), tuple(kv_bidx), kv_heads,
                     gqa_ok, None if o.slopes is None else np.ascontiguousarray(o.slopes[bsl]),
                     None if o.sinks is None else np.ascontiguousarray(o.sinks[bsl]))


def _chain(dsk: dict, prob: _Problem, o: _Options, pname: str, blk: _Block, qi: int):
    """The running merge of query chunk ``qi`` of ``blk`` over its key chunks:
    one task per key chunk that is not pruned, in key order, each computing
    its chunk's partial and merging it into the previous task's result, so
    that a query block has one partial alive at a time and its merges run in
    one fixed order.  -> the key of the last task (None: no key chunk)."""
    q, k, v = prob.q, prob.k, prob.v
    q0, Lc = _starts(q.chunks[-2])[qi], q.chunks[-2][qi]
    dk = len(prob.batch) - (o.query_ndim - 2)
    head = blk.bidx + (qi,)
    acc = None
    if 0 in blk.bshape:
        return acc
    for kj, (s0, Sc) in enumerate(zip(_starts(k.chunks[-2]), k.chunks[-2])):
        lim = _t.chunk_limits(q0, Lc, s0, Sc, o.lo, o.hi, o.off, blk.slopes is not None)
        if lim is None:
            continue
        if prob.pad_visible is not None:
            row = blk.bidx[dk] if prob.pad.ndim == 2 and prob.pad.shape[0] > 1 else 0
            if not prob.pad_visible[row, kj]:
                continue
        spec = _t.PartSpec(o.scale, lim, o.query_ndim, blk.kv_heads, blk.gqa, blk.slopes,
                           o.softcap, o.num_threads)
        key = (pname,) + head + (kj,)
        dsk[key] = (functools.partial(_t.accumulate, spec=spec), acc,
                    _block_key(q, q.shape, blk.bidx + (qi, 0)),
                    _block_key(k, k.shape, blk.kv_bidx + (kj, 0)),
                    _block_key(v, v.shape, blk.kv_bidx + (kj, 0)),
                    None if prob.mask is None else
                    _block_key(prob.mask, prob.mask.shape, blk.bidx + (qi, kj)),
                    None if prob.pad is None else _pad_key(prob.pad, blk.bidx, dk, kj))
        acc = key
    return acc


def _root(dsk: dict, prob: _Problem, pname: str, blk: _Block, qi: int, last) -> tuple:
    """The key of the block's ``(out, lse)``: the chain's last task, then the
    sinks and the result dtype; zeros when no key chunk reaches the block."""
    head = blk.bidx + (qi,)
    if last is None:
        root = (pname,) + head + ("empty",)
        Lc = prob.q.chunks[-2][qi]
        dsk[root] = (functools.partial(_t.empty_result, out_shape=blk.bshape + (Lc, prob.Ev),
                                       cdt=prob.cdt, odt=prob.odt),)
        return root
    if blk.sinks is None and prob.odt == prob.cdt:
        return last
    root = (pname,) + head + ("root",)
    dsk[root] = (functools.partial(_t.finish, sinks=blk.sinks, odt=prob.odt), last)
    return root


def _build(prob: _Problem, token: str, o: _Options, return_lse: bool):
    """The graph: a chain of partial-and-merge tasks per query block, the
    results' blocks."""
    q = prob.q
    pname, oname, lname = (f"fastattn-{w}-{token}" for w in ("partial", "attention", "lse"))
    dsk: dict = {}
    out_dsk: dict = {}
    lse_dsk: dict = {}
    for blk in _blocks(prob, o):
        for qi in range(len(q.chunks[-2])):
            head = blk.bidx + (qi,)
            root = _root(dsk, prob, pname, blk, qi, _chain(dsk, prob, o, pname, blk, qi))
            out_dsk[(oname,) + head + (0,)] = (_t.first, root)
            lse_dsk[(lname,) + head] = (_t.second, root)
    deps = [x for x in (q, prob.k, prob.v, prob.mask, prob.pad) if x is not None]
    g = HighLevelGraph.from_collections(pname, dsk, dependencies=deps)
    nd = len(prob.batch) + 2
    out = _array(g, pname, oname, out_dsk, prob.out_chunks + (q.chunks[-2], (prob.Ev,)),
                 np.empty((0,) * nd, prob.odt))
    if not return_lse:
        return out
    lse = _array(g, pname, lname, lse_dsk, prob.out_chunks + (q.chunks[-2],),
                 np.empty((0,) * (nd - 1), prob.cdt))
    return out, lse


def _pad_key(pad, bidx: tuple, dk: int, kj: int) -> tuple:
    if pad.ndim == 1:
        return (pad.name, kj)
    return (pad.name, 0 if len(pad.chunks[0]) == 1 else bidx[dk], kj)


def _array(g: HighLevelGraph, pname: str, name: str, layer: dict, chunks: tuple, meta):
    """A dask array whose layer ``name`` reads the partial layer of ``g``."""
    layers = dict(g.layers)
    layers[name] = layer
    deps = dict(g.dependencies)
    deps[name] = {pname}
    return da.Array(HighLevelGraph(layers, deps), name, chunks, meta=meta)
