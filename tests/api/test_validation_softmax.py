"""Argument validation of fastattn.softmax: dtypes, the mask, ``out=`` and
``axis``.

Every error names the argument (and the dtypes or shapes) and leaves ``out``
untouched.  Where a check could depend on ``axis``, it runs with the default
(``axis=None``, as scipy.special.softmax) and with ``axis=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from api_common import SENTINEL, _sm_raises

AXES = pytest.mark.parametrize("axis", [None, 1], ids=["axis_None", "axis_1"])


@AXES
@pytest.mark.parametrize("bad", ["complex128", "object", "U3", "datetime64[s]"])
def test_softmax_unsupported_dtype_raises_type_error(bad, axis):
    _sm_raises(TypeError, [str(np.dtype(bad))], [], np.zeros((3, 4), bad), axis=axis)


def test_softmax_none_raises_type_error():
    _sm_raises(TypeError, ["object"], [], None)


def test_softmax_int_mask_raises_type_error():
    _sm_raises(TypeError, ["mask", "int64"], [], np.zeros((3, 4)), mask=np.ones(4, np.int64))


@AXES
@pytest.mark.parametrize("mshape", [(3,), (3, 5), (2, 3, 4)],
                         ids=["does_not_broadcast_1d", "does_not_broadcast_2d", "would_grow_x"])
def test_softmax_mask_wrong_shape_raises_value_error(mshape, axis):
    _sm_raises(ValueError, ["mask"], [mshape, (3, 4)], np.zeros((3, 4)), axis=axis,
               mask=np.ones(mshape, bool))


@AXES
def test_softmax_out_read_only_raises_value_error(axis):
    x = np.zeros((3, 4))
    out = np.full((3, 4), SENTINEL)
    out.flags.writeable = False
    _sm_raises(ValueError, ["out", "read-only"], [], x, axis=axis, out=out)
    assert np.all(out == SENTINEL)


@AXES
def test_softmax_out_wrong_dtype_raises_type_error(axis):
    out = np.full((3, 4), SENTINEL, np.float32)
    _sm_raises(TypeError, ["out", "float32"], [], np.zeros((3, 4)), axis=axis, out=out)
    assert np.all(out == SENTINEL)


@AXES
@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (12,)])
def test_softmax_out_wrong_shape_raises_value_error(shape, axis):
    out = np.full(shape, SENTINEL)
    _sm_raises(ValueError, ["out"], [shape, (3, 4)], np.zeros((3, 4)), axis=axis, out=out)
    assert np.all(out == SENTINEL)


def test_softmax_out_overlapping_mask_raises_value_error():
    out = np.zeros((3, 8))
    mask = out.view(np.uint8)[:, :8].view(bool)
    _sm_raises(ValueError, ["out", "mask"], [], np.zeros((3, 8)), out=out, mask=mask)


@pytest.mark.parametrize("axis,exc", [(2, np.exceptions.AxisError), (-3, np.exceptions.AxisError),
                                      ((0, 2), np.exceptions.AxisError), (1.0, TypeError),
                                      ((0, -2), ValueError), ((0, 0), ValueError),
                                      ("0", TypeError)])
def test_softmax_bad_axis(axis, exc):
    _sm_raises(exc, [], [], np.zeros((3, 4)), axis=axis)


@pytest.mark.parametrize("axis", [True, (0, np.False_)], ids=["bool", "bool_in_tuple"])
def test_softmax_bool_axis_raises_type_error(axis):
    """As SciPy's softmax: a bool is not an axis."""
    with pytest.raises(TypeError, match="axis must be"):
        fastattn.softmax(np.ones((2, 3)), axis=axis)
