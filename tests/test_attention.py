"""fastattn.attention against fastattn.reference.attention.

Property tests (hypothesis) over shapes (including 1 and odd sizes), leading
dims that broadcast, dtypes, masks, causal alignments, key padding, scales and
memory layouts, plus named edge cases.  Every numeric test runs on every ISA
path the machine supports (the ``isa`` fixture) and in float32 and float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from conftest import (
    FLOAT_DTYPES,
    examples,
    LAYOUTS,
    assert_close,
    empty_with_layout,
    expected_result_dtype,
    finite_absmax,
    hidden_positions,
    reference_attention64,
    relayout,
    tol_for,
)

CAUSAL = (False, True, "upper_left", "lower_right")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _randn(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def check_against_reference(query, key, value, attn_mask=None, *, factor=1.0, **kwargs):
    """Run fastattn and the (float64) reference and compare everything.

    Checks: output dtype and shape, output values, weights values, that
    positions hidden by a mask get weight exactly 0, that rows with no visible
    key give exactly 0 output, and that ``out`` (if given) is returned and
    filled.
    """
    out = kwargs.get("out")
    return_weights = kwargs.pop("return_weights", True)
    exp_o, exp_w = reference_attention64(query, key, value, attn_mask, **kwargs)
    res = fastattn.attention(query, key, value, attn_mask, return_weights=return_weights, **kwargs)
    if return_weights:
        assert isinstance(res, tuple) and len(res) == 2
        got_o, got_w = res
    else:
        got_o, got_w = res, None
    dtype = expected_result_dtype(query, key, value)
    assert isinstance(got_o, np.ndarray)
    assert got_o.dtype == dtype, (got_o.dtype, dtype)
    assert got_o.shape == exp_o.shape, (got_o.shape, exp_o.shape)
    if out is not None:
        assert got_o is out
    mag = finite_absmax(value)
    assert_close(got_o, exp_o, dtype, magnitude=mag, factor=factor, err_msg="output")
    # rows that see no key are exactly zero, never NaN
    dead = np.all(exp_w == 0, axis=-1) & np.all(exp_o == 0, axis=-1)
    assert np.all(got_o[dead] == 0)
    if got_w is not None:
        assert got_w.dtype == dtype
        assert got_w.shape == exp_w.shape
        assert_close(got_w, exp_w, dtype, factor=factor, err_msg="weights")
        L, S = got_w.shape[-2:]
        hidden = hidden_positions(
            L, S, got_w.shape[:-2], is_causal=kwargs.get("is_causal", False),
            attn_mask=attn_mask, key_padding_mask=kwargs.get("key_padding_mask"))
        assert np.all(got_w[hidden] == 0), "a hidden position got a non-zero weight"
    return got_o, got_w


def _sub_batch(draw, batch):
    """Leading dims that broadcast to ``batch``: some dims 1, some dropped."""
    dims = [n if draw(st.booleans()) else 1 for n in batch]
    drop = draw(st.integers(0, len(dims)))
    return tuple(dims[drop:])


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


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------

@pytest.fixture(params=FLOAT_DTYPES, ids=["float32", "float64"])
def dtype(request):
    return request.param


def test_decode_L1(isa, dtype, rng):
    q = _randn(rng, (3, 1, 16), dtype)
    k = _randn(rng, (3, 33, 16), dtype)
    v = _randn(rng, (3, 33, 8), dtype)
    check_against_reference(q, k, v)
    # lower_right: the single query is the last position and sees every key
    o_lr = fastattn.attention(q, k, v, is_causal="lower_right")
    assert_close(o_lr, fastattn.attention(q, k, v), dtype, magnitude=finite_absmax(v))
    # upper_left: it sees only key 0, so the output is value[..., 0, :]
    o_ul, w_ul = fastattn.attention(q, k, v, is_causal=True, return_weights=True)
    assert np.all(w_ul[..., 0] == 1) and np.all(w_ul[..., 1:] == 0)
    assert_close(o_ul[:, 0], v[:, 0], dtype, magnitude=finite_absmax(v))


def test_result_is_a_new_c_ordered_array(isa, dtype, rng):
    # the common path: the bridge allocates the result itself
    q = _randn(rng, (2, 3, 5, 4), dtype)
    k = _randn(rng, (2, 3, 7, 4), dtype)
    v = _randn(rng, (2, 3, 7, 6), dtype)
    o = fastattn.attention(q, k, v)
    assert o.shape == (2, 3, 5, 6) and o.dtype == dtype
    assert o.flags.c_contiguous and o.flags.owndata and o.flags.writeable
    assert not any(np.may_share_memory(o, x) for x in (q, k, v))
    o2 = fastattn.attention(q, k, v)
    assert o2 is not o and np.array_equal(o, o2)
    check_against_reference(q, k, v)


def test_single_key_S1(isa, dtype, rng):
    q = _randn(rng, (2, 7, 5), dtype)
    k = _randn(rng, (2, 1, 5), dtype)
    v = _randn(rng, (2, 1, 3), dtype)
    o, w = check_against_reference(q, k, v)
    assert np.all(w == 1)
    assert_close(o, np.broadcast_to(v, o.shape), dtype, magnitude=finite_absmax(v))


def test_E1(isa, dtype, rng):
    check_against_reference(_randn(rng, (4, 1), dtype), _randn(rng, (6, 1), dtype),
                            _randn(rng, (6, 1), dtype))
    check_against_reference(_randn(rng, (2, 5, 1), dtype), _randn(rng, (2, 9, 1), dtype),
                            _randn(rng, (2, 9, 4), dtype), is_causal="lower_right")


def test_L1_S1_E1(isa, dtype):
    q = np.array([[2.0]], dtype)
    o, w = fastattn.attention(q, q, np.array([[-3.5]], dtype), return_weights=True)
    assert o.shape == (1, 1) and w.shape == (1, 1)
    assert o[0, 0] == -3.5 and w[0, 0] == 1


def test_Ev_differs_from_E(isa, dtype, rng):
    for E, Ev in [(8, 3), (3, 17), (1, 64), (65, 1), (33, 31)]:
        check_against_reference(_randn(rng, (2, 9, E), dtype), _randn(rng, (2, 13, E), dtype),
                                _randn(rng, (2, 13, Ev), dtype), is_causal=True)


def test_odd_sizes(isa, dtype, rng):
    for L, S, E in [(1, 1, 1), (3, 5, 7), (17, 15, 9), (31, 33, 13), (65, 63, 3), (2, 129, 5)]:
        check_against_reference(_randn(rng, (L, E), dtype), _randn(rng, (S, E), dtype),
                                _randn(rng, (S, E + 2), dtype))


def test_far_negative_scores_with_a_key_count_off_the_register_tile(isa, dtype, rng):
    # Every score near -1000: the row max must be the visible scores' own,
    # not 0 from the zero-padded key columns of a partial register tile (Q.K^T's
    # fused row max is not used for such tiles), or every weight underflows.
    for S in (5, 17, 130):
        q = np.ones((12, 4), dtype)
        k = (-500.0 - 0.25 * rng.random((S, 4))).astype(dtype)
        check_against_reference(q, k, _randn(rng, (S, 3), dtype), return_weights=False)


def test_broadcast_leading_dims(isa, dtype, rng):
    q = _randn(rng, (2, 1, 5, 4), dtype)
    k = _randn(rng, (1, 3, 7, 4), dtype)
    v = _randn(rng, (1, 3, 7, 6), dtype)
    o, w = check_against_reference(q, k, v)
    assert o.shape == (2, 3, 5, 6) and w.shape == (2, 3, 5, 7)
    # each (b, h) equals the 2-D call
    for b in range(2):
        for h in range(3):
            o2 = fastattn.attention(q[b, 0], k[0, h], v[0, h])
            assert_close(o[b, h], o2, dtype, magnitude=finite_absmax(v))


def test_broadcast_fewer_dims(isa, dtype, rng):
    # 2-D query against batched keys, and a value with fewer leading dims
    check_against_reference(_randn(rng, (5, 4), dtype), _randn(rng, (2, 3, 7, 4), dtype),
                            _randn(rng, (3, 7, 2), dtype))
    check_against_reference(_randn(rng, (2, 3, 5, 4), dtype), _randn(rng, (7, 4), dtype),
                            _randn(rng, (1, 7, 2), dtype))


def test_broadcast_mask_adds_no_batch(isa, dtype, rng):
    q = _randn(rng, (2, 3, 6, 4), dtype)
    k = _randn(rng, (2, 3, 8, 4), dtype)
    v = _randn(rng, (2, 3, 8, 5), dtype)
    for mshape in [(8,), (6, 1), (1, 8), (6, 8), (3, 6, 8), (2, 1, 1, 8), (2, 3, 6, 8), (1, 1, 6, 8)]:
        m = rng.random(mshape) < 0.6
        check_against_reference(q, k, v, m)
        fm = rng.standard_normal(mshape).astype(dtype)
        check_against_reference(q, k, v, fm, is_causal="lower_right")


def test_zero_stride_inputs(isa, dtype, rng):
    """np.broadcast_to views (stride 0) as query, key, value and mask."""
    q = np.broadcast_to(_randn(rng, (1, 5), dtype), (2, 3, 4, 5))
    k = np.broadcast_to(_randn(rng, (1, 6, 5), dtype), (2, 3, 6, 5))[1]
    v = np.broadcast_to(_randn(rng, (6, 1), dtype), (3, 6, 3))
    m = np.broadcast_to(rng.random((1, 6)) < 0.5, (4, 6))
    check_against_reference(q, k, v, m)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_noncontiguous_inputs(isa, dtype, rng, layout):
    q = _randn(rng, (2, 3, 9, 5), dtype)
    k = _randn(rng, (2, 3, 11, 5), dtype)
    v = _randn(rng, (2, 3, 11, 7), dtype)
    m = rng.standard_normal((3, 9, 11)).astype(dtype)
    expected = fastattn.attention(q, k, v, m, is_causal="lower_right")
    got = fastattn.attention(relayout(q, layout), relayout(k, layout), relayout(v, layout),
                             relayout(m, layout), is_causal="lower_right")
    assert_close(got, expected, dtype, magnitude=finite_absmax(v))
    check_against_reference(relayout(q, layout), relayout(k, layout), relayout(v, layout),
                            relayout(m, layout), is_causal="lower_right")


def test_transposed_views(isa, dtype, rng):
    """Inputs that are transposes of other arrays (e.g. k stored as (E, S))."""
    q = _randn(rng, (6, 9), dtype).T          # (9, 6) F-order
    k = np.swapaxes(_randn(rng, (2, 6, 13), dtype), -1, -2)  # (2, 13, 6)
    v = _randn(rng, (4, 13, 2), dtype).transpose(2, 1, 0)    # (2, 13, 4)
    check_against_reference(q, k, v, is_causal=True)


@pytest.mark.parametrize("shape", [(300, 517, 64, 48), (257, 300, 33, 65), (5, 1100, 40, 24)])
def test_large_crosses_block_boundaries(isa, dtype, rng, shape):
    L, S, E, Ev = shape
    q = _randn(rng, (2, L, E), dtype)
    k = _randn(rng, (2, S, E), dtype)
    v = _randn(rng, (2, S, Ev), dtype)
    m = rng.standard_normal((L, S)).astype(dtype)
    m[rng.random((L, S)) < 0.1] = -np.inf
    kpm = rng.random((2, S)) < 0.05
    check_against_reference(q, k, v, m, is_causal="lower_right", key_padding_mask=kpm,
                            factor=2.5)
    check_against_reference(q, k, v, None, return_weights=False, factor=2.5)


def test_large_decode_split_keys(isa, dtype, rng):
    """Few query rows and many keys: the path that splits keys across chunks."""
    q = _randn(rng, (1, 2, 1, 64), dtype)
    k = _randn(rng, (1, 2, 2333, 64), dtype)
    v = _randn(rng, (1, 2, 2333, 64), dtype)
    kpm = np.zeros(2333, dtype=bool)
    kpm[1000:1600] = True
    check_against_reference(q, k, v, factor=2.5)
    check_against_reference(q, k, v, key_padding_mask=kpm, is_causal="lower_right", factor=2.5)
    # the first 600 keys are all hidden -> still fine
    m = np.ones(2333, dtype=bool)
    m[:600] = False
    check_against_reference(q, k, v, m, factor=2.5)


# ---------------------------------------------------------------------------
# causal alignment
# ---------------------------------------------------------------------------

def test_is_causal_true_equals_upper_left(isa, dtype, rng):
    for L, S in [(4, 9), (9, 4), (6, 6)]:
        q, k, v = _randn(rng, (L, 3), dtype), _randn(rng, (S, 3), dtype), _randn(rng, (S, 2), dtype)
        a = fastattn.attention(q, k, v, is_causal=True, return_weights=True)
        b = fastattn.attention(q, k, v, is_causal="upper_left", return_weights=True)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        check_against_reference(q, k, v, is_causal=True)


def test_lower_right_causal_L_gt_S(isa, dtype, rng):
    L, S = 7, 4
    q, k, v = _randn(rng, (2, L, 5), dtype), _randn(rng, (2, S, 5), dtype), _randn(rng, (2, S, 3), dtype)
    o, w = check_against_reference(q, k, v, is_causal="lower_right")
    # query i sees key j iff j <= i + S - L = i - 3: rows 0..2 see nothing
    assert np.all(o[:, :3] == 0) and np.all(w[:, :3] == 0)
    assert not np.any(np.isnan(o)) and not np.any(np.isnan(w))
    # the last row sees every key, row 3 only key 0
    assert np.all(w[:, 3, 0] == 1)
    assert_close(o[:, 3], v[:, 0], dtype, magnitude=finite_absmax(v))
    np.testing.assert_allclose(w[:, 3:].sum(-1), 1, atol=10 * tol_for(dtype))


def test_lower_right_causal_L_lt_S(isa, dtype, rng):
    L, S = 4, 10
    q, k, v = _randn(rng, (L, 5), dtype), _randn(rng, (S, 5), dtype), _randn(rng, (S, 3), dtype)
    o, w = check_against_reference(q, k, v, is_causal="lower_right")
    for i in range(L):
        assert np.all(w[i, i + S - L + 1:] == 0)
        assert np.all(w[i, : i + S - L + 1] > 0)


def test_upper_left_causal_L_gt_S(isa, dtype, rng):
    L, S = 9, 4
    q, k, v = _randn(rng, (L, 5), dtype), _randn(rng, (S, 5), dtype), _randn(rng, (S, 3), dtype)
    o, w = check_against_reference(q, k, v, is_causal="upper_left")
    # rows >= S see every key: same as unmasked
    full = fastattn.attention(q, k, v)
    assert_close(o[S:], full[S:], dtype, magnitude=finite_absmax(v))


def test_upper_left_causal_L_lt_S(isa, dtype, rng):
    L, S = 4, 10
    q, k, v = _randn(rng, (L, 5), dtype), _randn(rng, (S, 5), dtype), _randn(rng, (S, 3), dtype)
    o, w = check_against_reference(q, k, v, is_causal="upper_left")
    assert np.all(w[:, L:] == 0)


@pytest.mark.parametrize("L,S", [(131, 131), (200, 77), (77, 200), (259, 259), (3, 200)])
@pytest.mark.parametrize("causal", [True, "lower_right"])
def test_causal_diagonal_bands_each_see_their_own_keys(isa, dtype, rng, L, S, causal):
    """Streaming path: a tile the causal diagonal crosses is computed in bands
    of register-tile rows, each over only the keys its last row sees.  Every
    row (a band's first and last, rows past a band's end in a short tile)
    matches the reference, rows with no visible key give 0, and a poisoned
    key (K and V Inf/NaN) leaks into no row it is hidden from."""
    q, k, v = _randn(rng, (2, L, 12), dtype), _randn(rng, (2, S, 12), dtype), _randn(rng, (2, S, 5), dtype)
    kpm = np.zeros(S, dtype=bool)
    kpm[:2] = True            # rows that see only keys 0 and 1 see nothing
    check_against_reference(q, k, v, is_causal=causal, key_padding_mask=kpm, return_weights=False)
    off = 0 if causal is True else S - L
    j = min(S - 1, max(0, L // 2 + off))     # a key visible only to rows i >= j - off
    k[:, j], v[:, j] = np.inf, np.nan
    o = fastattn.attention(q, k, v, is_causal=causal, key_padding_mask=kpm)
    hidden = slice(0, max(0, j - off))
    assert np.all(np.isfinite(o[:, hidden])), "a key hidden by the causal mask leaked"
    o_ref, _ = reference_attention64(q, k, v, is_causal=causal, key_padding_mask=kpm)
    assert_close(o[:, hidden], o_ref[:, hidden], dtype, magnitude=finite_absmax(v))


# ---------------------------------------------------------------------------
# masks and dead rows
# ---------------------------------------------------------------------------

def test_fully_masked_row_gives_zeros(isa, dtype, rng):
    L, S = 5, 6
    q, k, v = _randn(rng, (L, 4), dtype), _randn(rng, (S, 4), dtype), _randn(rng, (S, 3), dtype)
    bm = rng.random((L, S)) < 0.7
    bm[2] = False
    o, w = check_against_reference(q, k, v, bm)
    assert np.all(o[2] == 0) and np.all(w[2] == 0)
    fm = rng.standard_normal((L, S)).astype(dtype)
    fm[1] = -np.inf
    o, w = check_against_reference(q, k, v, fm)
    assert np.all(o[1] == 0) and np.all(w[1] == 0)
    assert not np.any(np.isnan(o)) and not np.any(np.isnan(w))
    np.testing.assert_allclose(np.delete(w, 1, axis=0).sum(-1), 1, atol=10 * tol_for(dtype))


def test_fully_masked_row_with_nan_values_gives_zeros(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 4), dtype), _randn(rng, (5, 4), dtype), _randn(rng, (5, 2), dtype)
    k[1] = np.nan
    v[1] = np.inf
    m = np.zeros((3, 5), dtype=bool)
    m[1, 1] = True     # only row 1 sees the poisoned key
    o, w = fastattn.attention(q, k, v, m, return_weights=True)
    assert np.all(o[[0, 2]] == 0) and np.all(w[[0, 2]] == 0)


def test_all_keys_padded_gives_zeros(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 3, 4), dtype), _randn(rng, (2, 5, 4), dtype), _randn(rng, (2, 5, 3), dtype)
    kpm = np.array([[True] * 5, [False, True, False, True, True]])
    o, w = check_against_reference(q, k, v, key_padding_mask=kpm)
    assert np.all(o[0] == 0) and np.all(w[0] == 0)
    assert np.all(w[1][:, [1, 3, 4]] == 0)


def test_row_hidden_by_combination_gives_zeros(isa, dtype, rng):
    """Each mask alone leaves keys visible; together they hide the row."""
    L = S = 4
    q, k, v = _randn(rng, (1, L, 3), dtype), _randn(rng, (1, S, 3), dtype), _randn(rng, (1, S, 3), dtype)
    kpm = np.array([[True, False, False, False]])           # hides key 0
    bm = np.ones((L, S), dtype=bool)
    bm[1, 1] = False                                         # row 1 loses key 1
    o, w = check_against_reference(q, k, v, bm, is_causal=True, key_padding_mask=kpm)
    # row 0 sees only key 0 (causal) which is padding: dead
    # row 1 sees keys 0, 1: padding + bool mask: dead
    assert np.all(o[0, :2] == 0) and np.all(w[0, :2] == 0)
    assert np.all(w[0, 2:].sum(-1) > 0.99)


def test_key_padding_mask_1d_with_causal_and_bool_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 3, 8, 5), dtype), _randn(rng, (2, 3, 11, 5), dtype), _randn(rng, (2, 3, 11, 4), dtype)
    kpm = rng.random(11) < 0.3
    bm = rng.random((3, 8, 11)) < 0.7
    for causal in CAUSAL:
        check_against_reference(q, k, v, bm, is_causal=causal, key_padding_mask=kpm)


def test_key_padding_mask_2d_with_float_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 2, 8, 5), dtype), _randn(rng, (3, 2, 11, 5), dtype), _randn(rng, (3, 2, 11, 4), dtype)
    kpm = rng.random((3, 11)) < 0.3
    kpm[1] = True   # batch 1 is all padding
    fm = rng.standard_normal((8, 11)).astype(dtype)
    fm[rng.random((8, 11)) < 0.2] = -np.inf
    for causal in CAUSAL:
        o, w = check_against_reference(q, k, v, fm, is_causal=causal, key_padding_mask=kpm)
        assert np.all(o[1] == 0)


def test_key_padding_mask_2d_3d_query(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 6, 5), dtype), _randn(rng, (3, 7, 5), dtype), _randn(rng, (3, 7, 2), dtype)
    kpm = rng.random((3, 7)) < 0.4
    o, w = check_against_reference(q, k, v, key_padding_mask=kpm)
    for n in range(3):
        assert np.all(w[n][:, kpm[n]] == 0)


def test_key_padding_mask_equals_bool_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 4, 6, 5), dtype), _randn(rng, (2, 4, 9, 5), dtype), _randn(rng, (2, 4, 9, 3), dtype)
    kpm = rng.random((2, 9)) < 0.4
    a = fastattn.attention(q, k, v, key_padding_mask=kpm, is_causal=True)
    b = fastattn.attention(q, k, v, ~kpm[:, None, None, :], is_causal=True)
    assert_close(a, b, dtype, magnitude=finite_absmax(v))


def test_additive_mask_with_neg_inf(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 7, 4), dtype), _randn(rng, (2, 9, 4), dtype), _randn(rng, (2, 9, 3), dtype)
    fm = rng.standard_normal((2, 7, 9)).astype(dtype) * 2
    fm[rng.random(fm.shape) < 0.4] = -np.inf
    o, w = check_against_reference(q, k, v, fm)
    assert np.all(w[np.isneginf(fm)] == 0)
    # large finite negative values are not hiding: they give tiny, non-zero weight... or 0 by underflow
    fm2 = np.where(np.isneginf(fm), -30.0, fm).astype(dtype)
    check_against_reference(q, k, v, fm2)


def test_additive_mask_shifts_scores(isa, dtype, rng):
    """A constant additive mask changes nothing; a per-key one is a bias."""
    q, k, v = _randn(rng, (5, 4), dtype), _randn(rng, (6, 4), dtype), _randn(rng, (6, 3), dtype)
    base = fastattn.attention(q, k, v)
    shifted = fastattn.attention(q, k, v, np.full((5, 6), 3.25, dtype))
    assert_close(shifted, base, dtype, magnitude=finite_absmax(v), factor=4)
    check_against_reference(q, k, v, np.linspace(-2, 2, 6).astype(dtype))


def test_float64_mask_with_float32_inputs_keeps_float32(isa, rng):
    q, k, v = (_randn(rng, s, np.float32) for s in [(4, 3), (5, 3), (5, 2)])
    m = rng.standard_normal((4, 5))
    o = fastattn.attention(q, k, v, m)
    assert o.dtype == reference.attention(q, k, v, m).dtype == np.float32
    check_against_reference(q, k, v, m)


def test_bool_mask_all_true_is_no_mask(isa, dtype, rng):
    q, k, v = _randn(rng, (5, 4), dtype), _randn(rng, (6, 4), dtype), _randn(rng, (6, 3), dtype)
    a = fastattn.attention(q, k, v, np.ones((5, 6), dtype=bool))
    b = fastattn.attention(q, k, v)
    assert_close(a, b, dtype, magnitude=finite_absmax(v))


# ---------------------------------------------------------------------------
# NaN / Inf
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["causal", "lower_right", "padding", "padding2d", "bool", "neginf"])
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_hidden_nan_key_has_no_influence(isa, dtype, rng, how, poison):
    """A hidden key's K and V entries can be NaN/Inf: the output is as if the key were absent."""
    L, S, E = 6, 8, 5
    q = _randn(rng, (2, L, E), dtype)
    k = _randn(rng, (2, S, E), dtype)
    v = _randn(rng, (2, S, 3), dtype)
    j = S - 1   # hidden from every row by causal (L < S), or hidden by a mask
    kwargs, mask = {}, None
    if how == "causal":
        kwargs["is_causal"] = True
        keep_rows = slice(None)
    elif how == "lower_right":
        kwargs["is_causal"] = "lower_right"
        keep_rows = slice(None, L - 1)   # only the last row sees key S-1
    elif how == "padding":
        kpm = np.zeros(S, dtype=bool)
        kpm[j] = True
        kwargs["key_padding_mask"] = kpm
        keep_rows = slice(None)
    elif how == "padding2d":
        kpm = np.zeros((2, S), dtype=bool)
        kpm[:, j] = True
        kwargs["key_padding_mask"] = kpm
        keep_rows = slice(None)
    elif how == "bool":
        mask = np.ones((L, S), dtype=bool)
        mask[:, j] = False
        keep_rows = slice(None)
    else:
        mask = np.zeros((L, S), dtype=dtype)
        mask[:, j] = -np.inf
        keep_rows = slice(None)
    clean_o, clean_w = fastattn.attention(q, k, v, mask, return_weights=True, **kwargs)
    k2, v2 = k.copy(), v.copy()
    k2[:, j] = poison
    v2[:, j] = poison
    o, w = fastattn.attention(q, k2, v2, mask, return_weights=True, **kwargs)
    o_ref, w_ref = reference_attention64(q, k2, v2, mask, **kwargs)
    assert not np.any(np.isnan(o[:, keep_rows])), "a hidden NaN/Inf key leaked into the output"
    assert not np.any(np.isnan(w[:, keep_rows]))
    np.testing.assert_array_equal(w[:, keep_rows, j], 0)
    assert_close(o[:, keep_rows], clean_o[:, keep_rows], dtype, magnitude=finite_absmax(v))
    assert_close(w[:, keep_rows], clean_w[:, keep_rows], dtype)
    # without the poisoned key at all
    k3, v3 = np.delete(k, j, axis=-2), np.delete(v, j, axis=-2)
    if how in ("padding", "padding2d", "bool", "neginf", "causal"):
        m3 = None if mask is None else np.delete(mask, j, axis=-1)
        kw3 = {kk: vv for kk, vv in kwargs.items() if kk != "key_padding_mask"}
        o3 = fastattn.attention(q, k3, v3, m3, **kw3)
        assert_close(o, o3, dtype, magnitude=finite_absmax(v))
    # and everything (including rows that do see the poison) as the reference
    assert_close(o, o_ref, dtype, magnitude=finite_absmax(v))
    assert_close(w, w_ref, dtype)


