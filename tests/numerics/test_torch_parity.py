"""fastattn.attention against torch.nn.functional.scaled_dot_product_attention.

Skipped cleanly when torch is not installed.  Rows with no visible key are
compared only against fastattn's documented zeros (torch's result for them
depends on the backend), everything else against torch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fastattn  # noqa: E402
from conftest import CAUSAL, assert_close, examples, finite_absmax, hidden_positions  # noqa: E402


def _torch_sdpa(q, k, v, mask=None, *, is_causal=False, key_padding_mask=None, scale=None,
                enable_gqa=False):
    """torch SDPA with our mask conventions folded into one attn_mask."""
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2] if not enable_gqa else q.shape[:-2],
                                v.shape[:-2] if not enable_gqa else q.shape[:-2])
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    # torch needs matching leading dims for q/k/v in some backends: broadcast explicitly
    if not enable_gqa:
        tq = tq.expand(batch + (L, q.shape[-1]))
        tk = tk.expand(batch + (S, k.shape[-1]))
        tv = tv.expand(batch + (S, v.shape[-1]))
    tmask = None
    extra_hidden = None
    if is_causal == "lower_right" or key_padding_mask is not None:
        extra_hidden = hidden_positions(L, S, batch, is_causal=is_causal,
                                        key_padding_mask=key_padding_mask)
        is_causal_t = False
    else:
        is_causal_t = bool(is_causal)
    if mask is not None:
        m = np.asarray(mask)
        if extra_hidden is not None:
            if m.dtype == bool:
                m = m & ~extra_hidden
            else:
                m = np.where(extra_hidden, -np.inf, m).astype(q.dtype)
        tmask = torch.from_numpy(np.ascontiguousarray(m))
    elif extra_hidden is not None:
        tmask = torch.from_numpy(np.ascontiguousarray(~extra_hidden))
    if is_causal_t and scale == 0.0 and tmask is None:
        # torch's CPU flash kernel scales the hidden keys' -inf by a zero
        # scale (NaN rows, where its math path gives the softmax of zeros):
        # the causal mask as a bool mask instead
        tmask = torch.from_numpy(np.ascontiguousarray(np.tril(np.ones((L, S), bool))))
        is_causal_t = False
    if is_causal_t and tmask is not None:
        # torch forbids attn_mask together with is_causal: fold it in
        tri = np.tril(np.ones((L, S), bool))
        m = np.asarray(tmask.numpy())
        m = (m & tri) if m.dtype == bool else np.where(tri, m, -np.inf).astype(m.dtype)
        tmask = torch.from_numpy(np.ascontiguousarray(m))
        is_causal_t = False
    kw = {}
    if enable_gqa:
        kw["enable_gqa"] = True
    res = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, is_causal=is_causal_t,
                                         scale=scale, **kw)
    return res.numpy()


def _dead_rows(q, k, v, mask, **kw):
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]) \
        if not kw.get("enable_gqa") else q.shape[:-2]
    hid = hidden_positions(L, S, batch, is_causal=kw.get("is_causal", False), attn_mask=mask,
                           key_padding_mask=kw.get("key_padding_mask"))
    return hid.all(axis=-1)


def _compare(q, k, v, mask=None, factor=1.0, **kw):
    dtype = np.result_type(q, k, v)
    got = fastattn.attention(q, k, v, mask, **kw)
    exp = _torch_sdpa(q, k, v, mask, **kw)
    dead = _dead_rows(q, k, v, mask, **kw)
    assert got.shape == exp.shape
    assert np.all(got[dead] == 0)
    assert_close(got[~dead], exp[~dead], dtype, magnitude=finite_absmax(v), factor=factor)


@st.composite
def torch_cases(draw):
    L = draw(st.integers(1, 10))
    S = draw(st.integers(1, 10))
    E = draw(st.integers(1, 8))
    Ev = draw(st.integers(1, 8))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    case = dict(q=rng.standard_normal(batch + (L, E)), k=rng.standard_normal(batch + (S, E)),
                v=rng.standard_normal(batch + (S, Ev)))
    mk = draw(st.sampled_from([None, "bool", "float"]))
    if mk == "bool":
        case["mask"] = rng.random((L, S)) < 0.7
    elif mk == "float":
        m = rng.standard_normal(batch + (L, S))
        m[rng.random(m.shape) < 0.2] = -np.inf
        case["mask"] = m
    case["is_causal"] = draw(st.sampled_from(CAUSAL))
    if batch and draw(st.booleans()):
        case["key_padding_mask"] = rng.random((batch[0], S)) < 0.3
    case["scale"] = draw(st.sampled_from([None, 0.0, 0.3, 1.7]))
    return case


@settings(max_examples=examples(100))
@given(case=torch_cases())
def test_matches_torch_random(dtype, case):
    case = dict(case)
    q, k, v = (case.pop(n).astype(dtype) for n in "qkv")
    mask = case.pop("mask", None)
    if mask is not None and mask.dtype != bool:
        mask = mask.astype(dtype)
    _compare(q, k, v, mask, **case)


def test_torch_walkthrough(dtype):
    x = np.array([[1, 0], [0, 1], [1, 1]], dtype)
    _compare(x, x, x)
    _compare(x, x, x, is_causal=True)


@pytest.mark.parametrize("L,S", [(1, 9), (4, 9), (9, 9), (9, 4), (300, 517)])
def test_torch_causal(dtype, L, S):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(2, L, 32), (2, S, 32), (2, S, 16)])
    _compare(q, k, v, is_causal=True, factor=2.5)
    _compare(q, k, v, is_causal="lower_right", factor=2.5)


def test_torch_causal_lower_right_bias(dtype):
    """Against torch's own causal_lower_right bias (L <= S only)."""
    bias = pytest.importorskip("torch.nn.attention.bias")
    rng = np.random.default_rng(3)
    L, S = 5, 12
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(2, 3, L, 8), (2, 3, S, 8), (2, 3, S, 4)])
    exp = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                         attn_mask=bias.causal_lower_right(L, S)).numpy()
    got = fastattn.attention(q, k, v, is_causal="lower_right")
    assert_close(got, exp, dtype, magnitude=finite_absmax(v))


