"""fastattn.attention against fastattn.reference.attention: named shapes.

Sizes 1 and odd sizes, leading dims that broadcast, strided and zero-stride
inputs, sizes that cross the kernels' blocks, the split-key decode path,
grouped-query heads and the causal alignments (``upper_left``,
``lower_right``) for L < S and L > S.  The numeric tests run on every ISA
path (the ``isa`` fixture) in float32 and float64 (the ``dtype`` fixture);
the result's layout runs once.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from conftest import (
    LAYOUTS,
    _randn,
    assert_close,
    check_against_reference,
    finite_absmax,
    reference_attention64,
    relayout,
    tol_for,
)


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------

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


def test_result_is_a_new_c_ordered_array(dtype, rng):
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
# grouped-query heads
# ---------------------------------------------------------------------------

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