def test_hidden_nan_value_has_no_influence_large(isa, dtype, rng):
    """Same across block boundaries: many hidden poisoned keys in a long sequence."""
    L, S = 130, 600
    q, k, v = _randn(rng, (L, 16), dtype), _randn(rng, (S, 16), dtype), _randn(rng, (S, 8), dtype)
    kpm = rng.random(S) < 0.2
    k[kpm] = np.nan
    v[kpm] = np.inf
    m = rng.random((L, S)) < 0.9
    o = fastattn.attention(q, k, v, m, is_causal="lower_right", key_padding_mask=kpm)
    assert np.all(np.isfinite(o))
    check_against_reference(q, k, v, m, is_causal="lower_right", key_padding_mask=kpm, factor=2)


def test_visible_nan_gives_nan_row(isa, dtype, rng):
    L, S = 5, 6
    q, k, v = _randn(rng, (L, 4), dtype), _randn(rng, (S, 4), dtype), _randn(rng, (S, 3), dtype)
    k_nan = k.copy()
    k_nan[2, 1] = np.nan           # visible to rows >= 2 under causal
    o, w = check_against_reference(q, k_nan, v, is_causal=True)
    assert np.all(np.isnan(o[2:])) and np.all(np.isnan(w[2:, :3]))
    assert np.all(np.isfinite(o[:2]))
    v_nan = v.copy()
    v_nan[3, 0] = np.nan           # only output column 0 of rows that see key 3
    o, w = check_against_reference(q, k, v_nan, is_causal=True)
    assert np.all(np.isnan(o[3:, 0])) and np.all(np.isfinite(o[:, 1:]))
    assert np.all(np.isfinite(o[:3]))
    q_nan = q.copy()
    q_nan[4, 0] = np.nan
    o, w = check_against_reference(q_nan, k, v)
    assert np.all(np.isnan(o[4])) and np.all(np.isfinite(o[:4]))


