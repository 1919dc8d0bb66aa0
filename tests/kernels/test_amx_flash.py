"""The bfloat16 flash driver of the amx and avx512_bf16 tiers
(src_c/driver/flash16.c): against fastattn.reference in float64 on the same
bfloat16 values, within the bound its arithmetic allows; bitwise the same for
any thread count; the calls it leaves to the float32-arithmetic path.

The bound (src_c/driver/flash16.h, README): Q.K^T sums exact bfloat16 products in float32
(|ds| <= E 2^-24 scale sum_e |q_e k_e|, so each weight moves by at most a
factor e^(2|ds|)); the weights' exp2 polynomial is within 1.1e-4; P is rounded
to bfloat16 for P.V (relative 2^-8 per weight; l sums the unrounded P); P.V
and l accumulate in float32 (S 2^-24 each); the output is rounded to
bfloat16 (2^-8 of |out|).  So
  |out - ref| <= (2^-8 + 2 * 1.1e-4 + 4 |ds| + (2 S + 16) 2^-24) sum_j w_j |v_j|
                 + 2^-8 (|ref| + that),
with w the reference's weights (sum_j w_j |v_j| = attention over |v|)."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference
from conftest import using_isa

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
BF16 = ml_dtypes.bfloat16
TIERS = [t for t in ("amx", "avx512_bf16") if t in fastattn.available_isas()]
pytestmark = pytest.mark.skipif(not TIERS, reason="no amx / avx512_bf16 tier on this CPU "
                                "(an emulation build, FASTATTN_AVX512_EMULATION=simde, has both)")


@pytest.fixture(params=TIERS)
def tier(request):
    with using_isa(request.param):
        yield request.param


def bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def bound(q, k, v, u=2.0**-8, sub=0.0, **kw):
    """The derived bound of the module docstring, per output element; u: the
    unit roundoff of P and of the output (2^-8 bfloat16, 2^-11 float16), sub:
    the absolute error of rounding a weight or an output below the type's
    normals (float16: 2^-25; bfloat16 has float32's range)."""
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    q64, k64, v64 = f(q), f(k), f(v)
    E, S = q.shape[-1], k.shape[-2]
    scale = kw.get("scale") or 1 / np.sqrt(E)
    if kw.get("enable_gqa"):
        k64 = np.repeat(k64, q.shape[-3] // k.shape[-3], axis=-3)
    ds = E * 2.0**-24 * scale * np.max(np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2))
    wv = reference.attention(q64, k64 if not kw.get("enable_gqa") else k64,
                             np.abs(v64) if not kw.get("enable_gqa") else
                             np.repeat(np.abs(v64), q.shape[-3] // v.shape[-3], axis=-3),
                             **{a: b for a, b in kw.items() if a != "enable_gqa"})
    core = (u + 2 * 1.1e-4 + 4 * ds + (2 * S + 16) * 2.0**-24) * wv
    core += sub * (S * np.max(np.abs(v64), initial=0.0) + 1)
    ref = reference.attention(q64, k64, v64, **kw)
    return ref, core + u * (np.abs(ref) + core)


CASES = {
    "plain": dict(),
    "causal_upper_left": dict(is_causal=True),
    "causal_lower_right": dict(is_causal="lower_right"),
    "window": dict(window=(5, 3)),
    "window_causal": dict(window=(17, 0), is_causal=True),
    "scale": dict(scale=0.3),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("L,S,E,Ev", [(70, 90, 64, 64), (1, 300, 40, 24), (33, 17, 128, 80),
                                      (300, 280, 16, 8)], ids=lambda x: str(x))
def test_within_the_derived_bound(tier, case, L, S, E, Ev):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = bf16(rng, (2, 3, L, E)), bf16(rng, (2, 3, S, E)), bf16(rng, (2, 3, S, Ev))
    out = fastattn.attention(q, k, v, **CASES[case])
    assert out.dtype == BF16 and out.shape == (2, 3, L, Ev)
    ref, tol = bound(q, k, v, **CASES[case])
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= tol), (err.max(), tol[err > tol][:5])


@pytest.mark.parametrize("causal", [False, True, "lower_right"])
@pytest.mark.parametrize("L,S", [(40, 300), (130, 257), (300, 200)], ids=lambda x: str(x))
def test_running_max_raised_mid_row_and_causal_diagonals(tier, causal, L, S):
    """Scores that climb by steps across (and inside) key blocks: the running
    max is raised mid-row, some steps by more than the driver's lazy threshold
    (2^8 in the weights), some by less; one row's scores fall instead.  Causal
    diagonals at offsets that cut key blocks anywhere."""
    rng = np.random.default_rng(L + S)
    E = 64
    q, k, v = bf16(rng, (2, L, E)), bf16(rng, (2, S, E), 0.5), bf16(rng, (2, S, 48))
    q[:, :, 0] = 1.0
    j = np.arange(S)
    k[0, :, 0] = (3.0 * (j // 37)).astype(BF16)         # +3 every 37 keys: below the threshold
    k[1, :, 0] = (np.where(j % 61 == 60, 12.0, 0.0) + j // 50 * 7.0).astype(BF16)  # spikes, +7s
    q[1, 5, 0] = -1.0                                  # this row's scores fall instead
    kw = dict(is_causal=causal, scale=1.0)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
    ref, tol = bound(q, k, v, **kw)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= tol), (err.max(), tol[err > tol][:5])
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    _, rlse = reference.attention(f(q), f(k), f(v), return_lse=True, **kw)
    seen = np.isfinite(rlse)
    np.testing.assert_allclose(lse[seen], rlse[seen], rtol=0, atol=2e-2)
    assert np.array_equal(np.isneginf(lse), np.isneginf(rlse))


def check_gqa_key_padding_and_lse(dt, qscale=1.0, **bound_kw):
    """Grouped heads and key padding (batch item 1: every key padded -> zero
    rows, lse -inf) in the 16-bit dtype dt, within the bound."""
    rng = np.random.default_rng(5)
    q = (rng.standard_normal((2, 4, 50, 64)) * qscale).astype(dt)
    k, v = rng.standard_normal((2, 2, 200, 64)).astype(dt), rng.standard_normal((2, 2, 200, 32)).astype(dt)
    pad = rng.random((2, 200)) < 0.3
    pad[1, :] = True
    out, lse = fastattn.attention(q, k, v, enable_gqa=True, key_padding_mask=pad,
                                  return_lse=True)
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    kk, vv = np.repeat(f(k), 2, axis=1), np.repeat(f(v), 2, axis=1)
    ref, rlse = reference.attention(f(q), kk, vv, key_padding_mask=pad, return_lse=True)
    _, tol = bound(q, kk.astype(dt), vv.astype(dt), key_padding_mask=pad, **bound_kw)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= tol)
    assert (out[1].astype(np.float32) == 0).all() and np.all(np.isneginf(lse[1]))
    np.testing.assert_allclose(lse[0], rlse[0], rtol=0, atol=1e-3)


def test_gqa_key_padding_and_lse(tier):
    check_gqa_key_padding_and_lse(BF16)


def check_differs_from_the_float32_path(dt):
    """The tiles ran (P rounded to the 16-bit dtype dt), not the
    float32-arithmetic path (the avx512 tier's): the results differ."""
    rng = np.random.default_rng(6)
    q, k, v = ((rng.standard_normal((2, n, 64)) * sc).astype(dt)
               for n, sc in ((64, 2.0), (256, 2.0), (256, 1.0)))
    ours = fastattn.attention(q, k, v)
    with using_isa("avx512"):
        f32 = fastattn.attention(q, k, v)
    assert not np.array_equal(ours.view(np.uint16), f32.view(np.uint16))


def test_rounds_p_to_bfloat16_unlike_the_float32_path(tier):
    check_differs_from_the_float32_path(BF16)


@pytest.mark.parametrize("causal", [False, True])
def test_threads_bitwise_identical(tier, causal):
    rng = np.random.default_rng(7)
    q, k, v = bf16(rng, (3, 2, 130, 64)), bf16(rng, (3, 2, 300, 64)), bf16(rng, (3, 2, 300, 64))
    one = fastattn.attention(q, k, v, is_causal=causal, num_threads=1)
    for nt in (2, 3, 5):
        other = fastattn.attention(q, k, v, is_causal=causal, num_threads=nt)
        np.testing.assert_array_equal(one.view(np.uint16), other.view(np.uint16))


@pytest.mark.parametrize("hq,hkv", [(8, 2), (40, 1)], ids=["group_of_4", "group_beyond_a_chunk"])
@pytest.mark.parametrize("causal", [False, "lower_right"])
def test_grouped_query_heads_bits_are_each_heads_own_call(tier, hq, hkv, causal):
    # an item takes a kv head's query heads together (their panels packed
    # once; a group of more blocks than a chunk holds goes head by head):
    # each head's bytes are those of its own call, key padding shared, a
    # NaN value a row sees included
    rng = np.random.default_rng(9)
    q, k, v = bf16(rng, (2, hq, 300, 64)), bf16(rng, (2, hkv, 330, 64)), bf16(rng, (2, hkv, 330, 64))
    v[:, :, 7, 3] = np.nan
    pad = rng.random((2, 330)) < 0.1
    out = fastattn.attention(q, k, v, is_causal=causal, enable_gqa=True, key_padding_mask=pad)
    g = hq // hkv
    for h in range(0, hq, 3):
        own = fastattn.attention(q[:, h], k[:, h // g], v[:, h // g], is_causal=causal,
                                 key_padding_mask=pad)
        assert out[:, h].tobytes() == own.tobytes()


def test_falls_back_for_masks_options_and_nonfinite_values(tier):
    """What the driver declines runs on the float32-arithmetic path with the
    reference's semantics: a boolean mask, softcap, and a NaN value at a hidden
    key (which must not reach the output)."""
    rng = np.random.default_rng(8)
    q, k, v = bf16(rng, (2, 40, 32)), bf16(rng, (2, 70, 32)), bf16(rng, (2, 70, 32))
    mask = rng.random((40, 70)) < 0.7
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    for kw in (dict(attn_mask=mask), dict(softcap=5.0)):
        out = fastattn.attention(q, k, v, **kw)
        ref = reference.attention(f(q), f(k), f(v), **kw)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2**-7, atol=2**-7)
    v2 = v.copy()
    v2[:, -1, :] = np.nan
    pad = np.zeros((2, 70), bool)
    pad[:, -1] = True
    out = fastattn.attention(q, k, v2, key_padding_mask=pad)
    assert np.isfinite(out.astype(np.float32)).all()
    ref = reference.attention(f(q), f(k), f(v2), key_padding_mask=pad)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2**-7, atol=2**-7)


def test_float32_on_the_bf16_tiers_is_the_avx512_path_bitwise(tier):
    """float32 and float64 are never computed in lower precision there: the
    tiers run the avx512 kernels unchanged."""
    if "avx512" not in fastattn.available_isas():
        pytest.skip("no avx512 path")
    rng = np.random.default_rng(9)
    for dt in (np.float32, np.float64):
        q, k, v = (rng.standard_normal((2, 50, 40)).astype(dt) for _ in range(3))
        ours = fastattn.attention(q, k, v, is_causal=True)
        with using_isa("avx512"):
            base = fastattn.attention(q, k, v, is_causal=True)
        np.testing.assert_array_equal(ours, base)


def check_visible_nan_and_inf_values(dt):
    """NaN and Inf values of V (dtype dt): hidden ones have no influence,
    visible ones give IEEE's sum, as in the reference."""
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((1, n, 32)).astype(dt) for n in (40, 70, 70))
    v[0, 20, 0] = np.inf       # seen by the rows i >= 20 (causal)
    v[0, 30, 1] = np.nan
    v[0, 25, 2], v[0, 35, 2] = np.inf, -np.inf
    v[0, 60, 3] = np.nan       # hidden from every row
    out = fastattn.attention(q, k, v, is_causal=True).astype(np.float64)
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    with np.errstate(invalid="ignore"):
        ref = reference.attention(f(q), f(k), f(v), is_causal=True)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    fin = np.isfinite(ref)
    assert np.isfinite(out[fin]).all() and np.isposinf(out[0, 20:, 0]).all()


def test_visible_nan_and_inf_values_reach_the_output_as_in_the_reference(tier):
    """A NaN or Inf in V is packed as 0 and put back where a row sees it:
    IEEE's sum (NaN for NaN or for +inf with -inf, else the infinity)."""
    check_visible_nan_and_inf_values(BF16)


@pytest.mark.parametrize("how", ["neg_inf_score", "underflowing_weight"])
def test_inf_values_behind_zero_weights_have_no_influence(tier, how):
    """A key with an infinite value whose weight is 0 (its score -inf, from
    a -inf in K, or 2^(c s - m) below the least normal) changes nothing,
    though no mask hides it (the float32 path skips zero weights alike)."""
    rng = np.random.default_rng(11)
    q = (np.abs(rng.standard_normal((2, 40, 16))) + 0.1).astype(BF16)
    k = bf16(rng, (2, 70, 16))
    v = bf16(rng, (2, 70, 8))
    k[:, 5] = 0
    if how == "neg_inf_score":
        k[:, 5, 3] = -np.inf
    else:
        k[:, 5] = -200.0   # scores near -1000 against maxima near +10
    v[:, 5, 2], v[:, 5, 6] = np.inf, -np.inf
    got = fastattn.attention(q, k, v)
    keep = np.ones(70, bool)
    keep[5] = False
    want = fastattn.attention(q, k[:, keep], v[:, keep])
    assert np.isfinite(got.astype(np.float32)).all()
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)


@pytest.mark.parametrize("scale", [1e8, 5e8, 1e9], ids=lambda s: f"scale{s:g}")
def test_scores_of_billions_keep_the_maximum_weight_1(tier, scale):
    """c s rounded, then minus the maximum: the top key's weight is exactly
    2^0 (a fused multiply-subtract left the product's rounding error, some
    hundreds at 4e9, in the exponent: NaN rows, lse +inf or -inf)."""
    q = np.zeros((16, 16), BF16)
    q[:, 0] = 1
    k = np.zeros((16, 16), BF16)
    k[:, 0] = 1
    k[0, 0] = 7.96875
    v = np.ones((16, 2), BF16)
    v[0] = 3
    out, lse = fastattn.attention(q, k, v, scale=scale, return_lse=True)
    assert (out.astype(np.float32) == 3).all()
    np.testing.assert_allclose(lse, 7.96875 * scale, rtol=1e-6)
