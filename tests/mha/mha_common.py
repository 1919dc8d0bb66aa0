"""Shared by the multi_head_attention and KVCache tests: random weights and
inputs, a per-head NumPy reference, and tolerances."""

import numpy as np

from fastattn import reference


F16_REL = 2.0 ** -11          # half a float16 ulp, relative


def make(rng, *, n=2, L=5, S=None, d_model=12, heads=4, kv_heads=None, d_k=3, d_v=None,
         d_out=7, d_ctx=None, dtype=np.float64):
    """x, (context), w_q, w_k, w_v, w_o with weights scaled to keep scores O(1)."""
    kv_heads = heads if kv_heads is None else kv_heads
    d_v = d_k if d_v is None else d_v
    d_in = d_model if d_ctx is None else d_ctx
    x = rng.standard_normal((n, L, d_model) if n else (L, d_model))
    ctx = None
    if S is not None:
        ctx = rng.standard_normal((n, S, d_in) if n else (S, d_in))
    w_q = rng.standard_normal((d_model, heads * d_k)) / np.sqrt(d_model)
    w_k = rng.standard_normal((d_in, kv_heads * d_k)) / np.sqrt(d_in)
    w_v = rng.standard_normal((d_in, kv_heads * d_v)) / np.sqrt(d_in)
    w_o = rng.standard_normal((heads * d_v, d_out)) / np.sqrt(heads * d_v)
    cast = (lambda a: None if a is None else a.astype(dtype))
    return cast(x), cast(ctx), cast(w_q), cast(w_k), cast(w_v), cast(w_o)


def mha_reference(x, w_q, w_k, w_v, w_o, heads, kv_heads=None, context=None,
                  is_causal=False, attn_mask=None, key_padding_mask=None):
    """One head at a time with fastattn.reference.attention, in float64."""
    kv_heads = heads if kv_heads is None else kv_heads
    x = np.asarray(x, np.float64)
    src = x if context is None else np.asarray(context, np.float64)
    d_k = w_q.shape[1] // heads
    d_v = w_v.shape[1] // kv_heads
    group = heads // kv_heads
    L, S = x.shape[-2], src.shape[-2]
    lead = x.shape[:-2]
    mask = None
    if attn_mask is not None:
        mask = np.broadcast_to(np.asarray(attn_mask), lead + (heads, L, S))
    outs = []
    for h in range(heads):
        g = h // group
        q = x @ w_q[:, h * d_k:(h + 1) * d_k].astype(np.float64)
        k = src @ w_k[:, g * d_k:(g + 1) * d_k].astype(np.float64)
        v = src @ w_v[:, g * d_v:(g + 1) * d_v].astype(np.float64)
        m = None if mask is None else mask[..., h, :, :]
        outs.append(reference.attention(q, k, v, m, is_causal,
                                        key_padding_mask=key_padding_mask))
    return np.concatenate(outs, axis=-1) @ w_o.astype(np.float64)


TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}