def test_visible_pos_inf_score_gives_nan_row(isa, dtype):
    q = np.array([[1.0, 1.0], [-1.0, 1.0], [0.5, 0.5]], dtype)
    k = np.array([[np.inf, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype)
    v = np.array([[1.0], [2.0], [3.0]], dtype)
    o, w = check_against_reference(q, k, v)
    # row 0: score +inf -> NaN row (as scipy.special.softmax)
    assert np.all(np.isnan(o[0])) and np.all(np.isnan(w[0]))
    # row 1: score -inf -> that key is hidden, the row is fine
    assert w[1, 0] == 0 and np.all(np.isfinite(o[1]))


def test_neg_inf_score_is_hidden(isa, dtype):
    q = np.array([[-1.0, 0.0]], dtype)
    k = np.array([[np.inf, 0.0], [1.0, 0.0]], dtype)
    v = np.array([[np.nan, np.nan], [3.0, 4.0]], dtype)
    o, w = fastattn.attention(q, k, v, return_weights=True)
    np.testing.assert_array_equal(w, [[0, 1]])
    np.testing.assert_array_equal(o, [[3, 4]])


def test_infinite_value_visible(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 4), dtype), _randn(rng, (4, 4), dtype), _randn(rng, (4, 2), dtype)
    v[1, 0] = np.inf
    check_against_reference(q, k, v)


# ---------------------------------------------------------------------------
# out=, return_weights, dtypes, scale
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["C", "F", "sliced", "negative", "permuted"])
def test_out_non_contiguous(isa, dtype, rng, layout):
    q, k, v = _randn(rng, (2, 3, 7, 4), dtype), _randn(rng, (2, 3, 9, 4), dtype), _randn(rng, (2, 3, 9, 5), dtype)
    expected = fastattn.attention(q, k, v, is_causal=True)
    out, parent = empty_with_layout((2, 3, 7, 5), dtype, layout, -99.0)
    res = fastattn.attention(q, k, v, is_causal=True, out=out)
    assert res is out
    np.testing.assert_array_equal(out, expected)
    if layout == "sliced":
        # the junk between the view's elements is untouched
        untouched = np.ones(parent.shape, dtype=bool)
        untouched[tuple(slice(1, 2 * n, 2) for n in out.shape)] = False
        assert np.all(parent[untouched] == -99.0)


