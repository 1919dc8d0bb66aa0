"""The kernels' vectorised tanh (src_c/simd/vmath_tmpl.h), on every ISA path.

``softcap`` turns each score ``s`` into ``c * tanh(s / c)``; the kernel's
tanh (the softcap kernel with ``c = 1``, through ``fastattn._testing.tanh``)
is measured here in ulps against an extended-precision reference: Cephes'
small-argument forms below 0.625 and ``(1 - t) / (1 + t)``, ``t =
exp(-2|x|)`` above (the generic path calls the C library).
"""

import numpy as np
import pytest

from fastattn import _testing

# Measured: float 1.9 ulp, double 1.5 ulp (AVX2, AVX-512); the C library of
# the generic path 2.1 (the reference adds up to 0.5 ulp where long double
# is no wider than double).
MAX_ULP = {np.dtype(np.float32): 3.0, np.dtype(np.float64): 3.0}
NPOINTS = {np.dtype(np.float32): 1 << 20, np.dtype(np.float64): 1 << 18}
DTYPES = [np.float32, np.float64]


def _ulp_error(got, want, dtype):
    mant = np.finfo(dtype).nmant
    tiny = np.finfo(dtype).tiny
    e = np.floor(np.log2(np.maximum(np.abs(want.astype(np.float64)), tiny)))
    ulp = np.exp2(e - mant).astype(np.longdouble)
    return (np.abs(got.astype(np.longdouble) - want) / ulp).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tanh_within_a_few_ulp(isa, dtype, rng):
    dtype = np.dtype(dtype)
    n = NPOINTS[dtype]
    # the whole range where tanh is not yet 1, densely around the switch at
    # 0.625, tiny arguments, and random points
    x = np.concatenate([
        np.linspace(-20, 20, n),
        np.linspace(0.5, 0.75, n // 8),
        np.geomspace(1e-30, 1.0, n // 8),
        rng.uniform(-10, 10, n // 4),
    ]).astype(dtype)
    x = np.concatenate([x, -x])
    got = _testing.tanh(x)
    assert got.dtype == dtype and got.shape == x.shape
    err = _ulp_error(got, np.tanh(x.astype(np.longdouble)), dtype)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP[dtype], (
        f"{isa} {dtype}: tanh({x[worst]!r}) off by {err[worst]:.2f} ulp")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tanh_special_values(isa, dtype):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e6, -1e6, 40.0], dtype=dtype)
    got = _testing.tanh(x)
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2])
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])
    assert got[5] == 1 and got[6] == -1 and got[7] == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 3, 7, 8, 9, 15, 16, 17, 33])
def test_tanh_every_length_and_tail(isa, dtype, n, rng):
    x = rng.uniform(-3, 3, n).astype(dtype)
    got = _testing.tanh(x)
    np.testing.assert_allclose(got, np.tanh(x), rtol=4 * np.finfo(dtype).eps, atol=0)


def test_tanh_rejects_non_float():
    with pytest.raises(TypeError, match="float32 or float64"):
        _testing.tanh(np.arange(3))
