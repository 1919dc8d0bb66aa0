"""The kernels' vectorised exp and exp2 (src_c/simd/vmath_tmpl.h), on every ISA path.

The softmax (``exp``) and the streaming attention (``exp2``, scores in log2
units) exponentiate ``x = score - row max <= 0``.  ``fastattn._testing.exp``
runs the ISA's own exp over an array, so its accuracy is measured here in
ulps against an extended-precision reference, not through the looser
tolerances of the attention tests.
"""

import numpy as np
import pytest

from fastattn import _testing

# float: degree-5 minimax polynomials, measured 2.1 ulp; double: degree-13
# Taylor series, measured 0.9 ulp (the reference adds up to 0.5 ulp where
# long double is no wider than double).
MAX_ULP = {np.dtype(np.float32): 3.0, np.dtype(np.float64): 2.0}
# Domains on which every result is a normal number (AVX2/AVX-512 flush
# smaller results to 0 or a subnormal, the portable path to 0).
DOMAIN = {
    (np.dtype(np.float32), True): -126.0,
    (np.dtype(np.float32), False): -87.0,
    (np.dtype(np.float64), True): -1022.0,
    (np.dtype(np.float64), False): -708.0,
}
NPOINTS = {np.dtype(np.float32): 1 << 20, np.dtype(np.float64): 1 << 18}

DTYPES = [np.float32, np.float64]
BASES = [pytest.param(True, id="exp2"), pytest.param(False, id="exp")]


def _reference(x, base2):
    xl = x.astype(np.longdouble)
    return np.exp2(xl) if base2 else np.exp(xl)


def _ulp_error(got, want, dtype):
    mant = np.finfo(dtype).nmant
    e = np.floor(np.log2(want.astype(np.float64)))
    ulp = np.exp2(e - mant).astype(np.longdouble)
    return (np.abs(got.astype(np.longdouble) - want) / ulp).astype(np.float64)


@pytest.mark.parametrize("base2", BASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_within_a_few_ulp_on_the_softmax_domain(isa, dtype, base2, rng):
    dtype = np.dtype(dtype)
    lo = DOMAIN[dtype, base2]
    n = NPOINTS[dtype]
    # a dense grid over the domain, a dense grid over [-1, 0] (the weights
    # that matter most) and random points
    x = np.concatenate([
        np.linspace(lo, 0, n),
        np.linspace(-1, 0, n // 4),
        rng.uniform(lo, 0, n // 4),
    ]).astype(dtype)
    got = _testing.exp(x, base2)
    assert got.dtype == dtype and got.shape == x.shape
    err = _ulp_error(got, _reference(x, base2), dtype)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP[dtype], (
        f"{'exp2' if base2 else 'exp'}({x[worst]!r}) = {got[worst]!r}: "
        f"{err[worst]:.2f} ulp (at most {MAX_ULP[dtype]})"
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp2_of_integers_is_exact(isa, dtype):
    # r = 0: the polynomial gives exactly 1, so a score equal to the row max
    # gets weight exactly 1 and integer steps exact powers of two.
    k = np.arange(-120, 1, dtype=dtype)
    np.testing.assert_array_equal(_testing.exp(k, True), np.exp2(k))
    assert _testing.exp(np.zeros(3, dtype), False).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("base2", BASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_special_values(isa, dtype, base2):
    # -inf (a hidden score) and arguments far below the smallest normal
    # result give exactly 0; NaN stays NaN.  Vector bodies and scalar tails
    # both: 37 elements.
    dtype = np.dtype(dtype)
    tiny = -200.0 if dtype == np.float32 else -1100.0
    x = np.full(37, -np.inf, dtype)
    x[1::3] = tiny
    x[2::3] = np.nan
    got = _testing.exp(x, base2)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    assert np.all(got[~np.isnan(x)] == 0)


def test_exp_hook_rejects_what_it_cannot_take():
    with pytest.raises(TypeError, match="1-D C-contiguous"):
        _testing.exp(np.zeros((2, 2), np.float32), True)
    with pytest.raises(TypeError, match="1-D C-contiguous"):
        _testing.exp(np.zeros(8, np.float32)[::2], True)
    with pytest.raises(TypeError, match="float32 or float64"):
        _testing.exp(np.zeros(4, np.int32), False)
    with pytest.raises(TypeError, match="native byte order"):
        _testing.exp(np.zeros(4, ">f4"), False)
    with pytest.raises(TypeError, match="aligned"):
        _testing.exp(np.zeros(17, np.uint8)[1:].view(np.float32), False)