def test_out_with_return_weights(isa, dtype, rng):
    q, k, v = _randn(rng, (6, 4), dtype), _randn(rng, (8, 4), dtype), _randn(rng, (8, 3), dtype)
    out = np.empty((6, 3), dtype)
    res = fastattn.attention(q, k, v, out=out, return_weights=True)
    assert isinstance(res, tuple) and res[0] is out
    check_against_reference(q, k, v, out=np.empty((6, 3), dtype))


def test_out_float16(isa, rng):
    q, k, v = (_randn(rng, s, np.float16) for s in [(6, 4), (8, 4), (8, 3)])
    out = np.full((3, 6), np.nan, np.float16).T
    res = fastattn.attention(q, k, v, out=out)
    assert res is out
    assert_close(out, reference_attention64(q, k, v)[0], np.float16, magnitude=finite_absmax(v))


def test_return_weights_rows_sum_to_one_or_zero(isa, dtype, rng):
    q, k, v = _randn(rng, (3, 20, 8), dtype), _randn(rng, (3, 31, 8), dtype), _randn(rng, (3, 31, 8), dtype)
    m = rng.random((3, 20, 31)) < 0.5
    m[0, 5] = False
    m[2, :3] = False
    o, w = fastattn.attention(q, k, v, m, is_causal="lower_right", return_weights=True)
    sums = w.astype(np.float64).sum(axis=-1)
    dead = ~np.any(hidden_positions(20, 31, (3,), is_causal="lower_right", attn_mask=m) == False, axis=-1)  # noqa: E712
    assert dead.any()
    np.testing.assert_array_equal(sums[dead], 0)
    np.testing.assert_allclose(sums[~dead], 1, rtol=0, atol=20 * tol_for(dtype))
    assert np.all(w >= 0) and np.all(w <= 1)


