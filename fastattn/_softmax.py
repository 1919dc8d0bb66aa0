"""softmax(): ``scipy.special.softmax`` with a mask, ``out=`` and threads.

Validation and the axes as rows in plain Python and NumPy (the dtype and
``out=`` rules are :mod:`fastattn._validate`'s); the rows go to the C kernel
behind :mod:`fastattn._core` in one call."""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np

from . import _core
from ._validate import as_array, check_out, kernel_dtypes

if TYPE_CHECKING:
    from typing import TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]

__all__ = ["softmax"]



def _normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    res = []
    for a in axes:
        if isinstance(a, (bool, np.bool_)):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
        try:
            a = operator.index(a)
        except TypeError:
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}") from None
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(a, ndim)
        a %= ndim
        if a in res:
            raise ValueError(f"axis {axis!r} repeats an axis")
        res.append(a)
    return tuple(res)


# np.reshape(copy=False) refuses to copy from NumPy 2.1 on; before it, only
# setting .shape did (which NumPy 2.5 deprecates).
_RESHAPE_HAS_COPY = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def _as_rows(a: np.ndarray, axes: tuple, nred: int) -> np.ndarray | None:
    """View a with the axes moved last, as (rows, n); None if that needs a copy."""
    t = np.moveaxis(a, axes, tuple(range(a.ndim - nred, a.ndim))) if axes else a
    shape = (math.prod(t.shape[:t.ndim - nred]), math.prod(t.shape[t.ndim - nred:]))
    if _RESHAPE_HAS_COPY:
        try:
            return np.reshape(t, shape, copy=False)
        except ValueError:
            return None
    r = t.view()
    try:
        r.shape = shape
    except AttributeError:
        return None
    return r


def softmax(x: ArrayLike, axis: SupportsIndex | tuple[SupportsIndex, ...] | None = None, *,
            mask: ArrayLike | None = None, out: NDArray[Any] | None = None) -> _Float:
    """Softmax along ``axis``, a drop-in for :func:`scipy.special.softmax`.

    ``exp(x - max) / sum(exp(x - max))`` computed in one vectorised pass per
    step, threaded over slices, without temporaries of the input's size.

    Parameters
    ----------
    x : array_like
        Input; float16, bfloat16, float32 and float64 keep their dtype (the
        16-bit ones are read in place, computed in float32 and rounded
        once), integer and bool inputs give float64.
    axis : int or tuple of ints, optional
        Axis or axes to compute over; None (the default) = the whole array,
        as in SciPy.
    mask : array_like of bool, optional
        Broadcastable to ``x``; True = keep.  Masked entries get exactly 0,
        and a slice with nothing kept becomes all 0.
    out : ndarray, optional
        Result array of ``x``'s shape and the result dtype; ``out=x``
        computes in place without allocating a copy of ``x``.

    Returns
    -------
    ndarray
        Same shape as ``x``.  NaN where SciPy gives NaN (a slice holding a
        NaN or ``+inf``, or made only of ``-inf``).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> np.round(fastattn.softmax(np.array([[0.0, 0.7071], [1.0, 1.0]]), axis=-1), 3)
    array([[0.33, 0.67],
           [0.5 , 0.5 ]])
    >>> fastattn.softmax(np.array([1.0, 2.0, 3.0]), mask=np.array([True, False, True])).round(3)
    array([0.119, 0.   , 0.881])
    """
    xa = x if type(x) is np.ndarray else as_array(x, "x")
    cdt, odt = kernel_dtypes((("x", xa.dtype),))
    axes = _normalize_axes(axis, xa.ndim)
    keep = None
    if mask is not None:
        m = mask if isinstance(mask, np.ndarray) else as_array(mask, "mask")
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be bool (True = keep), got dtype {m.dtype}")
        try:
            keep = np.broadcast_to(m, xa.shape).view(np.uint8)
        except ValueError:
            raise ValueError(f"mask of shape {m.shape} does not broadcast to x's shape {xa.shape}") from None
    if out is not None:
        check_out(out, xa.shape, odt, (("mask", mask if isinstance(mask, np.ndarray) else None),))
    if xa.size == 0:
        return out if out is not None else np.empty(xa.shape, odt)
    xc = xa if xa.dtype == cdt and xa.flags.aligned else np.ascontiguousarray(xa, dtype=cdt)
    xv = xc.reshape(1, 1) if xc.ndim == 0 else xc
    ax = (0, 1) if xc.ndim == 0 else axes
    nred = len(ax)
    x2 = _as_rows(xv, ax, nred)
    if x2 is None:
        x2 = np.ascontiguousarray(np.moveaxis(xv, ax, tuple(range(xv.ndim - nred, xv.ndim))))
        x2 = x2.reshape(-1, math.prod(x2.shape[xv.ndim - nred:]))
    k2 = None
    if keep is not None:
        kv = keep.reshape(1, 1) if keep.ndim == 0 else keep
        k2 = _as_rows(kv, ax, nred)
        if k2 is None:
            k2 = np.ascontiguousarray(np.moveaxis(kv, ax, tuple(range(kv.ndim - nred, kv.ndim))))
            k2 = k2.reshape(x2.shape)
    y2 = None
    if out is not None and odt == cdt and out.flags.aligned:
        ov = out.reshape(1, 1) if out.ndim == 0 else out
        y2 = _as_rows(ov, ax, nred)
        if y2 is not None and np.may_share_memory(y2, x2) and not (
                y2.ctypes.data == x2.ctypes.data and y2.strides == x2.strides):
            y2 = None  # partial overlap: go through a temporary
    if y2 is None:
        y2 = np.empty(x2.shape, cdt)
        _core.softmax_rows(x2, y2, keep=k2)
        moved = (tuple(xv.shape[i] for i in range(xv.ndim) if i not in ax) +
                 tuple(xv.shape[i] for i in ax))
        res = y2.reshape(moved)
        res = np.moveaxis(res, tuple(range(xv.ndim - nred, xv.ndim)), ax).reshape(xa.shape)
        if out is not None:
            out[...] = res
            return out
        return res if odt == cdt else res.astype(odt)
    _core.softmax_rows(x2, y2, keep=k2)
    return out
