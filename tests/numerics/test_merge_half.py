"""merge_attention of 16-bit parts: float16 and bfloat16 (ml_dtypes) alike.

The rule: the parts are widened to float32 exactly, merged in float32, and
the output is rounded once to the parts' dtype; the lse is float32.  So a key
split computed in 16 bits and merged is within one more rounding of the
parts' outputs of the single call (the bound is derived in
``_merge_bound``)."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference
from fastattn.merge import merge_attention
from half_common import EPS32, F32, HALF_IDS, HALVES, assert_bitwise, randn, ulp


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_parts_merge_as_their_float32_copies_rounded_once(dt):
    rng = np.random.default_rng(5)
    outs = [randn(rng, (2, 3, 4), dt, scale=100.0) for _ in range(3)]
    lses = [rng.standard_normal((2, 3)).astype(F32) for _ in range(3)]
    out, lse = merge_attention(outs, lses)
    out32, lse32 = merge_attention([o.astype(F32) for o in outs], lses)
    assert out.dtype == dt and lse.dtype == F32
    assert_bitwise(out, out32.astype(dt))
    np.testing.assert_array_equal(lse, lse32)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_lses_are_widened_and_give_a_float32_lse(dt):
    outs = [np.ones((1, 2, 3), dt), np.full((1, 2, 3), 3.0, dt)]
    lses = [np.zeros((1, 2), dt), np.zeros((1, 2), dt)]
    out, lse = merge_attention(outs, lses)
    assert out.dtype == dt and lse.dtype == F32
    np.testing.assert_array_equal(out.astype(F32), np.full((1, 2, 3), 2.0, F32))
    np.testing.assert_allclose(lse, np.full((1, 2), np.log(2.0)), rtol=2 * EPS32)


def test_bfloat16_row_hidden_in_one_part_takes_the_other_part_only():
    bf = HALVES[1]
    outs = [np.full((1, 1, 2), np.nan, bf), np.full((1, 1, 2), 1.5, bf)]
    lses = [np.full((1, 1), -np.inf, F32), np.zeros((1, 1), F32)]
    out, lse = merge_attention(outs, lses)
    np.testing.assert_array_equal(out.astype(F32), [[[1.5, 1.5]]])
    np.testing.assert_array_equal(lse, [[0.0]])


def _merge_bound(q64, k64, v64, parts, ref, ref_lse, dt):
    """Per-entry bounds (output, lse) for the 16-bit parts of a key split
    merged, against the float64 reference.

    A logit computed in float32 is off by at most ``d = E * eps32 * |s|``
    with ``|s| = scale * sum_c |q_c k_c|``; that moves a row's weights by a
    relative ``2 d``, hence an output (a weighted mean of values, ``|v| <=
    M``) by ``2 d M``, and the lse by ``d`` (the float32 sums add 16 eps32
    of the lse, of M; the merge in float32 the same again).  Each part's
    output ``o_p`` is rounded to the 16-bit dtype (a relative ``u``: 2**-11
    float16, 2**-8 bfloat16), which the merge weighs by ``w_p = exp(lse_p -
    lse)``: ``u * sum_p w_p |o_p|``; the result is rounded once more (one
    ulp of the result, allowing for that ulp at the computed value)."""
    E = q64.shape[-1]
    s_abs = np.abs(q64) @ np.abs(np.swapaxes(k64, -1, -2)) / np.sqrt(E)
    d = E * EPS32 * float(s_abs.max())
    M = float(np.abs(v64).max())
    u = float(ulp(1.0, dt)[()]) / 2
    weighed = sum(np.exp(lse_p.astype(np.float64) - ref_lse)[..., None]
                  * np.abs(o_p.astype(np.float64)) for o_p, lse_p in parts)
    lse_tol = d + 16 * EPS32 * (1.0 + np.abs(ref_lse))
    out_tol = ulp(ref, dt) + u * weighed + 2 * (2 * d + 16 * EPS32) * M
    return out_tol, lse_tol


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_key_split_merged_matches_whole_call_and_reference(isa, rng, dt):
    """attention(..., return_lse=True) on 16-bit parts of the keys, merged:
    within the derived bound of the float64 reference, and of the single
    call (whose own bound is one ulp plus the float32 logits)."""
    q = randn(rng, (2, 3, 7, 16), dt)
    k = randn(rng, (2, 3, 61, 16), dt)
    v = randn(rng, (2, 3, 61, 8), dt, scale=3.0)
    parts = [fastattn.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True)
             for a, b in ((0, 13), (13, 40), (40, 61))]
    out, lse = merge_attention(*zip(*parts))
    whole, whole_lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.dtype == dt and lse.dtype == F32 and whole_lse.dtype == F32
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    ref, ref_lse = reference.attention(q64, k64, v64, return_lse=True)
    out_tol, lse_tol = _merge_bound(q64, k64, v64, parts, ref, ref_lse, dt)
    for name, got, got_lse in (("merged", out, lse), ("whole", whole, whole_lse)):
        err = np.abs(got.astype(np.float64) - ref)
        assert (err <= out_tol).all(), f"{name}: worst {err.max()} over {out_tol.min()}"
        lerr = np.abs(got_lse.astype(np.float64) - ref_lse)
        assert (lerr <= lse_tol).all(), f"{name} lse: worst {lerr.max()}"
    # the single call is the merge without the parts' rounding: the two
    # bounds together hold between them
    gap = np.abs(out.astype(np.float64) - whole.astype(np.float64))
    assert (gap <= 2 * out_tol).all()
    np.testing.assert_allclose(lse, whole_lse, rtol=0, atol=float((2 * lse_tol).max()))
