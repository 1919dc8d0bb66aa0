"""Shared by the backward's tests: the forward-error bound that
test_backward.py derives (its module docstring) for a gradient entry."""

import numpy as np


def grad_bound(g_ref, dtype, n):
    """The bound for a gradient of reference value ``g_ref`` over ``n = max(L,
    S) + E + Ev``: 1e-12 max|g| in float64, 4 n u32 max|g| in float32, plus
    4 u16 max|g| for 16-bit inputs."""
    m = float(np.max(np.abs(g_ref.astype(np.float64)), initial=0.0)) or 1.0
    dt = np.dtype(dtype)
    if dt == np.float64:
        return 1e-12 * m
    base = 4 * n * 2.0 ** -24 * m
    if dt == np.float32:
        return base
    return base + 4 * (2.0 ** -11 if dt == np.float16 else 2.0 ** -8) * m
