"""fastattn.mha.multi_head_attention against a per-head NumPy reference
(and torch.nn.MultiheadAttention when torch is installed)."""

import numpy as np
import pytest

from fastattn.mha import KVCache, multi_head_attention
from mha_common import F16_REL, TOL, make, mha_reference


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_per_head_reference(rng, dtype, batched, is_causal):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=3 if batched else 0, dtype=dtype)
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, is_causal=is_causal)
    assert out.dtype == dtype
    assert out.shape == ((3, 5, 7) if batched else (5, 7))
    ref = mha_reference(x, w_q, w_k, w_v, w_o, 4, is_causal=is_causal)
    np.testing.assert_allclose(out, ref, **TOL[dtype])


def test_single_head_and_value_dim_different_from_key_dim(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, heads=1, d_k=5, d_v=2, d_out=3)
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 1)
    np.testing.assert_allclose(out, mha_reference(x, w_q, w_k, w_v, w_o, 1), **TOL[np.float64])
    x, _, w_q, w_k, w_v, w_o = make(rng, heads=3, d_k=2, d_v=4, d_out=5)
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 3)
    assert out.shape == (2, 5, 5)
    np.testing.assert_allclose(out, mha_reference(x, w_q, w_k, w_v, w_o, 3), **TOL[np.float64])


def test_heads_are_passed_as_views(rng, spy):
    x, _, w_q, w_k, w_v, w_o = make(rng)
    multi_head_attention(x, w_q, w_k, w_v, w_o, 4, num_threads=2)
    (args, kwargs), = spy
    q, k, v = args[:3]
    assert q.shape == (2, 4, 5, 3) and k.shape == (2, 4, 5, 3) and v.shape == (2, 4, 5, 3)
    assert not q.flags.c_contiguous            # a transposed view, not a copy
    assert kwargs["num_threads"] == 2


def test_integer_inputs_compute_in_float64(rng):
    x = rng.integers(-2, 3, (2, 4, 6))
    w = [rng.integers(-1, 2, (6, 6)) for _ in range(4)]
    out = multi_head_attention(x, *w, 2)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, mha_reference(x, *[a.astype(float) for a in w], 2),
                               **TOL[np.float64])


def test_return_weights(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng)
    out, w = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, is_causal=True,
                                  return_weights=True)
    assert w.shape == (2, 4, 5, 5) and w.dtype == np.float64
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.triu(w, k=1) == 0)
    out2, w2 = multi_head_attention(x[0], w_q, w_k, w_v, w_o, 4, return_weights=True)
    assert out2.shape == (5, 7) and w2.shape == (4, 5, 5)
    # head 0, query 0 by hand
    q = x[0] @ w_q[:, :3]
    k = x[0] @ w_k[:, :3]
    s = q @ k.T / np.sqrt(3)
    e = np.exp(s[0] - s[0].max())
    np.testing.assert_allclose(w2[0, 0], e / e.sum(), rtol=1e-12)


@pytest.mark.parametrize("kv_heads", [1, 2, 3, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_and_multi_query(rng, spy, kv_heads, dtype):
    x, _, w_q, w_k, w_v, w_o = make(rng, heads=6, kv_heads=kv_heads, d_model=10, dtype=dtype)
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 6, num_kv_heads=kv_heads,
                               is_causal=True)
    ref = mha_reference(x, w_q, w_k, w_v, w_o, 6, kv_heads, is_causal=True)
    np.testing.assert_allclose(out, ref, **TOL[dtype])
    (args, kwargs), = spy
    q, k, v = args[:3]
    # K/V keep their num_kv_heads heads (never repeated per query head)
    assert q.shape[1] == 6 and k.shape[1] == kv_heads and v.shape[1] == kv_heads
    enable_gqa = args[6] if len(args) > 6 else kwargs.get("enable_gqa", False)
    assert bool(enable_gqa) == (kv_heads != 6)


@pytest.mark.parametrize("batched", [True, False])
def test_cross_attention(rng, batched):
    x, ctx, w_q, w_k, w_v, w_o = make(rng, n=2 if batched else 0, L=4, S=9, d_ctx=5,
                                      kv_heads=2)
    out, w = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, num_kv_heads=2, context=ctx,
                                  return_weights=True)
    assert out.shape == ((2, 4, 7) if batched else (4, 7))
    assert w.shape[-2:] == (4, 9)
    ref = mha_reference(x, w_q, w_k, w_v, w_o, 4, 2, context=ctx)
    np.testing.assert_allclose(out, ref, **TOL[np.float64])
    # upper-left causal over a longer context, as in SDPA
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, num_kv_heads=2, context=ctx,
                               is_causal=True)
    ref = mha_reference(x, w_q, w_k, w_v, w_o, 4, 2, context=ctx, is_causal=True)
    np.testing.assert_allclose(out, ref, **TOL[np.float64])


