"""Helpers of the paged-cache tests: random batches laid out in block pools,
each sequence's keys and values gathered back from the pages in NumPy, and
the reference per sequence (fastattn.reference.attention on those keys)."""

import numpy as np

import fastattn
from conftest import assert_close, finite_absmax, q8_dot_bound, q8_query, reference_attention
from fastattn import _half


def pool_shape(layout, num_blocks, block_size, hkv, width):
    return ((num_blocks, block_size, hkv, width) if layout == "NHD"
            else (num_blocks, hkv, block_size, width))


def make_batch(rng, lens, nq=None, *, block_size=16, hq=4, hkv=2, e=8, ev=None,
               layout="NHD", dtype=np.float32, spare=3, shared=0):
    """A batch of len(lens) sequences in shuffled blocks of two pools.

    nq: queries per sequence (None: one each, cu_seqlens_q None); shared:
    sequences 1.. reuse sequence 0's first `shared` blocks (a common
    prefix).  Returns a dict of the attention_paged arguments."""
    ev = e if ev is None else ev
    lens = [int(n) for n in lens]
    nblk = [-(-n // block_size) for n in lens]
    own = [nb - (min(shared, nb) if b else 0) for b, nb in enumerate(nblk)]
    num_blocks = sum(own) + spare
    ids = rng.permutation(num_blocks)
    width = max(max(nblk, default=1), 1)
    table = np.zeros((len(lens), width + 1), np.int32)   # one unused column of junk
    table[:, -1] = 10**6
    at = 0
    for b, nb in enumerate(nblk):
        pre = min(shared, nb) if b else 0
        table[b, :pre] = table[0, :pre]
        table[b, pre:nb] = ids[at:at + nb - pre]
        at += nb - pre
    kdt = _half.as_storage_dtype(dtype)
    kc = rng.standard_normal(pool_shape(layout, num_blocks, block_size, hkv, e)).astype(kdt)
    vc = rng.standard_normal(pool_shape(layout, num_blocks, block_size, hkv, ev)).astype(kdt)
    counts = [1] * len(lens) if nq is None else list(nq)
    qdt = np.float32 if kdt.itemsize == 2 else kdt
    q = rng.standard_normal((sum(counts), hq, e)).astype(qdt)
    cu = None if nq is None else np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return dict(query=q, key_cache=kc, value_cache=vc, block_table=table,
                seq_lens=np.array(lens, np.int64), cu_seqlens_q=cu, layout=layout)


def bf16_weights_bound(args, ref):
    """|out - ref| bound of a 16-bit pool, whose P.V may take the weights
    rounded to bfloat16 (the avx512_bf16 tier's VDPBF16PS kernels): each weight p_j rounded to
    nearest even is p_j (1 + d_j), |d_j| <= 2^-9, while the softmax's sum
    l = sum_j p_j stays float32, so the output moves by |sum_j p_j d_j v_j|
    / l <= 2^-9 max_j |v_j|; plus float32 arithmetic (1e-5 of the result)."""
    v = np.asarray(args["value_cache"], np.float64)
    return 2.0 ** -9 * float(np.abs(v[np.isfinite(v)]).max(initial=1.0)) + \
        1e-5 * float(np.abs(ref[np.isfinite(ref)]).max(initial=1.0))


def gather(cache, table, n, layout, scales=None):
    """A sequence's rows (n, Hkv, width) from the pages, float64 (int8
    dequantised as the kernel reads it: float32 scale x level)."""
    bs = cache.shape[1] if layout == "NHD" else cache.shape[2]
    pages = [cache[blk] if layout == "NHD" else cache[blk].swapaxes(0, 1)
             for blk in table[:-(-n // bs)]] if n else []
    rows = (np.concatenate(pages)[:n] if pages else
            np.zeros((0,) + (cache.shape[2:] if layout == "NHD" else
                             (cache.shape[1], cache.shape[3])), cache.dtype))
    if scales is None or not n:
        return rows.astype(np.float64)
    sc = np.concatenate([scales[blk] for blk in table[:-(-n // bs)]])[:n]
    return (sc[..., None] * rows.astype(np.float32)).astype(np.float64)


def _noncausal_mask(nq, n, window, slopes, hq):
    """The additive mask of a non-causal call: the window and ALiBi at the
    queries' real positions n - nq + i (the reference's are i then)."""
    p = (n - nq + np.arange(nq))[:, None]
    j = np.arange(n)[None, :]
    m = np.zeros((hq, nq, n))
    if slopes is not None:
        m -= np.asarray(slopes, np.float64)[:, None, None] * np.abs(p - j)
    if window is not None:
        left, right = window if isinstance(window, tuple) else (window, window)
        hide = np.zeros((nq, n), bool)
        if left is not None:
            hide |= j < p - left
        if right is not None:
            hide |= j > p + right
        m[:, hide] = -np.inf
    return m


def reference_paged(args, *, is_causal=True, window=None, alibi_slopes=None, softcap=None,
                    sinks=None, scale=None, key_scales=None, value_scales=None):
    """(out (total_q, Hq, Ev), lse (Hq, total_q)) in float64, one reference
    call per sequence over the keys gathered from its blocks."""
    q, table, lens = args["query"], args["block_table"], args["seq_lens"]
    layout, hq = args["layout"], q.shape[1]
    cu = args["cu_seqlens_q"]
    cu = np.arange(len(lens) + 1) if cu is None else np.asarray(cu)
    ev = args["value_cache"].shape[-1]
    out = np.zeros((q.shape[0], hq, ev))
    lse = np.zeros((hq, q.shape[0]))
    for b, n in enumerate(lens):
        r0, r1 = cu[b], cu[b + 1]
        if r1 == r0:
            continue
        k = gather(args["key_cache"], table[b], n, layout, key_scales).swapaxes(0, 1)
        v = gather(args["value_cache"], table[b], n, layout, value_scales).swapaxes(0, 1)
        qb = q[r0:r1].astype(np.float64).swapaxes(0, 1)
        opts = dict(enable_gqa=True, softcap=softcap, sinks=sinks, scale=scale,
                    return_lse=True)
        if is_causal:
            o, l = reference_attention(qb, k, v, is_causal="lower_right", window=window,
                                       alibi_slopes=alibi_slopes, **opts)
        else:
            mask = _noncausal_mask(r1 - r0, n, window, alibi_slopes, hq)
            o, l = reference_attention(qb, k, v, attn_mask=mask, **opts)
        out[r0:r1] = o.swapaxes(0, 1)
        lse[:, r0:r1] = l
    return out, lse


def call_paged(args, **kw):
    return fastattn.attention_paged(args["query"], args["key_cache"], args["value_cache"],
                                    args["block_table"], args["seq_lens"],
                                    cu_seqlens_q=args["cu_seqlens_q"], layout=args["layout"],
                                    **kw)


def check_int8(isa, args, ks, vs, **opts):
    """attention_paged on int8 pools against the reference over the
    dequantised pools.  The decoding sequences (at most 8 queries: the int8
    kernel's) take their queries as that kernel quantises them on the tiers
    with integer dot products (conftest.q8_query), and the tolerance adds
    the weights' typical quantisation error there (conftest.q8_dot_bound);
    the others are read by the copy, in float32."""
    out, lse = call_paged(args, return_lse=True, key_scales=ks, value_scales=vs, **opts)
    q = args["query"].astype(np.float64)
    cu = args["cu_seqlens_q"]
    cu = np.arange(len(args["seq_lens"]) + 1) if cu is None else cu
    for r0, r1 in zip(cu[:-1], cu[1:]):
        if r1 - r0 <= 8:
            q[r0:r1] = q8_query(isa, args["query"][r0:r1])
    ref, ref_lse = reference_paged(dict(args, query=q), key_scales=ks, value_scales=vs, **opts)
    pools = [args[n] if args["layout"] == "NHD" else args[n].swapaxes(1, 2)
             for n in ("key_cache", "value_cache")]
    wt = q8_dot_bound(isa, args["query"], pools[0], ks, pools[1], vs, 1.0)[3]
    m = finite_absmax(ref)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * m + wt)
    assert_close(lse, ref_lse, np.float32, factor=10)
