"""Helpers of the 16-bit (float16, bfloat16) tests: the dtypes, their ulp,
and the two checks every case makes -- bitwise equality with the float32
computation on the widened inputs, rounded once, and closeness to the
float64 reference within one ulp of the dtype plus float32 rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
HALVES = (F16, BF16)
HALF_IDS = ("float16", "bfloat16")
_MANT = {F16: 10, BF16: 7}
_EMIN = {F16: -14, BF16: -126}
EPS32 = float(np.finfo(np.float32).eps)


def ulp(x, dt) -> np.ndarray:
    """The spacing of dtype dt at |x| (float64 x)."""
    ax = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    e = np.maximum(np.where(np.isfinite(e), e, 0), _EMIN[dt])
    return 2.0 ** (e - _MANT[dt])


def assert_half_close(got, want, dt, magnitude=1.0, factor=64.0, err_msg=""):
    """|got - want| <= ulp_dt(want) + factor * eps32 * magnitude: one ulp of
    the output dtype plus float32 rounding of the computation; NaN and inf
    where want has them."""
    with np.errstate(invalid="ignore"):
        g = np.asarray(got).astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=err_msg + " (NaN)")
    fin = np.isfinite(w)
    np.testing.assert_array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)],
                                  err_msg=err_msg + " (inf)")
    bound = ulp(w, dt) + factor * EPS32 * max(1.0, float(magnitude))
    err = np.abs(g - w)
    bad = fin & ~(err <= bound)
    assert not bad.any(), (f"{err_msg}: {int(bad.sum())} entries beyond one {dt} ulp + "
                           f"float32 rounding; worst {err[bad].max()} at "
                           f"{np.argwhere(bad)[0]}")


def assert_bitwise(got, want, err_msg=""):
    """Bitwise equal 16-bit (or float32) arrays, NaN matching NaN."""
    g, w = np.asarray(got), np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
    with np.errstate(invalid="ignore"):
        gn, wn = np.isnan(g.astype(np.float64)), np.isnan(w.astype(np.float64))
    np.testing.assert_array_equal(gn, wn, err_msg=err_msg + " (NaN)")
    ib = {2: np.uint16, 4: np.uint32, 8: np.uint64}[g.dtype.itemsize]
    np.testing.assert_array_equal(g.view(ib)[~gn], w.view(ib)[~wn], err_msg=err_msg)


def randn(rng, shape, dt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt)
