"""The plain-C emulation of the AMX tile and AVX512-BF16 instructions
(src_c/simd/bf16_emulate.h), which runs the amx and avx512_bf16 paths in an
emulation build: pinned to hand-computed cases of the instructions'
documented behaviour (Intel SDM: TDPBF16PS keeps two float32 partial sums per
pair column, VDPBF16PS adds the odd product first, both flush denormals;
VCVTNE(2)PS2BF16 round to nearest even and quiet NaNs), and, where the CPU
has them, to the instructions themselves: the same hand-computed cases and
random operands (the vector ones on any CPU with AVX512-BF16, Intel or AMD;
the tile ones with AMX)."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import _testing

# the instructions themselves: VDPBF16PS and the conversions where the CPU runs
# avx512_bf16 or amx, the tile ones where it runs amx (never in an emulation build)
NATIVE_VEC = _testing.bf16_op("vcvtneps2bf16", True, np.zeros(16, np.float32),
                              np.zeros(16, np.float32), np.zeros(16, np.uint16))
NATIVE_TILES = "amx" in fastattn.available_isas() and _testing.bf16_op(
    "tdpbf16ps", True, np.zeros(512, np.uint16), np.zeros(512, np.uint16),
    np.zeros(256, np.float32))
BOTH = [False] + ([True] if NATIVE_VEC else [])
IDS = ["emulated"] + (["native"] if NATIVE_VEC else [])
TILE_BOTH = [False] + ([True] if NATIVE_TILES else [])
TILE_IDS = ["emulated"] + (["native"] if NATIVE_TILES else [])

TWO_M12 = 0x3980        # bfloat16 2**-12: 2**-12 * 2**-12 = 2**-24, half an ulp of 1.0


def f32(*v):
    return np.array(v, np.float32)


def bits32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def from_bits(u):
    return np.array(u, np.uint32).view(np.float32)


@pytest.mark.parametrize("native", BOTH, ids=IDS)
def test_cvtneps_rounds_to_nearest_even_quiets_nan_flushes_denormals(native):
    one = 1.0
    cases = [  # float32 -> bfloat16 bits
        (one, 0x3F80),
        (one + 2.0**-8, 0x3F80),                 # tie: to even (down)
        (one + 3 * 2.0**-8, 0x3F82),             # tie: to even (up)
        (one + 2.0**-8 + 2.0**-20, 0x3F81),      # above the tie
        (-(one + 2.0**-7), 0xBF81),
        (float(np.finfo(np.float32).max), 0x7F80),   # rounds up to +inf
        (float("inf"), 0x7F80), (float("-inf"), 0xFF80),
        (1e-40, 0x0000), (-1e-40, 0x8000),          # denormal inputs: signed zero
        (0.0, 0x0000), (-0.0, 0x8000),
    ]
    a = np.zeros(16, np.float32)
    a[:len(cases)] = [x for x, _ in cases]
    c = np.zeros(16, np.uint16)
    assert _testing.bf16_op("vcvtneps2bf16", native, a, a, c)
    assert [hex(x) for x in c[:len(cases)]] == [hex(y) for _, y in cases]
    # a signalling NaN comes back quiet, sign and payload's upper bits kept
    a[:2] = from_bits([0x7F800001, 0xFF810000])
    assert _testing.bf16_op("vcvtneps2bf16", native, a, a, c)
    assert [hex(x) for x in c[:2]] == ["0x7fc0", "0xffc1"]


@pytest.mark.parametrize("native", BOTH, ids=IDS)
def test_cvtne2ps_puts_the_second_operand_low(native):
    hi, lo = np.full(16, 2.0, np.float32), np.arange(16, dtype=np.float32)
    c = np.zeros(32, np.uint16)
    assert _testing.bf16_op("vcvtne2ps2bf16", native, hi, lo, c)
    assert (c[16:] == 0x4000).all()
    assert (c[:16] == (bits32(lo) >> 16)).all()


@pytest.mark.parametrize("native", BOTH, ids=IDS)
def test_vdpbf16ps_adds_the_odd_product_first_with_rounding(native):
    # acc = 1; odd product 2**-24 rounds away (tie to even), then the even one too:
    # two roundings give 1, not 1 + 2**-23.
    a = np.zeros(32, np.uint16)
    a[0] = a[1] = TWO_M12
    c = np.ones(16, np.float32)
    assert _testing.bf16_op("vdpbf16ps", native, a, a.copy(), c)
    assert (c == 1).all()
    # the odd product 1 first: 2**-24 + 1 = 1 (rounded), then + 2**-24 = 1 again;
    # with the even product first 2**-24 + 2**-24 = 2**-23 would survive.
    a[:] = 0
    a[0], a[1] = TWO_M12, 0x3F80
    b = a.copy()
    c = np.zeros(16, np.float32)
    c[0] = 2.0**-24
    assert _testing.bf16_op("vdpbf16ps", native, a, b, c)
    assert c[0] == 1.0
    # denormal inputs count as zero, denormal results are flushed
    a[:] = 0
    a[0] = 0x0001                       # the smallest bfloat16 denormal
    b = np.zeros(32, np.uint16)
    b[0] = 0x7F00                       # 2**127: 0x0001 * 2**127 would be 2**-6
    c = np.zeros(16, np.float32)
    assert _testing.bf16_op("vdpbf16ps", native, a, b, c)
    assert c[0] == 0
    a[0], b[0] = 0x1F80, 0x1F80         # 2**-64 * 2**-64 = 2**-128: denormal -> 0
    assert _testing.bf16_op("vdpbf16ps", native, a, b, c)
    assert c[0] == 0 and not np.signbit(c[0])


@pytest.mark.parametrize("native", TILE_BOTH, ids=TILE_IDS)
def test_tdpbf16ps_sums_even_and_odd_partials_then_adds_to_c(native):
    A = np.zeros((16, 32), np.uint16)
    B = np.zeros((16, 32), np.uint16)
    A[0, :2] = TWO_M12                  # row 0, pair 0
    B[0, :2] = TWO_M12                  # pair row 0, column 0
    C = np.ones((16, 16), np.float32)
    assert _testing.bf16_op("tdpbf16ps", native, A.ravel(), B.ravel(), C.ravel())
    # even and odd partials 2**-24 each, summed (2**-23) before the add to C
    assert C[0, 0] == np.float32(1 + 2.0**-23)
    assert (C.ravel()[1:] == 1).all()
    # C[m][n] = sum_k A[m][2k+e] B[k][2n+e]: a small integer product, exactly
    rng = np.random.default_rng(1)
    a = rng.integers(-4, 5, (16, 32)).astype(np.float32)
    b = rng.integers(-4, 5, (16, 32)).astype(np.float32)
    C = np.zeros((16, 16), np.float32)
    assert _testing.bf16_op("tdpbf16ps", native, (bits32(a) >> 16).astype(np.uint16).ravel(),
                            (bits32(b) >> 16).astype(np.uint16).ravel(), C.ravel())
    want = a.reshape(16, 16, 2).reshape(16, 32) @ b.reshape(16, 16, 2).transpose(0, 2, 1).reshape(32, 16)
    np.testing.assert_array_equal(C, want)


def test_tdpfp16ps_emulated_on_float16_pairs():
    a = np.zeros((16, 32), np.float16)
    b = np.zeros((16, 32), np.float16)
    a[2, 4:6] = [1.5, np.float16(2.0**-24)]      # a float16 denormal is kept
    b[2, 6:8] = [2.0, 2.0**10]
    C = np.zeros((16, 16), np.float32)
    assert _testing.bf16_op("tdpfp16ps", False, a.view(np.uint16).ravel(),
                            b.view(np.uint16).ravel(), C.ravel())
    assert C[2, 3] == np.float32(3.0 + 2.0**-14)
    assert np.count_nonzero(C) == 1


def _bf16_bits(rng, n, scale):
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    return (bits32(x) >> 16).astype(np.uint16)


def _same_both_ways(name, a, b, c):
    c1, c2 = c.copy(), c.copy()
    assert _testing.bf16_op(name, False, a, b, c1)
    assert _testing.bf16_op(name, True, a, b, c2)
    np.testing.assert_array_equal(c1.view(f"u{c.itemsize}"), c2.view(f"u{c.itemsize}"))


SCALES = pytest.mark.parametrize("scale", [1.0, 1e-30, 1e30], ids=["normal", "tiny", "huge"])


@pytest.mark.skipif(not NATIVE_TILES, reason="the CPU (or this emulation build) has no AMX-BF16")
@SCALES
def test_emulated_tdpbf16ps_matches_the_instruction_bitwise(scale):
    rng = np.random.default_rng(2)
    for _ in range(20):
        a, b = _bf16_bits(rng, 512, scale), _bf16_bits(rng, 512, scale)
        _same_both_ways("tdpbf16ps", a, b, (rng.standard_normal(256) * scale).astype(np.float32))


@pytest.mark.skipif(not NATIVE_VEC,
                    reason="the CPU (or this emulation build) has no AVX512-BF16")
@SCALES
def test_emulated_vector_instructions_match_them_bitwise(scale):
    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = _bf16_bits(rng, 32, scale), _bf16_bits(rng, 32, scale)
        _same_both_ways("vdpbf16ps", a, b, (rng.standard_normal(16) * scale).astype(np.float32))
        x = rng.standard_normal(16).astype(np.float32) * np.float32(scale)
        x[:3] = from_bits([0x7F800001, 0x00000001, 0x807FFFFF])   # sNaN, denormals
        y = rng.standard_normal(16).astype(np.float32)
        _same_both_ways("vcvtne2ps2bf16", x, y, np.zeros(32, np.uint16))
        _same_both_ways("vcvtneps2bf16", x, y, np.zeros(16, np.uint16))
