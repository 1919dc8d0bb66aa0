"""fastattn.attention against fastattn.reference.attention: property tests.

Hypothesis draws shapes (including 1 and odd sizes), leading dims that
broadcast, dtypes, masks, causal alignments, key padding, scales and memory
layouts; a second strategy picks sizes around the kernels' register tiles and
cache blocks, a third grouped-query heads.  Every test runs on every ISA path
the machine supports (the ``isa`` fixture).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from conftest import (
    CAUSAL,
    FLOAT_DTYPES,
    LAYOUTS,
    _sub_batch,
    assert_close,
    check_against_reference,
    empty_with_layout,
    examples,
    finite_absmax,
    relayout,
)


@st.composite
def attention_cases(draw, max_len=11, max_dim=9):
    """Keyword arguments for one attention call (arrays built from a seed)."""
    L = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len))
    E = draw(st.integers(1, max_dim))
    Ev = draw(st.one_of(st.just(E), st.integers(1, max_dim)))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    kpm_kind = draw(st.sampled_from([None, None, "1d", "2d"]))
    if kpm_kind == "2d" and not batch:
        kpm_kind = "1d"
    if kpm_kind == "2d":
        # N = query.shape[0]: the query carries every leading dim.
        qb = batch
    else:
        qb = _sub_batch(draw, batch)
    kb = _sub_batch(draw, batch)
    vb = _sub_batch(draw, batch)
    full = np.broadcast_shapes(qb, kb, vb)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    vscale = draw(st.sampled_from([1.0, 1.0, 0.01, 100.0]))
    case = dict(
        query=rng.standard_normal(qb + (L, E)),
        key=rng.standard_normal(kb + (S, E)),
        value=rng.standard_normal(vb + (S, Ev)) * vscale,
    )
    mask_kind = draw(st.sampled_from([None, "bool", "float", "float_neginf"]))
    if mask_kind is not None:
        mshape_full = full + (L, S)
        mdims = [n if draw(st.booleans()) else 1 for n in mshape_full]
        mdrop = draw(st.integers(0, len(mdims) - 1))
        mshape = tuple(mdims[mdrop:])
        if mask_kind == "bool":
            p = draw(st.sampled_from([0.3, 0.7, 0.9, 1.0]))
            mask = rng.random(mshape) < p
        else:
            mask = rng.standard_normal(mshape) * draw(st.sampled_from([0.5, 3.0]))
            if mask_kind == "float_neginf":
                mask[rng.random(mshape) < 0.3] = -np.inf
        case["attn_mask"] = mask
    case["is_causal"] = draw(st.sampled_from(CAUSAL))
    if kpm_kind == "1d":
        case["key_padding_mask"] = rng.random(S) < 0.3
    elif kpm_kind == "2d":
        case["key_padding_mask"] = rng.random((qb[0], S)) < 0.3
    case["scale"] = draw(st.one_of(st.none(), st.just(0.0),
                                   st.floats(-1.5, 1.5, allow_nan=False, width=32)))
    case["layouts"] = tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(4))
    case["return_weights"] = draw(st.booleans())
    case["num_threads"] = draw(st.sampled_from([None, 1, 2, 3]))
    case["use_out"] = draw(st.sampled_from([None, None, "C", "sliced", "negative", "F"]))
    return case


def _run_case(case, dtype):
    case = dict(case)
    lay = case.pop("layouts")
    use_out = case.pop("use_out")
    q = relayout(case.pop("query").astype(dtype), lay[0])
    k = relayout(case.pop("key").astype(dtype), lay[1])
    v = relayout(case.pop("value").astype(dtype), lay[2])
    mask = case.pop("attn_mask", None)
    if mask is not None:
        if mask.dtype != bool:
            mask = mask.astype(dtype)
        mask = relayout(mask, lay[3])
    if use_out is not None:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        out, parent = empty_with_layout(batch + (q.shape[-2], v.shape[-1]), dtype, use_out, -7.0)
        before = parent.copy()
        case["out"] = out
    check_against_reference(q, k, v, mask, **case)
    if use_out is not None and use_out == "sliced":
        # nothing outside the view was written
        untouched = np.ones(parent.shape, dtype=bool)
        untouched[tuple(slice(1, 2 * n, 2) for n in out.shape)] = False
        np.testing.assert_array_equal(parent[untouched], before[untouched])


# ---------------------------------------------------------------------------
# property tests
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@given(case=attention_cases())
def test_matches_reference_random(isa, dtype, case):
    _run_case(case, dtype)


@pytest.mark.parametrize("dtype", [np.float16], ids=["float16"])
@settings(max_examples=examples(40))
@given(case=attention_cases(max_len=7, max_dim=6))
def test_matches_reference_random_float16(isa, dtype, case):
    _run_case(case, dtype)


@st.composite
def block_boundary_cases(draw):
    """Sizes around the kernels' register tiles and cache blocks (8-32, 64, 256, 512)."""
    L = draw(st.sampled_from([1, 2, 7, 63, 64, 65, 129, 200]))
    S = draw(st.sampled_from([1, 15, 16, 17, 33, 255, 256, 257, 300, 513, 600]))
    E = draw(st.sampled_from([1, 3, 8, 15, 16, 17, 32, 64, 65, 100]))
    Ev = draw(st.sampled_from([1, 7, 16, 31, 64, 65]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    case = dict(
        query=rng.standard_normal((1, L, E)),
        key=rng.standard_normal((1, S, E)),
        value=rng.standard_normal((1, S, Ev)),
        is_causal=draw(st.sampled_from(CAUSAL)),
        scale=draw(st.sampled_from([None, 0.0, 0.25])),
    )
    mk = draw(st.sampled_from([None, "bool", "float"]))
    if mk == "bool":
        case["attn_mask"] = rng.random((L, S)) < draw(st.sampled_from([0.05, 0.5, 0.95]))
    elif mk == "float":
        m = rng.standard_normal((L, S))
        m[rng.random((L, S)) < 0.2] = -np.inf
        case["attn_mask"] = m
    if draw(st.booleans()):
        kpm = np.zeros(S, bool)
        a = draw(st.integers(0, S - 1))
        kpm[a: a + draw(st.integers(1, S))] = True   # a padded run of keys
        case["key_padding_mask"] = kpm
    case["layouts"] = (draw(st.sampled_from(LAYOUTS)), "C", draw(st.sampled_from(["C", "F"])), "C")
    case["return_weights"] = True
    case["num_threads"] = draw(st.sampled_from([None, 1, 2]))
    case["use_out"] = None
    return case


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@settings(max_examples=examples(30))
@given(case=block_boundary_cases())
def test_matches_reference_random_block_sizes(isa, dtype, case):
    _run_case(case, dtype)


@st.composite
def gqa_cases(draw):
    Hq = draw(st.sampled_from([2, 4, 6, 8]))
    Hkv = draw(st.sampled_from([d for d in range(1, Hq + 1) if Hq % d == 0]))
    B = draw(st.sampled_from([(), (1,), (2,)]))
    L = draw(st.integers(1, 9))
    S = draw(st.integers(1, 9))
    E = draw(st.integers(1, 6))
    Ev = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    case = dict(
        query=rng.standard_normal(B + (Hq, L, E)),
        key=rng.standard_normal(B + (Hkv, S, E)),
        value=rng.standard_normal(B + (Hkv, S, Ev)),
        is_causal=draw(st.sampled_from(CAUSAL)),
        scale=draw(st.sampled_from([None, 0.7])),
    )
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    mshape = draw(st.sampled_from([(Hq, L, S), (1, L, S), (L, S), (Hq, 1, S)]))
    if mask_kind == "bool":
        case["attn_mask"] = rng.random(mshape) < 0.7
    elif mask_kind == "float":
        m = rng.standard_normal(mshape)
        m[rng.random(mshape) < 0.2] = -np.inf
        case["attn_mask"] = m
    if draw(st.booleans()):
        case["key_padding_mask"] = rng.random(S) < 0.3
    return case


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@settings(max_examples=examples(100))
@given(case=gqa_cases())
def test_gqa_matches_reference_random(isa, dtype, case):
    case = dict(case)
    q = case.pop("query").astype(dtype)
    k = case.pop("key").astype(dtype)
    v = case.pop("value").astype(dtype)
    mask = case.pop("attn_mask", None)
    if mask is not None and mask.dtype != bool:
        mask = mask.astype(dtype)
    got_o, got_w = check_against_reference(q, k, v, mask, enable_gqa=True, **case)
    # same as repeating the kv heads by hand
    rep = q.shape[-3] // k.shape[-3]
    o2, w2 = fastattn.attention(q, np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3), mask,
                                return_weights=True, **case)
    assert_close(got_o, o2, dtype, magnitude=finite_absmax(v))
    assert_close(got_w, w2, dtype)
