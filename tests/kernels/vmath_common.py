"""The vector exp, exp2 and tanh of two ISA paths compared bitwise, for the
ARM tiers' tests of this folder."""
import numpy as np

from conftest import using_isa
from fastattn import _testing

SPECIAL = [0.0, -0.0, np.nan, -np.inf, np.inf, -0.5, 0.5, -1e-30, -126.5, -126.49,
           -127.0, -87.3365478515625, -87.33, -1022.5, -1022.49, -708.39, -708.4, -1e30,
           0.625, -0.625, 0.62499, 20.0, -20.0, 1e30]


def edges(dtype, n):
    """n random arguments of the softmax domain, n of tanh's, and the points
    where exp, exp2 and tanh change branch or flush to zero."""
    rng = np.random.default_rng(11)
    return np.concatenate([-rng.random(n) * 1100, rng.standard_normal(n) * 4,
                           SPECIAL]).astype(dtype)


def assert_vector_math_bitwise_equal(x, isa_a, isa_b):
    """exp, exp2 and tanh of x on the two paths: the same bits (NaN as NaN)."""
    got = {}
    for isa in (isa_a, isa_b):
        with using_isa(isa):
            got[isa] = [_testing.exp(x, False), _testing.exp(x, True), _testing.tanh(x)]
    for name, a, b in zip(("exp", "exp2", "tanh"), got[isa_a], got[isa_b]):
        differ = ~((a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b)))
        assert not differ.any(), (name, x[differ][:5], a[differ][:5], b[differ][:5])
