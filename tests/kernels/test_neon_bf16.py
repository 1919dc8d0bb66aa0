"""What is particular to the neon_bf16 tier (src_c/simd/simd_neon_bf16.h,
simd/flash16_neon.h, simd/bf16_emulate_arm.h).

The suite's ISA-parametrized tests with a 16-bit dtype run the rest on it
(the ``isa`` fixture takes ``neon_bf16`` from ``available_isas()``: an aarch64
build on a CPU with FEAT_BF16, or the x86-64 test build
``FASTATTN_NEON_EMULATION=simde``).  Here: the plain-C BFDOT and BFMMLA of
the SIMDe build pinned to hand-computed cases (round to odd, flush to zero,
the default NaN: the Arm ARM's BFDotAdd with FPCR.EBF = 0), the same against
the instructions where they run (qemu -cpu max, Armv8.6 hardware), float32
bitwise the neon tier's, and bfloat16 attention on the tier's 16-bit matrix
path against the reference.
"""

import numpy as np
import pytest

import fastattn
from conftest import using_isa
from fastattn import _testing, reference

ml_dtypes = pytest.importorskip("ml_dtypes")

ON_TIER = pytest.mark.skipif(
    "neon_bf16" not in fastattn.available_isas(),
    reason="the neon_bf16 tier is not available here (an aarch64 build on a CPU "
           "with FEAT_BF16, or FASTATTN_NEON_EMULATION=simde on x86-64)")


def _bf(*values):
    """bfloat16 bits of exactly representable values, as 8 halves (zero-padded)."""
    h = np.zeros(8, np.uint16)
    h[:len(values)] = np.array(values, np.float32).view(np.uint32) >> 16
    return h


def _bits(*words):
    return np.array(words, np.uint32).view(np.float32)


def _op(name, a, b, c, native=False):
    c = np.ascontiguousarray(c, np.float32).copy()
    ok = _testing.bf16_op(name, native, np.ascontiguousarray(a, np.uint16),
                          np.ascontiguousarray(b, np.uint16), c)
    return c if ok else None


# (a halves, b halves, accumulator bits, expected bits): lane 0 of BFDOT,
# lane 0's pair (a[0], a[1]) . (b[0], b[1]) + acc; derivations beside each.
BFDOT_CASES = {
    # 1*1 + 2^-15*2^-15 = 1 + 2^-30: truncated to 1.0, inexact, so the last
    # bit is set: 1 + 2^-23 (0x3f800001); nearest even would give 1.0
    "pair_sum_rounds_to_odd": (_bf(1.0, 2.0**-15), _bf(1.0, 2.0**-15), 0x00000000, 0x3f800001),
    # acc 1.0 + 2^-12*2^-13 = 1 + 2^-25: the addition rounds to odd too
    "addend_sum_rounds_to_odd": (_bf(2.0**-12), _bf(2.0**-13), 0x3f800000, 0x3f800001),
    # 1.5*2 + 2*0.25 = 3.5, + 0.5 = 4.0: exact sums are not touched
    "exact_stays_exact": (_bf(1.5, 2.0), _bf(2.0, 0.25), 0x3f000000, 0x40800000),
    # (1 + 2^-23) + 1.5*2^-12*2^-12 = 1 + 1.75*2^-23: truncated to the odd
    # 1 + 2^-23, kept; nearest even would round up to 1 + 2^-22 (0x3f800002)
    "odd_truncation_kept": (_bf(1.5 * 2.0**-12), _bf(2.0**-12), 0x3f800001, 0x3f800001),
    # 2^-70 * 2^-70 = 2^-140 is below the normals: the product is flushed to
    # +0, so 2^-126 stays 0x00800000 (float32 arithmetic: 0x00800200)
    "tiny_product_flushed": (_bf(2.0**-70), _bf(2.0**-70), 0x00800000, 0x00800000),
    # a subnormal bfloat16 (0x0001 = 2^-133) reads as 0; and a subnormal
    # accumulator (0x00000001) as +0: the result is +0
    "subnormal_inputs_flushed": (np.array([1, 0, 0, 0, 0, 0, 0, 0], np.uint16), _bf(1.0),
                                 0x00000001, 0x00000000),
    # 1.5*2^-126 + (-2^-63 * 2^-63 = -2^-126) = 2^-127, tiny before
    # rounding: flushed to +0 (float32 arithmetic: 0x00400000)
    "tiny_sum_flushed": (_bf(-(2.0**-63)), _bf(2.0**-63), 0x00c00000, 0x00000000),
    # 2^100 * 2^100 overflows to +inf, 2^100 * -2^100 to -inf; their sum is
    # the default NaN 0x7fc00000 (x86's inf - inf is 0xffc00000)
    "inf_minus_inf_default_nan": (_bf(2.0**100, 2.0**100), _bf(2.0**100, -(2.0**100)),
                                  0x00000000, 0x7fc00000),
    # a signalling NaN input (0x7f81) gives the default NaN, not its payload
    "nan_input_default_nan": (np.array([0x7F81, 0, 0, 0, 0, 0, 0, 0], np.uint16), _bf(1.0),
                              0x3f800000, 0x7fc00000),
}


@pytest.mark.parametrize("case", list(BFDOT_CASES))
def test_bfdot_emulation_hand_computed(case):
    a, b, acc, want = BFDOT_CASES[case]
    c = _bits(acc, 0, 0, 0)
    got = _op("bfdot", a, b, c)
    assert got.view(np.uint32)[0] == want, (case, hex(got.view(np.uint32)[0]), hex(want))
    # the other lanes' pairs are zero: their accumulators (0) unchanged
    assert np.all(got.view(np.uint32)[1:] == 0)


