"""float16 on the amx tier's tiles (AMX-FP16: TDPFP16PS) in the 16-bit flash
driver (src_c/driver/flash16.c), where the CPU has AMX-FP16 or in the
emulation build (FASTATTN_AVX512_EMULATION=simde, which CI's sanitizer step
runs): the derived bound of test_amx_flash.py with float16's unit roundoff
(2^-11 for P and the output, plus 2^-25 absolute below float16's normals,
where P and the output are subnormal), bitwise the same for any thread
count, NaN/Inf values as in the reference; and the hand-encoded tile
instruction pinned against the intrinsic (TDPBF16PS by the same bytes).
Without AMX-FP16, float16 runs the F16C float32-arithmetic path, which
tests/numerics/test_half_attention.py covers."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
import fastattn._testing as _testing
from conftest import using_isa
from test_amx_flash import (CASES, bound, check_differs_from_the_float32_path,
                            check_gqa_key_padding_and_lse, check_visible_nan_and_inf_values)

NATIVE_AMX = "amx" in fastattn.available_isas() and not _core.avx512_emulated()
needs_fp16_tiles = pytest.mark.skipif(
    not _core.amx_fp16(), reason="float16 tiles need AMX-FP16 (this CPU lacks it) or the "
    "emulation build (FASTATTN_AVX512_EMULATION=simde)")
F16 = dict(u=2.0**-11, sub=2.0**-25)


@pytest.fixture
def amx():
    if "amx" not in fastattn.available_isas():
        pytest.skip("no amx tier on this CPU (the emulation build, "
                    "FASTATTN_AVX512_EMULATION=simde, has it)")
    with using_isa("amx"):
        yield


def f16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


@pytest.mark.skipif(not NATIVE_AMX, reason="native AMX-BF16 tiles (this CPU or build lacks them)")
def test_tile_instruction_bytes_match_the_intrinsic():
    """TDPBF16PS issued by the bytes that issue TDPFP16PS (pp = 2 for 3) gives
    the intrinsic's results bitwise: the encoding of the float16 tiles."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(512).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    a16 = (a.view(np.uint32) >> 16).astype(np.uint16)
    b16 = (b.view(np.uint32) >> 16).astype(np.uint16)
    c0 = rng.standard_normal(256).astype(np.float32)
    c1, c2 = c0.copy(), c0.copy()
    assert _testing.bf16_op("tdpbf16ps", True, a16, b16, c1)
    assert _testing.bf16_op("tdpbf16ps_bytes", True, a16, b16, c2)
    np.testing.assert_array_equal(c1.view(np.uint32), c2.view(np.uint32))
    assert not np.array_equal(c1, c0)


@needs_fp16_tiles
def test_tdpfp16ps_native_matches_emulation():
    rng = np.random.default_rng(2)
    a = f16(rng, 512).view(np.uint16)
    b = f16(rng, 512).view(np.uint16)
    c0 = rng.standard_normal(256).astype(np.float32)
    c1, c2 = c0.copy(), c0.copy()
    _testing.bf16_op("tdpfp16ps", False, a, b, c1)
    if not _testing.bf16_op("tdpfp16ps", True, a, b, c2):
        pytest.skip("no native TDPFP16PS (the emulation build)")
    np.testing.assert_array_equal(c1.view(np.uint32), c2.view(np.uint32))


@needs_fp16_tiles
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("L,S,E,Ev", [(70, 90, 64, 64), (33, 17, 128, 80), (40, 150, 16, 8)],
                         ids=lambda x: str(x))
def test_float16_within_the_derived_bound(amx, case, L, S, E, Ev):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = f16(rng, (2, 3, L, E)), f16(rng, (2, 3, S, E)), f16(rng, (2, 3, S, Ev))
    out = fastattn.attention(q, k, v, **CASES[case])
    assert out.dtype == np.float16 and out.shape == (2, 3, L, Ev)
    ref, tol = bound(q, k, v, **F16, **CASES[case])
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= tol), (err.max(), tol[err > tol][:5])


@needs_fp16_tiles
def test_float16_rounds_p_to_float16_unlike_the_f16c_path(amx):
    check_differs_from_the_float32_path(np.float16)


@needs_fp16_tiles
@pytest.mark.parametrize("causal", [False, True])
def test_float16_threads_bitwise_identical(amx, causal):
    rng = np.random.default_rng(7)
    q, k, v = f16(rng, (2, 2, 70, 64)), f16(rng, (2, 2, 150, 64)), f16(rng, (2, 2, 150, 64))
    one = fastattn.attention(q, k, v, is_causal=causal, num_threads=1)
    for nt in (2, 3):
        other = fastattn.attention(q, k, v, is_causal=causal, num_threads=nt)
        np.testing.assert_array_equal(one.view(np.uint16), other.view(np.uint16))


@needs_fp16_tiles
def test_float16_gqa_key_padding_lse_and_tiny_weights(amx):
    """Grouped heads, padding, and scores spread wide enough (queries x3) that
    weights fall below float16's normals (2^-14)."""
    check_gqa_key_padding_and_lse(np.float16, qscale=3.0, **F16)


@needs_fp16_tiles
def test_float16_visible_nan_and_inf_values_as_in_the_reference(amx):
    check_visible_nan_and_inf_values(np.float16)


@needs_fp16_tiles
def test_float16_outputs_at_the_top_of_the_range_stay_finite(amx):
    """Values at float16's largest finite (65504): equal weights give them back
    exactly; a mix rounds to a finite float16 (only a float32 result of at
    least 65520 rounds to inf, and a convex combination of finite values never
    reaches it)."""
    q = np.zeros((1, 32, 16), np.float16)
    k = np.zeros((1, 40, 16), np.float16)
    v = np.full((1, 40, 16), 60000.0, np.float16)
    v[0, :, 1] = 65504.0
    v[0, :20, 2], v[0, 20:, 2] = 65504.0, 65000.0
    out = fastattn.attention(q, k, v)
    assert np.all(out[0, :, 0] == np.float16(60000.0)) and np.all(out[0, :, 1] == np.float16(65504.0))
    ref = np.float16(np.mean(v[0, :, 2].astype(np.float64)))
    assert np.all(out[0, :, 2] == ref)
