"""attention() on float16 and bfloat16 inputs, on every ISA path: read in
place, computed in float32 and rounded once.  Each case is checked twice:
bitwise against the float32 computation on the widened inputs, rounded to
the dtype (so no step rounds in between and nothing is lost reading the
16-bit data), and against the float64 reference within one ulp of the
dtype plus float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
from fastattn import reference

from half_common import F32, HALF_IDS, HALVES, assert_bitwise, assert_half_close, randn

BF16 = [dt for dt in HALVES if np.dtype(dt).name == "bfloat16"][0]

# name -> (q shape, k shape, v shape, options); decode (L <= 8: the direct
# kernels, and with S > 1024 the key split), prefill (packed panels), odd
# sizes (vector tails), every mask kind and score option.
CASES = {
    "decode_key_split": ((2, 3, 1, 64), (2, 3, 1100, 64), (2, 3, 1100, 64), {}),
    "decode_few_rows_lower_right": ((1, 2, 5, 40), (1, 2, 300, 40), (1, 2, 300, 24),
                                    {"is_causal": "lower_right"}),
    "prefill_causal_odd_sizes": ((1, 2, 150, 40), (1, 2, 150, 40), (1, 2, 150, 24),
                                 {"is_causal": True}),
    "window_lower_right": ((1, 1, 70, 32), (1, 1, 100, 32), (1, 1, 100, 32),
                           {"is_causal": "lower_right", "window": (16, 4)}),
    "gqa_decode": ((1, 4, 1, 32), (1, 2, 200, 32), (1, 2, 200, 32), {"enable_gqa": True}),
    "gqa_prefill": ((2, 4, 33, 32), (2, 2, 90, 32), (2, 2, 90, 16), {"enable_gqa": True}),
    "score_options_lse": ((1, 2, 20, 32), (1, 2, 130, 32), (1, 2, 130, 32),
                          {"softcap": 3.0, "alibi_slopes": [0.25, 0.5], "sinks": [0.5, -1.0],
                           "return_lse": True, "is_causal": "lower_right"}),
    "decode_score_options_lse": ((1, 2, 1, 32), (1, 2, 1500, 32), (1, 2, 1500, 32),
                                 {"softcap": 2.0, "sinks": [0.0, 1.0], "return_lse": True}),
    "weights": ((1, 2, 17, 24), (1, 2, 45, 24), (1, 2, 45, 20),
                {"return_weights": True, "is_causal": True}),
    "key_padding": ((2, 2, 9, 16), (2, 2, 70, 16), (2, 2, 70, 16),
                    {"key_padding_mask": "pad"}),
}


def _inputs(rng, case, dt):
    qs, ks, vs, opts = CASES[case]
    q, k, v = randn(rng, qs, dt), randn(rng, ks, dt), randn(rng, vs, dt, 2.0)
    opts = dict(opts)
    if opts.get("key_padding_mask") == "pad":
        pad = rng.random((qs[0], ks[-2])) < 0.3
        pad[:, 0] = False
        opts["key_padding_mask"] = pad
    return q, k, v, opts


# The bfloat16 driver of the amx / avx512_bf16 / neon_bf16 tiers (tests/kernels/test_amx_flash.py)
# rounds P to bfloat16 for P.V and flushes bfloat16 subnormals (the matrix
# instructions' DAZ): not the float32 computation rounded once, but within one
# more bfloat16 rounding of the values (2^-8 sum_j w_j |v_j|) of the reference.
_BF16_DECLINED = ("softcap", "alibi_slopes", "sinks", "return_weights")


# The fewest query rows the bfloat16 tile driver takes (FA_BF16_MIN_ROWS in
# src_c/kernels/blocking.h); fewer (a decoding step) run the direct path.
BF16_MIN_ROWS = 16


def _bf16_tiles(dt, L, mask=None, **opts):
    """Whether the 16-bit tile driver runs this call (L query rows): bfloat16
    on amx / avx512_bf16 / neon_bf16, float16 on amx with AMX-FP16 tiles (or emulated;
    tests/kernels/test_amx_fp16.py), P then rounded to float16 (2^-11: within
    the bfloat16 bound below)."""
    isa, dt = fastattn.get_isa(), np.dtype(dt)
    matrix = ("amx", "avx512_bf16", "neon_bf16")
    # sve has no matrix kernels of its own: it runs neon_bf16's where offered
    typed = ((dt == BF16 and (isa in matrix or (isa == "sve" and "neon_bf16" in
                                                fastattn.available_isas())))
             or (dt == np.float16 and isa == "amx" and _core.amx_fp16()))
    return (typed and L >= BF16_MIN_ROWS and mask is None
            and not any(opts.get(o) for o in _BF16_DECLINED))


# Decoding steps (2 to FA_DIRECT_MAX_ROWS = 8 query rows per KV head) of
# bfloat16 queries over bfloat16 K and V on amx, head sizes multiples of 32 up
# to 256, widen the key and value rows in registers (src_c/kernels/
# decode_dp16.h): float32 arithmetic, rounded once, but summed in another
# order than the float32 path's, so within the bound of the reference and not
# bitwise that path's result rounded.  (The rows counted here are the query
# rows times the heads a KV head serves; where that passes 8, the call is
# bitwise after all, which this predicate does not claim.)
def _bf16_rows(q, k, v):
    rows = q.shape[-2] * (q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.ndim >= 3 else 1)
    return (fastattn.get_isa() == "amx" and q.dtype == BF16 and k.dtype == BF16
            and 2 <= rows <= 8 and k.shape[-1] % 32 == 0 and k.shape[-1] <= 256
            and v.shape[-1] % 32 == 0)


def _widened(x):
    return x.astype(F32) if isinstance(x, np.ndarray) and x.dtype.itemsize == 2 else x


def _check(q, k, v, dt, mask=None, **opts):
    """The two checks of the module docstring; returns the result."""
    got = fastattn.attention(q, k, v, mask, **opts)
    f32 = fastattn.attention(_widened(q), _widened(k), _widened(v), _widened(mask), **opts)
    ref = reference.attention(q, k, v, mask, **opts)
    parts = lambda r: r if isinstance(r, tuple) else (r,)  # noqa: E731
    names = ["out"] + (["weights"] if opts.get("return_weights") else []) + (
        ["lse"] if opts.get("return_lse") else [])
    tiles = _bf16_tiles(dt, q.shape[-2], mask, **opts)
    bitwise = not tiles and not _bf16_rows(q, k, v)
    for name, g, f, r in zip(names, parts(got), parts(f32), parts(ref)):
        if name == "lse":   # float32 for 16-bit inputs
            assert g.dtype == F32 and r.dtype == F32
            if bitwise:
                assert_bitwise(g, f, err_msg=name)
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5, err_msg=name)
            continue
        assert g.dtype == dt and r.dtype == dt, (name, g.dtype, r.dtype)
        if bitwise:
            assert_bitwise(g, f.astype(dt), err_msg=name)
        ref64 = reference.attention(*(a.astype(np.float64) for a in (q, k, v)),
                                    None if mask is None else mask.astype(np.float64)
                                    if mask.dtype != bool else mask, **opts)
        r64 = parts(ref64)[names.index(name)]
        mag = np.abs(v.astype(np.float64)).max() if name == "out" else 1.0
        if tiles:   # P rounded to bfloat16: 2^-8 of sum_j w_j |v_j| <= max |v| more
            g64, bound = g.astype(np.float64), 2.0**-8 * mag + 2.0**-7 * np.abs(r64) + 1e-6 * mag
            assert np.all(np.abs(g64 - r64) <= bound), (name, np.abs(g64 - r64).max())
            continue
        assert_half_close(g, r64, dt, magnitude=mag, err_msg=name)
    return got


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_half_inputs_match_float32_rounded_once_and_reference(isa, rng, dt, case):
    q, k, v, opts = _inputs(rng, case, dt)
    _check(q, k, v, dt, **opts)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 40])
def test_half_additive_mask_in_the_half_dtype(isa, rng, dt, L):
    q, k, v = randn(rng, (2, L, 32), dt), randn(rng, (2, 80, 32), dt), randn(rng, (2, 80, 32), dt)
    mask = randn(rng, (2, L, 80), dt)
    mask[:, :, 5:9] = -np.inf
    _check(q, k, v, dt, mask)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 40])
def test_half_bool_mask_and_strided_inputs(isa, rng, dt, L):
    """Transposed (non-unit column stride) and sliced inputs: the
    element-by-element readers."""
    q = randn(rng, (32, L), dt).T
    k = randn(rng, (32, 120), dt).T
    v = randn(rng, (240, 24), dt)[::2]
    mask = rng.random((L, 120)) < 0.7
    mask[:, 0] = True
    _check(q, k, v, dt, mask)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 24])
def test_half_out_parameter_filled_and_returned(isa, rng, dt, L):
    q, k, v = randn(rng, (3, L, 16), dt), randn(rng, (3, 50, 16), dt), randn(rng, (3, 50, 8), dt)
    out = np.full((3, L, 8), np.nan, dt)
    res = fastattn.attention(q, k, v, is_causal="lower_right", out=out)
    assert res is out
    assert_bitwise(out, fastattn.attention(q, k, v, is_causal="lower_right"))
    strided = np.zeros((3, L, 16), dt)[..., ::2]          # not contiguous
    assert fastattn.attention(q, k, v, is_causal="lower_right", out=strided) is strided
    assert_bitwise(strided, out)
    with pytest.raises(TypeError, match="dtype"):
        fastattn.attention(q, k, v, out=np.zeros((3, L, 8), np.float32))


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 30])
def test_half_nan_inf_in_hidden_positions_have_no_influence(isa, rng, dt, L):
    S = 60
    q, k, v = randn(rng, (2, L, 32), dt), randn(rng, (2, S, 32), dt), randn(rng, (2, S, 32), dt)
    pad = np.zeros((2, S), bool)
    pad[:, 10:14] = True
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[:, 10:14] = np.nan
    v_bad[:, 10:12] = np.inf
    v_bad[:, 12:14] = np.nan
    clean = fastattn.attention(q, k, v, key_padding_mask=pad, is_causal="lower_right")
    dirty = fastattn.attention(q, k_bad, v_bad, key_padding_mask=pad, is_causal="lower_right")
    assert np.isfinite(dirty.astype(np.float64)).all()
    assert_bitwise(dirty, clean)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 20])
def test_half_rounding_to_nearest_even_exact_ties(isa, rng, dt, L):
    """Two keys with equal scores (q = 0): out = (v0 + v1) / 2, exact in
    float32 for values within 2**12 of each other, so the output must be
    its correctly rounded value, ties to even included."""
    Ev = 64
    base = 2.0 ** rng.integers(-10, 10, size=Ev)
    v0 = (base * rng.choice([-1, 1], Ev) * (1 + rng.integers(0, 8, Ev) / 8)).astype(dt)
    v1 = (v0.astype(np.float64) + ulp_step(v0, dt)).astype(dt)   # neighbours: ties
    v = np.stack([v0, v1])[None]
    q = np.zeros((1, L, 8), dt)
    k = randn(rng, (1, 2, 8), dt)
    got = fastattn.attention(q, k, v)
    exact = (v0.astype(np.float32) + v1.astype(np.float32)) * np.float32(0.5)
    assert_bitwise(got, np.broadcast_to(exact.astype(dt), (1, L, Ev)))


def ulp_step(x, dt):
    from half_common import ulp
    return ulp(x, dt)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_every_value_round_trips(isa, dt):
    """One key: out = v exactly, for every 16-bit pattern (subnormals,
    the largest finite values, +-inf, NaN): widening and rounding are exact
    inverses on representable values (-0 comes out +0: the accumulator
    starts at +0)."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    v = bits.view(dt).reshape(1024, 1, 64)
    q = np.zeros((1024, 1, 8), dt)
    k = np.zeros((1024, 1, 8), dt)
    want = v.copy()
    bits_want = want.view(np.uint16)
    bits_want[bits_want == 0x8000] = 0          # -0 -> +0
    if _bf16_tiles(dt, q.shape[-2]):   # the matrix instructions read bfloat16 subnormals as 0
        with np.errstate(invalid="ignore"):
            sub = np.abs(want.astype(np.float32)) < np.finfo(np.float32).tiny
        bits_want[sub] = 0
    assert_bitwise(fastattn.attention(q, k, v), want)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 50])