def test_bfdot_emulation_lanes_take_their_own_pairs():
    """Lane i reads halves 2i, 2i+1 of both operands: 1*1+2*3 = 7, 3*1+4*3
    = 15, ... per lane, added to acc = (0, 1, 2, 3)."""
    a = _bf(1, 2, 3, 4, 5, 6, 7, 8)
    b = _bf(1, 3, 1, 3, 1, 3, 1, 3)
    got = _op("bfdot", a, b, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(got, [7, 16, 25, 34])


def test_bfmmla_emulation_order_of_its_two_pairs():
    """BFMMLA: c (2 x 2, row-major) += a (2 x 4) . b^T (2 x 4), each element
    by two BFDotAdd, elements 0-1 first.  c[0][0]: 1.0 + 2^-12*2^-13 = 1 +
    2^-25 -> 1 + 2^-23 (round to odd), then + 1.0*-1.0 = 2^-23 exactly
    (0x34000000); the other order would give 0 + 2^-25.  c[1][0]: a row 1 =
    (1, 1, 1, 1) . (2^-13, 0, -1, 0) from 0: 2^-13, then -(1 - 2^-13)
    (0xbf7ff800); c[0][1], c[1][1]: b row 1 is zero, 2.0 and 3.0 kept."""
    a = np.concatenate([_bf(2.0**-12, 0, 1.0, 0)[:4], _bf(1, 1, 1, 1)[:4]])
    b = np.concatenate([_bf(2.0**-13, 0, -1.0, 0)[:4], _bf()[:4]])
    got = _op("bfmmla", a, b, _bits(0x3f800000, 0x40000000, 0x00000000, 0x40400000))
    np.testing.assert_array_equal(got.view(np.uint32), [0x34000000, 0x40000000, 0xbf7ff800, 0x40400000])


def _random_operands(rng, n):
    """bfloat16 pairs spanning the exponent range (products that overflow
    and flush), NaN/Inf/subnormals mixed in, accumulators likewise."""
    e = rng.integers(-140, 128, size=(n, 8))
    vals = (rng.random((n, 8)) + 1) * np.exp2(e.astype(np.float64) / 2) * rng.choice([-1, 1], (n, 8))
    h = (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    specials = np.array([0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8000, 0x0000, 0x3F80], np.uint16)
    mask = rng.random((n, 8)) < 0.05
    h[mask] = rng.choice(specials, mask.sum())
    acc = (rng.standard_normal((n, 4)) * np.exp2(rng.integers(-30, 30, (n, 4)))).astype(np.float32)
    return h, acc


@pytest.mark.parametrize("name", ["bfdot", "bfmmla"])
def test_emulation_matches_the_instruction_where_it_runs(name):
    """On Armv8.6 hardware or qemu -cpu max the instruction itself runs
    (the test hook's native path); the emulation must give its bits."""
    if _op(name, _bf(), _bf(), np.zeros(4, np.float32), native=True) is None:
        pytest.skip(f"no native {name} here (an aarch64 CPU with FEAT_BF16 and the neon_bf16 tier)")
    rng = np.random.default_rng(3)
    a, acc = _random_operands(rng, 3000)
    b, _ = _random_operands(rng, 3000)
    for i in range(len(a)):
        want = _op(name, a[i], b[i], acc[i], native=True)
        got = _op(name, a[i], b[i], acc[i])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (i, a[i], b[i], acc[i])


@ON_TIER
def test_float32_is_bitwise_the_neon_tier(rng):
    """float32/float64/float16 on neon_bf16 run the neon kernels."""
    q, k, v = (rng.standard_normal((2, 3, 70, 40)).astype(np.float32) for _ in range(3))
    got = {}
    for isa in ("neon", "neon_bf16"):
        with using_isa(isa):
            got[isa] = [fastattn.attention(q, k, v), fastattn.attention(q, k, v, is_causal=True),
                        fastattn.attention(q.astype(np.float16), k.astype(np.float16),
                                           v.astype(np.float16))]
    for a, b in zip(got["neon"], got["neon_bf16"]):
        assert a.tobytes() == b.tobytes()


@ON_TIER
@pytest.mark.parametrize("L,S,E,Ev,kw", [
    (64, 200, 64, 64, {}), (100, 333, 40, 24, {"is_causal": "lower_right"}),
    (96, 300, 128, 72, {"window": (40, 8)}), (33, 64, 16, 16, {})])
def test_bfloat16_on_the_16_bit_matrix_path(rng, L, S, E, Ev, kw):
    """bfloat16 calls of enough rows take the BFDOT path (flash16): its
    result against the float64 reference within bfloat16's bounds (P and
    the output rounded to bfloat16), and not bitwise the neon tier's
    float32 path (so the path really ran)."""
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((2, L, E)).astype(bf)
    k = rng.standard_normal((2, S, E)).astype(bf)
    v = rng.standard_normal((2, S, Ev)).astype(bf)
    want = reference.attention(*(x.astype(np.float64) for x in (q, k, v)), **kw)
    got = {}
    for isa in ("neon", "neon_bf16"):
        with using_isa(isa):
            got[isa] = fastattn.attention(q, k, v, **kw)
    err = np.max(np.abs(got["neon_bf16"].astype(np.float64) - want))
    assert got["neon_bf16"].dtype == bf and err < 3e-2, err
    assert got["neon_bf16"].tobytes() != got["neon"].tobytes()