def test_return_weights_output_is_weights_times_value(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 9, 5), dtype), _randn(rng, (2, 12, 5), dtype), _randn(rng, (2, 12, 4), dtype)
    o, w = fastattn.attention(q, k, v, is_causal=True, return_weights=True)
    assert_close(o, w.astype(np.float64) @ v.astype(np.float64), dtype, magnitude=finite_absmax(v), factor=3)
    o2 = fastattn.attention(q, k, v, is_causal=True)
    assert_close(o, o2, dtype, magnitude=finite_absmax(v))


@pytest.mark.parametrize("idtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, bool])
def test_int_inputs_give_float64(isa, idtype, rng):
    q = rng.integers(0, 3, (4, 3)).astype(idtype)
    k = rng.integers(0, 3, (5, 3)).astype(idtype)
    v = rng.integers(0, 3, (5, 2)).astype(idtype)
    o, w = check_against_reference(q, k, v, is_causal=True)
    assert o.dtype == np.float64 and w.dtype == np.float64
    o_f = fastattn.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                             is_causal=True)
    assert_close(o, o_f, np.float64)


@pytest.mark.parametrize("dts", [
    (np.float32, np.float64, np.float32),
    (np.float64, np.float32, np.float32),
    (np.float16, np.float32, np.float16),
    (np.float16, np.float16, np.float64),
    (np.int32, np.float32, np.float32),
    (np.int8, np.float16, np.float16),
    (np.int64, np.int16, np.float32),
    (np.float16, np.float16, np.float16),
])
def test_mixed_dtypes_follow_result_type(isa, dts, rng):
    q = (rng.standard_normal((2, 5, 4)) * 2).astype(dts[0])
    k = (rng.standard_normal((2, 7, 4)) * 2).astype(dts[1])
    v = (rng.standard_normal((2, 7, 3)) * 2).astype(dts[2])
    want = expected_result_dtype(q, k, v)
    assert reference.attention(q, k, v).dtype == want
    o, w = check_against_reference(q, k, v, is_causal="lower_right")
    assert o.dtype == want and w.dtype == want