def test_masks(rng):
    x, ctx, w_q, w_k, w_v, w_o = make(rng, n=2, L=4, S=6)
    n, heads, L, S = 2, 4, 4, 6
    keep = rng.random((n, heads, L, S)) < 0.7
    keep[..., 0] = True                                    # no row fully hidden
    additive = rng.standard_normal((L, S))
    kpm = np.zeros((n, S), bool)
    kpm[0, 4:] = True
    kpm[1, 2] = True
    cases = [
        dict(attn_mask=keep),
        dict(attn_mask=keep[0, 0]),                        # (L, S)
        dict(attn_mask=keep[:, :1]),                       # (N, 1, L, S)
        dict(attn_mask=additive),
        dict(attn_mask=np.where(keep[0], 0.0, -np.inf)),   # (H, L, S)
        dict(key_padding_mask=kpm),
        dict(key_padding_mask=kpm[0]),
        dict(attn_mask=keep, key_padding_mask=kpm, is_causal=True),
    ]
    for kw in cases:
        out = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, context=ctx, **kw)
        ref = mha_reference(x, w_q, w_k, w_v, w_o, heads, context=ctx, **kw)
        np.testing.assert_allclose(out, ref, **TOL[np.float64], err_msg=str(list(kw)))


def test_padding_key_has_no_influence(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, n=1, L=5)
    kpm = np.array([False, False, True, False, False])
    out = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, key_padding_mask=kpm)
    x2 = x.copy()
    x2[0, 2] = 1e3     # changes the padding token's key and value (and its own query)
    out2 = multi_head_attention(x2, w_q, w_k, w_v, w_o, 4, key_padding_mask=kpm)
    rows = [0, 1, 3, 4]
    np.testing.assert_allclose(out[0, rows], out2[0, rows], rtol=1e-12, atol=1e-12)


def _torch_mha(torch, w_q, w_k, w_v, w_o, heads):
    e = w_q.shape[0]
    m = torch.nn.MultiheadAttention(e, heads, bias=False, batch_first=True,
                                    dtype=torch.float64)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.from_numpy(np.concatenate([w_q.T, w_k.T, w_v.T])))
        m.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(w_o.T)))
    return m.eval()