@pytest.mark.parametrize("hkv", [8, 2, 1])
def test_torch_gqa(dtype, hkv):
    rng = np.random.default_rng(hkv)
    q = rng.standard_normal((2, 8, 7, 16)).astype(dtype)
    k = rng.standard_normal((2, hkv, 11, 16)).astype(dtype)
    v = rng.standard_normal((2, hkv, 11, 8)).astype(dtype)
    m = rng.random((2, 8, 7, 11)) < 0.7
    got = fastattn.attention(q, k, v, m, enable_gqa=True)
    exp = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                         attn_mask=torch.from_numpy(m), enable_gqa=True).numpy()
    dead = ~m.any(-1)
    assert np.all(got[dead] == 0)
    assert_close(got[~dead], exp[~dead], dtype, magnitude=finite_absmax(v))


def test_torch_large(dtype):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(1, 2, 300, 64), (1, 2, 517, 64), (1, 2, 517, 64)])
    m = rng.standard_normal((300, 517)).astype(dtype)
    _compare(q, k, v, m, factor=2.5)
    _compare(q, k, v, scale=0.05, factor=2.5)


def test_torch_float16_inputs():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in [(2, 9, 16), (2, 13, 16), (2, 13, 8)])
    got = fastattn.attention(q, k, v, is_causal=True)
    assert got.dtype == np.float16
    exp = F.scaled_dot_product_attention(*(torch.from_numpy(a.astype(np.float32)) for a in (q, k, v)),
                                         is_causal=True).numpy()
    assert_close(got, exp, np.float16, magnitude=finite_absmax(v))
