"""What is particular to the neon tier (src_c/simd/simd_neon.h).

The suite's ISA-parametrized tests run everything else on it (the ``isa``
fixture takes ``neon`` from ``available_isas()``: an aarch64 build, or the
x86-64 test build ``FASTATTN_NEON_EMULATION=simde``).  Here: the vector exp,
exp2 and tanh at their edges, and bitwise those of avx2 where both run (the
same operation sequence of vmath_tmpl.h, fused alike: a check of every
primitive of the mapping, FMLS and the rounding included); float16 and
bfloat16 widened exactly (FCVTL, a shift) and rounded once to nearest even.
"""

import numpy as np
import pytest

import fastattn
from conftest import using_isa
from fastattn import _testing
from vmath_common import assert_vector_math_bitwise_equal, edges

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.skipif(
    "neon" not in fastattn.available_isas(),
    reason="the neon tier is not available here (an aarch64 build, or "
           "FASTATTN_NEON_EMULATION=simde on x86-64)")

DTYPES = [pytest.param(np.float32, id="float32"), pytest.param(np.float64, id="float64")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_neon_exp_exp2_tanh_edges(dtype):
    x = np.array([0.0, -np.inf, np.nan, -1e30], dtype)
    with using_isa("neon"):
        for base2 in (False, True):
            y = _testing.exp(x, base2)
            assert y[0] == 1 and y[1] == 0 and np.isnan(y[2]) and y[3] == 0
        lo2 = -126.5 if dtype == np.float32 else -1022.5
        assert np.all(_testing.exp(np.array([lo2 - 0.01, 2 * lo2], dtype), True) == 0)
        t = _testing.tanh(np.array([-0.0, np.inf, -np.inf, np.nan, 0.3], dtype))
    assert np.signbit(t[0]) and t[0] == 0 and t[1] == 1 and t[2] == -1 and np.isnan(t[3])
    assert abs(t[4] - np.tanh(dtype(0.3))) <= 2 * np.spacing(dtype(0.3))


@pytest.mark.skipif("avx2" not in fastattn.available_isas(),
                    reason="the avx2 tier is not available here (the comparison needs both)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_neon_exp_exp2_tanh_are_bitwise_avx2s(dtype):
    assert_vector_math_bitwise_equal(edges(dtype, 20000), "avx2", "neon")


def _sixteen_bit_values(dt, rng, shape):
    """Random values, with the extremes of the format among them: float16
    subnormals, the smallest normals."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    info = ml_dtypes.finfo(dt) if dt is ml_dtypes.bfloat16 else np.finfo(dt)
    extremes = [float(info.smallest_subnormal), -3 * float(info.smallest_subnormal),
                float(info.smallest_normal), 8.0]
    flat[: len(extremes)] = extremes
    return x.astype(dt)


@pytest.mark.parametrize("dt", [pytest.param(np.float16, id="float16"),
                                pytest.param(ml_dtypes.bfloat16, id="bfloat16")])
@pytest.mark.parametrize("L", [3, 40], ids=["direct_decode", "packed"])
def test_neon_16_bit_storage_widened_exactly_and_rounded_once(dt, L):
    """16-bit Q, K, V give bitwise the float32 result of their widened values,
    rounded once to the 16-bit type: the widening is exact (subnormals
    included) and the rounding to nearest even is the output's only one."""
    rng = np.random.default_rng(5)
    q = _sixteen_bit_values(dt, rng, (1, 2, L, 40))
    k = _sixteen_bit_values(dt, rng, (1, 2, 77, 40))
    v = _sixteen_bit_values(dt, rng, (1, 2, 77, 24))
    with using_isa("neon"):
        got = fastattn.attention(q, k, v)
        wide = fastattn.attention(q.astype(np.float32), k.astype(np.float32),
                                  v.astype(np.float32))
    assert got.dtype == np.dtype(dt)
    assert got.tobytes() == wide.astype(dt).tobytes()


def test_neon_emulation_build_says_so(capsys):
    """A SIMDe build of the neon kernels (FASTATTN_NEON_EMULATION=simde) is a
    test build, and show_config() says so; an aarch64 build is not one."""
    from fastattn import _config, _core
    emulated = _core.neon_emulated()
    assert emulated == (_config.config()["arch"] != "aarch64")
    fastattn.show_config()
    out = capsys.readouterr().out
    assert ("neon            : EMULATED by SIMDe" in out) == emulated
