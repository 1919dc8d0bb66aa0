"""Shared by the api/ tests: small inputs and the check that a call raises,
names its argument (and shapes) and leaves ``out`` untouched."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from conftest import mentions_shape

SENTINEL = -12345.0
QS, KS, VS, OS = (2, 3, 4), (2, 5, 4), (2, 5, 6), (2, 3, 6)


def _qkv(dtype=np.float64, qs=QS, ks=KS, vs=VS, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))


def _raises(exc, names=(), shapes=(), *args, call=fastattn.attention, out_shape=OS,
            out_dtype=np.float64, **kwargs):
    """call(*args, **kwargs) must raise exc, name every name, show every shape,
    and write nothing: neither a sentinel ``out`` of ``out_shape`` (made here
    unless ``out_shape`` is None or the caller gives ``out``) nor the caller's
    own ``out``."""
    out = None
    if out_shape is not None and "out" not in kwargs:
        out = kwargs["out"] = np.full(out_shape, SENTINEL, out_dtype)
    given = kwargs.get("out")
    before = given.copy() if isinstance(given, np.ndarray) else None
    with pytest.raises(exc) as info:
        call(*args, **kwargs)
    msg = str(info.value)
    for n in names:
        assert n in msg, f"the message does not name {n!r}: {msg!r}"
    for s in shapes:
        assert mentions_shape(msg, s), f"the message does not show {s}: {msg!r}"
    if out is not None:
        assert np.all(out == SENTINEL), "out was written before the error"
    if before is not None:
        assert np.array_equal(given, before, equal_nan=True), "out was written before the error"
    return msg


def _sm_raises(exc, names, shapes, x, **kw):
    return _raises(exc, names, shapes, x, call=fastattn.softmax, out_shape=None, **kw)
