"""softmax() on float16 and bfloat16: read in place, computed in float32,
rounded once -- bitwise the float32 softmax of the widened input, rounded,
and within one ulp plus float32 rounding of the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference

from half_common import F32, HALF_IDS, HALVES, assert_bitwise, assert_half_close, randn


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("axis", [-1, 0, None])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_half_softmax_rounded_once(isa, rng, dt, axis, masked):
    x = randn(rng, (7, 300), dt, 3.0)
    x[2, 5] = -np.inf
    mask = rng.random(x.shape) < 0.8 if masked else None
    got = fastattn.softmax(x, axis, mask=mask)
    assert got.dtype == dt
    assert_bitwise(got, fastattn.softmax(x.astype(F32), axis, mask=mask).astype(dt))
    assert_half_close(got, reference.softmax(x.astype(np.float64), axis, mask=mask), dt)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_softmax_in_place_and_strided(isa, rng, dt):
    x = randn(rng, (40, 64), dt)
    want = fastattn.softmax(x.astype(F32), axis=0).astype(dt)
    y = x.copy()
    assert fastattn.softmax(y, axis=0, out=y) is y
    assert_bitwise(y, want)
    xt = np.ascontiguousarray(x.T).T              # column-major: strided rows
    assert_bitwise(fastattn.softmax(xt, axis=0), want)