def test_float32_queries_against_16_bit_keys_values(isa, rng, dt, L):
    """float32 queries with 16-bit K and V (a KV cache): float32 result,
    bitwise the float32 computation on the widened K and V."""
    q = randn(rng, (2, 2, L, 32), F32)
    k, v = randn(rng, (2, 2, 1200, 32), dt), randn(rng, (2, 2, 1200, 32), dt)
    got = fastattn.attention(q, k, v, is_causal="lower_right")
    assert got.dtype == F32
    assert_bitwise(got, fastattn.attention(q, k.astype(F32), v.astype(F32),
                                           is_causal="lower_right"))


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 2], ids=["one_row", "two_rows"])
def test_grouped_decoding_steps_with_padding_match_reference(isa, rng, dt, L):
    """A decoding step of 4 query heads per KV head (bfloat16 on amx: the
    widened-rows kernels), keys hidden by padding, the keys split over
    several blocks; within the bound of the reference (bitwise the float32
    path where _bf16_rows says so)."""
    q, k, v = randn(rng, (2, 8, L, 64), dt), randn(rng, (2, 2, 700, 64), dt), \
        randn(rng, (2, 2, 700, 96), dt)
    pad = rng.random((2, 700)) < 0.2
    pad[:, 0] = False
    _check(q, k, v, dt, enable_gqa=True, key_padding_mask=pad, is_causal="lower_right")


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_grouped_decoding_step_keeps_nan_values_of_hidden_keys_out(isa, rng, dt):
    """NaN and Inf values behind padded keys never reach a grouped decoding
    step's output (the widened-rows kernels skip a zero weight's key)."""
    q, k, v = randn(rng, (1, 8, 1, 64), dt), randn(rng, (1, 2, 300, 64), dt), \
        randn(rng, (1, 2, 300, 64), dt)
    pad = np.zeros((1, 300), bool)
    pad[0, [5, 130, 131, 299]] = True
    v_bad = v.copy()
    v_bad[0, 0, [5, 130]] = np.nan
    v_bad[0, 1, [131, 299]] = np.inf
    got = fastattn.attention(q, k, v_bad, enable_gqa=True, key_padding_mask=pad)
    assert np.isfinite(got.astype(F32)).all()
    assert_bitwise(got, fastattn.attention(q, k, v, enable_gqa=True, key_padding_mask=pad))


def test_half_results_are_the_same_for_any_thread_count(rng):
    for dt in HALVES:
        q, k, v = randn(rng, (4, 2, 1, 64), dt), randn(rng, (4, 2, 3000, 64), dt), \
            randn(rng, (4, 2, 3000, 64), dt)
        one = fastattn.attention(q, k, v, num_threads=1)
        assert_bitwise(fastattn.attention(q, k, v, num_threads=3), one)