def test_float16_computed_in_float32(isa, rng):
    """float16 in, float16 out, but no float16 overflow in the scores or sums."""
    E = 64
    q = np.full((3, E), 40.0, np.float16)   # q.k = 64 * 1600 = 102400 > float16 max
    k = np.full((5, E), 40.0, np.float16)
    k[1] = -40.0
    v = _randn(rng, (5, 4), np.float16)
    o, w = fastattn.attention(q, k, v, return_weights=True)
    assert o.dtype == np.float16 and w.dtype == np.float16
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(w))
    assert_close(o, reference_attention64(q, k, v)[0], np.float16, magnitude=finite_absmax(v))
    # many keys: the softmax denominator would overflow float16 if summed there
    S = 70000
    k2 = np.zeros((S, 4), np.float16)
    v2 = np.ones((S, 2), np.float16)
    o2 = fastattn.attention(np.zeros((1, 4), np.float16), k2, v2)
    np.testing.assert_allclose(o2.astype(np.float64), 1.0, atol=2e-3)


def test_scale_zero_uniform_weights(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 6, 4), dtype, 5), _randn(rng, (2, 8, 4), dtype, 5), _randn(rng, (2, 8, 3), dtype)
    o, w = check_against_reference(q, k, v, scale=0.0)
    assert_close(w, np.full(w.shape, 1 / 8), dtype)
    assert_close(o, np.broadcast_to(v.astype(np.float64).mean(axis=-2, keepdims=True), o.shape),
                 dtype, magnitude=finite_absmax(v))
    # with causal: uniform over the visible prefix
    o, w = check_against_reference(q, k, v, scale=0.0, is_causal=True)
    for i in range(6):
        assert_close(w[:, i, : i + 1], np.full((2, i + 1), 1 / (i + 1)), dtype)