@pytest.mark.parametrize("case", ["plain", "causal", "masks", "cross"])
def test_matches_torch_multihead_attention(rng, case):
    torch = pytest.importorskip("torch")
    n, L, e, heads = 2, 5, 12, 3
    x, ctx, w_q, w_k, w_v, w_o = make(rng, n=n, L=L, S=7 if case == "cross" else None,
                                      d_model=e, heads=heads, d_k=4, d_out=e)
    src = x if ctx is None else ctx
    S = src.shape[1]
    kw, tkw = {}, {}
    if case == "causal":
        kw["is_causal"] = True
        tkw["attn_mask"] = torch.from_numpy(np.triu(np.ones((L, S), bool), k=1))  # True = hide
    elif case == "masks":
        keep = rng.random((L, S)) < 0.7
        keep[:, 0] = True
        kpm = np.zeros((n, S), bool)
        kpm[1, 3:] = True
        kw.update(attn_mask=keep, key_padding_mask=kpm)
        tkw.update(attn_mask=torch.from_numpy(~keep),                  # torch: True = hide
                   key_padding_mask=torch.from_numpy(kpm))             # both: True = padding
    out, w = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, context=ctx,
                                  return_weights=True, **kw)
    m = _torch_mha(torch, w_q, w_k, w_v, w_o, heads)
    with torch.no_grad():
        t_src = torch.from_numpy(src)
        t_out, t_w = m(torch.from_numpy(x), t_src, t_src, need_weights=True,
                       average_attn_weights=False, **tkw)
    np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w, t_w.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_float16_computes_in_float32_and_returns_float16(rng, kv_heads):
    x, ctx, w_q, w_k, w_v, w_o = make(rng, n=2, L=6, S=5, heads=4, kv_heads=kv_heads, d_k=8)
    x, ctx, w_q, w_k, w_v, w_o = (a.astype(np.float16) for a in (x, ctx, w_q, w_k, w_v, w_o))
    for context in (None, ctx):
        out, w = multi_head_attention(x, w_q, w_k, w_v, w_o, 4, num_kv_heads=kv_heads,
                                      context=context, is_causal=True, return_weights=True)
        assert out.dtype == np.float16 and w.dtype == np.float16
        up = [None if a is None else a.astype(np.float32) for a in (x, context)]
        out32, w32 = multi_head_attention(up[0], w_q.astype(np.float32),
                                          w_k.astype(np.float32), w_v.astype(np.float32),
                                          w_o.astype(np.float32), 4, num_kv_heads=kv_heads,
                                          context=up[1], is_causal=True, return_weights=True)
        # documented guarantee: the float32 result rounded once to float16
        bound = F16_REL * np.abs(out32) + 2.0 ** -25 + 1e-6 * np.abs(out32).max()
        assert np.all(np.abs(out.astype(np.float32) - out32) <= bound)
        assert np.all(np.abs(w.astype(np.float32) - w32) <= F16_REL * w32 + 2.0 ** -25 + 1e-7)
        # ... hence close to exact arithmetic on the same float16 inputs
        exact = mha_reference(x, w_q, w_k, w_v, w_o, 4, kv_heads, context=context,
                              is_causal=True)
        err = np.abs(out.astype(np.float64) - exact)
        assert np.all(err <= F16_REL * np.abs(exact) + 1e-5 * np.abs(exact).max())


def test_float16_mixed_with_float32_promotes(rng):
    x, _, w_q, w_k, w_v, w_o = make(rng, dtype=np.float32)
    out = multi_head_attention(x.astype(np.float16), w_q, w_k, w_v, w_o, 4)
    assert out.dtype == np.float32


def _base(rng):
    x, ctx, w_q, w_k, w_v, w_o = make(rng, n=2, L=4, S=5, heads=4, kv_heads=2, d_k=3)
    return dict(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, num_heads=4, num_kv_heads=2), ctx


ERRORS = [
    # (what to change, exception, message pattern)
    (dict(num_heads=0), ValueError, "num_heads"),
    (dict(num_heads=4.0), TypeError, "num_heads"),
    (dict(num_heads=True), TypeError, "num_heads"),
    (dict(num_kv_heads=3), ValueError, r"num_heads=4 must be a multiple of num_kv_heads=3"),
    (dict(num_kv_heads=0), ValueError, "num_kv_heads"),
    (dict(x="1d"), ValueError, r"x must have shape .*\(12,\)"),
    (dict(x="4d"), ValueError, r"x must have shape"),
    (dict(x="complex"), TypeError, "x must hold real numbers"),
    (dict(w_q="wrong_rows"), ValueError, r"w_q has shape \(11, 12\).*d_model=12"),
    (dict(w_q="wrong_cols"), ValueError, r"w_q has shape \(12, 13\).*num_heads=4"),
    (dict(w_q="1d"), ValueError, r"w_q must be 2-D"),
    (dict(w_k="wrong_cols"), ValueError, r"w_k has shape \(12, 8\).*num_kv_heads\*d_k=6"),
    (dict(w_k="wrong_rows"), ValueError, r"w_k has shape \(11, 6\)"),
    (dict(w_v="wrong_cols"), ValueError, r"w_v has shape \(12, 7\).*num_kv_heads=2"),
    (dict(w_o="wrong_rows"), ValueError, r"w_o has shape \(11, 7\).*num_heads\*d_v"),
    (dict(w_o="1d"), ValueError, r"w_o has shape"),
    (dict(context="2d"), ValueError, "context must have as many dimensions"),
    (dict(context="batch"), ValueError, "same batch size"),
    (dict(context="width"), ValueError, r"w_k has shape \(12, 6\).*context"),
    (dict(attn_mask=np.ones((3, 4), bool)), ValueError, r"attn_mask of shape \(3, 4\)"),
    (dict(key_padding_mask=np.zeros((2, 3), bool)), ValueError, r"key_padding_mask has shape"),
    (dict(key_padding_mask=np.zeros(4)), TypeError, "key_padding_mask must be boolean"),
    (dict(kv_cache="dtype"), TypeError, r"kv_cache has dtype float32 but this call needs float64"),
    (dict(kv_cache="not a cache"), TypeError, "kv_cache must be a KVCache"),
    (dict(kv_cache="heads"), ValueError, r"kv_cache layout .*\(2, 4, 3, 3\).*\(2, 2, 3, 3\)"),
    (dict(kv_cache="batch"), ValueError, r"kv_cache layout .*\(3, 2, 3, 3\)"),
    (dict(kv_cache="context"), ValueError, "context and kv_cache"),
    (dict(kv_cache="head_dim"), ValueError, r"kv_cache layout .*\(2, 2, 4, 3\)"),
    (dict(kv_cache="value_dim"), ValueError, r"kv_cache layout .*\(2, 2, 3, 2\)"),
    (dict(kv_cache="upper_left"), ValueError, "upper_left"),
]


