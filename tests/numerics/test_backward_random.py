"""attention_backward against fastattn.reference.attention_backward: a
property test.  Hypothesis draws shapes around the backward's blocks
(FA_BW_MQ query rows, FA_KC keys), heads and grouped-query heads, the causal
alignment, a window, a boolean or float mask (then its gradient too, from any
shape it broadcasts from, the batch in one call or in chunks of one to three
indices' mask gradients), the score options and grad_lse; float64, the bound
of test_backward.py (1e-12 of the largest gradient entry), on every ISA
path."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from conftest import examples
from fastattn import backward, reference


@st.composite
def backward_cases(draw):
    L = draw(st.sampled_from([1, 2, 7, 63, 64, 65, 130]))
    S = draw(st.sampled_from([1, 3, 31, 127, 128, 129, 200]))
    E, Ev = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    hkv = draw(st.integers(1, 2))
    g = draw(st.integers(1, 3))
    opts = {"is_causal": draw(st.sampled_from([False, True, "lower_right"]))}
    if draw(st.booleans()):
        opts["window"] = (draw(st.one_of(st.none(), st.integers(0, 80))),
                          draw(st.one_of(st.none(), st.integers(0, 80))))
    if draw(st.booleans()):
        opts["softcap"] = draw(st.sampled_from([0.5, 2.0, 30.0]))
    if draw(st.booleans()):
        opts["alibi_slopes"] = np.linspace(0.01, 0.3, hkv * g)
    if draw(st.booleans()):
        opts["sinks"] = np.linspace(-1.0, 1.0, hkv * g)
    mask = draw(st.sampled_from([None, "bool", "float"]))
    if mask == "bool":
        opts["attn_mask"] = np.random.default_rng(L * S).random((L, S)) < 0.7
    elif mask == "float":
        shape = draw(st.sampled_from([(L, S), (S,), (1, hkv * g, L, S), (2, 1, L, S),
                                      (2, hkv * g, 1, S)]))
        bias = np.random.default_rng(L + S).standard_normal(shape)
        bias[..., ::5] = np.where(bias[..., ::5] > 1.0, -np.inf, bias[..., ::5])
        opts["attn_mask"] = bias
        opts["return_mask_grad"] = draw(st.booleans())
    # the bound on the mask gradients held at once (None: the default, one call here)
    chunk = draw(st.sampled_from([None, 1, 3 * L * S * 8]))
    return L, S, E, Ev, hkv, g, draw(st.booleans()), draw(st.integers(0, 2**16)), chunk, opts


@settings(max_examples=examples(60))
@given(case=backward_cases())
def test_backward_matches_reference(isa, case):
    L, S, E, Ev, hkv, g, with_glse, seed, chunk, opts = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, hkv * g, L, E))
    k, v = rng.standard_normal((2, hkv, S, E)), rng.standard_normal((2, hkv, S, Ev))
    fwd = {n: x for n, x in opts.items() if n != "return_mask_grad"}
    out, lse = fastattn.attention(q, k, v, enable_gqa=True, return_lse=True, **fwd)
    d_o = rng.standard_normal(out.shape)
    g_lse = rng.standard_normal(lse.shape) if with_glse else None
    default = backward.MASK_GRAD_CHUNK_BYTES
    backward.MASK_GRAD_CHUNK_BYTES = chunk or default
    try:
        got = fastattn.attention_backward(d_o, q, k, v, out, lse, enable_gqa=True,
                                          grad_lse=g_lse, **opts)
    finally:
        backward.MASK_GRAD_CHUNK_BYTES = default
    want = reference.attention_backward(d_o, q, k, v, out, lse, enable_gqa=True,
                                        grad_lse=g_lse, **opts)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1.0, np.abs(b).max()))