def test_scale_default_is_inv_sqrt_E(isa, dtype, rng):
    q, k, v = _randn(rng, (5, 7), dtype), _randn(rng, (6, 7), dtype), _randn(rng, (6, 3), dtype)
    a = fastattn.attention(q, k, v)
    b = fastattn.attention(q, k, v, scale=1 / math.sqrt(7))
    assert_close(a, b, dtype, magnitude=finite_absmax(v))
    c = fastattn.attention(q, k, v, scale=1.0)
    assert not np.allclose(a, c)
    check_against_reference(q, k, v, scale=1.0)
    check_against_reference(q, k, v, scale=-0.5)
    check_against_reference(q, k, v, scale=np.float32(0.25))


def test_large_scale_saturates_without_overflow(isa, dtype, rng):
    q, k, v = _randn(rng, (4, 8), dtype), _randn(rng, (9, 8), dtype), _randn(rng, (9, 3), dtype)
    o, w = check_against_reference(q, k, v, scale=30.0, factor=5)
    assert np.all(np.isfinite(o))
    o, w = check_against_reference(q * 1000, k * 1000, v, factor=5)
    assert np.all(np.isfinite(o))


def test_inputs_are_not_modified(isa, dtype, rng):
    q, k, v = _randn(rng, (2, 6, 4), dtype), _randn(rng, (2, 8, 4), dtype), _randn(rng, (2, 8, 3), dtype)
    m = rng.standard_normal((6, 8)).astype(dtype)
    kpm = rng.random(8) < 0.3
    copies = [a.copy() for a in (q, k, v, m, kpm)]
    fastattn.attention(q, k, v, m, is_causal=True, key_padding_mask=kpm, return_weights=True)
    for a, c in zip((q, k, v, m, kpm), copies):
        np.testing.assert_array_equal(a, c)