@pytest.mark.parametrize("change, exc, match", ERRORS,
                         ids=[f"{list(c)[0]}={list(c.values())[0]!r}"[:40] for c, *_ in ERRORS])
def test_errors(rng, change, exc, match):
    kw, ctx = _base(rng)
    change = dict(change)
    special = {
        ("x", "1d"): lambda: kw.update(x=kw["x"][0, 0]),
        ("x", "4d"): lambda: kw.update(x=kw["x"][None]),
        ("x", "complex"): lambda: kw.update(x=kw["x"] + 0j),
        ("w_q", "wrong_rows"): lambda: kw.update(w_q=kw["w_q"][:11]),
        ("w_q", "wrong_cols"): lambda: kw.update(w_q=np.zeros((12, 13))),
        ("w_q", "1d"): lambda: kw.update(w_q=kw["w_q"][0]),
        ("w_k", "wrong_cols"): lambda: kw.update(w_k=np.zeros((12, 8))),
        ("w_k", "wrong_rows"): lambda: kw.update(w_k=kw["w_k"][:11]),
        ("w_v", "wrong_cols"): lambda: kw.update(w_v=np.zeros((12, 7))),
        ("w_o", "wrong_rows"): lambda: kw.update(w_o=kw["w_o"][:11]),
        ("w_o", "1d"): lambda: kw.update(w_o=kw["w_o"][0]),
        ("context", "2d"): lambda: kw.update(context=ctx[0]),
        ("context", "batch"): lambda: kw.update(context=ctx[:1]),
        ("context", "width"): lambda: kw.update(context=ctx[..., :4]),
        ("kv_cache", "dtype"): lambda: kw.update(kv_cache=KVCache(2, 2, 3, 8)),
        ("kv_cache", "heads"): lambda: kw.update(kv_cache=KVCache(2, 4, 3, 8, np.float64)),
        ("kv_cache", "batch"): lambda: kw.update(kv_cache=KVCache(3, 2, 3, 8, np.float64)),
        ("kv_cache", "head_dim"): lambda: kw.update(
            kv_cache=KVCache(2, 2, 4, 8, np.float64, value_dim=3)),
        ("kv_cache", "value_dim"): lambda: kw.update(
            kv_cache=KVCache(2, 2, 3, 8, np.float64, value_dim=2)),
        ("kv_cache", "not a cache"): lambda: kw.update(kv_cache=object()),
        ("kv_cache", "context"): lambda: kw.update(kv_cache=KVCache(2, 2, 3, 8, np.float64),
                                                   context=ctx),
        ("kv_cache", "upper_left"): lambda: kw.update(kv_cache=KVCache(2, 2, 3, 8, np.float64),
                                                      is_causal="upper_left"),
    }
    for key, value in change.items():
        if isinstance(value, str) and (key, value) in special:
            special[(key, value)]()
        else:
            kw[key] = value
    caches = [kw["kv_cache"]] if isinstance(kw.get("kv_cache"), KVCache) else []
    with pytest.raises(exc, match=match):
        multi_head_attention(**kw)
    for cache in caches:
        assert len(cache) == 0