def test_accepts_array_likes(isa):
    q = [[1.0, 0.0], [0.0, 1.0]]
    o = fastattn.attention(q, q, q)
    np.testing.assert_allclose(o, reference.attention(q, q, q), atol=1e-12)
    assert o.dtype == np.float64


def test_gqa_hkv2_and_hkv1_with_head_masks(isa, dtype, rng):
    for Hkv in (2, 1):
        q = _randn(rng, (2, 8, 5, 4), dtype)
        k = _randn(rng, (2, Hkv, 7, 4), dtype)
        v = _randn(rng, (2, Hkv, 7, 3), dtype)
        bm = rng.random((2, 8, 5, 7)) < 0.7
        fm = rng.standard_normal((8, 5, 7)).astype(dtype)
        fm[rng.random(fm.shape) < 0.2] = -np.inf
        for m in (None, bm, fm):
            o, w = check_against_reference(q, k, v, m, enable_gqa=True, is_causal="lower_right")
            # head h uses kv head h // (8 // Hkv)
            g = 8 // Hkv
            for h in (0, 3, 7):
                mh = None if m is None else np.broadcast_to(m, (2, 8, 5, 7))[:, h]
                oh = fastattn.attention(q[:, h], k[:, h // g], v[:, h // g], mh, is_causal="lower_right")
                assert_close(o[:, h], oh, dtype, magnitude=finite_absmax(v))


def test_gqa_equal_heads_is_plain_attention(isa, dtype, rng):
    q, k, v = _randn(rng, (4, 5, 3), dtype), _randn(rng, (4, 6, 3), dtype), _randn(rng, (4, 6, 2), dtype)
    np.testing.assert_array_equal(fastattn.attention(q, k, v, enable_gqa=True),
                                  fastattn.attention(q, k, v))


def test_gqa_hkv1_without_flag_broadcasts(isa, dtype, rng):
    q, k, v = _randn(rng, (8, 5, 3), dtype), _randn(rng, (1, 6, 3), dtype), _randn(rng, (1, 6, 2), dtype)
    a = fastattn.attention(q, k, v)
    b = fastattn.attention(q, k, v, enable_gqa=True)
    assert_close(a, b, dtype, magnitude=finite_absmax(v))


# ---------------------------------------------------------------------------
# ISA plumbing
# ---------------------------------------------------------------------------

def test_isa_api():
    isas = fastattn.available_isas()
    assert isinstance(isas, tuple) and "generic" in isas
    assert set(isas) <= {"generic", "avx2", "avx512"}
    assert fastattn.get_isa() in isas
    assert isinstance(fastattn.openmp_enabled(), bool)


def test_set_isa_round_trip(isa):
    assert fastattn.get_isa() == isa


def test_isas_agree(rng):
    q, k, v = _randn(rng, (2, 70, 40), np.float32), _randn(rng, (2, 300, 40), np.float32), _randn(rng, (2, 300, 33), np.float32)
    prev = fastattn.get_isa()
    results = {}
    try:
        for name in fastattn.available_isas():
            fastattn.set_isa(name)
            results[name] = fastattn.attention(q, k, v, is_causal="lower_right", return_weights=True)
    finally:
        fastattn.set_isa(prev)
    base = results["generic"]
    for name, (o, w) in results.items():
        assert_close(o, base[0], np.float32, magnitude=finite_absmax(v), factor=2)
        assert_close(w, base[1], np.float32, factor=2)
