"""Every mask form resolved in one place.

``resolve()`` turns ``attn_mask``, ``is_causal`` and ``key_padding_mask``
into one :class:`MaskPlan`: the query rows' key positions as an offset
(query ``i`` sits at ``p(i) = i + offset``; causal: it sees key ``j`` iff
``j <= p(i)``), the sliding window's sides (``p(i) - win_left <= j <=
p(i) + win_right``; :data:`UNBOUNDED` for no bound), a boolean block (uint8 view, 1 = may
attend), an additive block (in the compute dtype) and the key-padding rows
(uint8, 1 = padding).  The kernels combine them: a position hidden by any of
them is hidden (so is one whose additive mask is ``-inf``).

``check_window()`` validates ``window`` (the reference uses it too).

``check_head_masks()`` and ``check_cache_causal()`` are the stricter rules of
:func:`fastattn.mha.multi_head_attention`, checked before its projections and
before anything is appended to a cache.
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple

import numpy as np

from . import _core
from ._half import is_bfloat16
from ._validate import as_array

__all__ = ["MaskPlan", "resolve", "causal_offset", "check_window", "check_head_masks",
           "check_cache_causal", "UNBOUNDED"]

# A window side that bounds nothing: FA_UNBOUNDED of fastattn.h (2**63 - 1).
UNBOUNDED: int = _core.UNBOUNDED


class MaskPlan(NamedTuple):
    causal: bool
    offset: int
    win_left: int
    win_right: int
    bool_mask: np.ndarray | None
    add_mask: np.ndarray | None
    pad: np.ndarray | None


def causal_offset(is_causal, L: int, S: int) -> tuple[bool, int]:
    """``(causal, offset)`` for ``is_causal``: False, True/'upper_left' or 'lower_right'."""
    if is_causal is False or is_causal is None:
        return False, 0
    if is_causal is True or (isinstance(is_causal, np.bool_) and bool(is_causal)):
        return True, 0
    if isinstance(is_causal, np.bool_):
        return False, 0
    if is_causal == "upper_left":
        return True, 0
    if is_causal == "lower_right":
        return True, S - L
    raise ValueError(f"is_causal must be False, True, 'upper_left' or 'lower_right', got {is_causal!r}")


def _window_side(size):
    """One side of ``window``: None (unbounded) or an int >= 0."""
    if size is None:
        return None
    if isinstance(size, (bool, np.bool_)):
        raise TypeError(f"window sizes must be ints or None, got the bool {size!r}")
    if isinstance(size, (float, np.floating)) and not math.isfinite(size):
        raise ValueError(f"window sizes must be finite (None means unbounded), got {size!r}")
    try:
        n = operator.index(size)
    except TypeError:
        raise TypeError(f"window sizes must be ints or None, "
                        f"got {type(size).__name__} {size!r}") from None
    if n < 0:
        raise ValueError(f"window sizes must be >= 0, got {n}")
    return n


def check_window(window) -> tuple[int | None, int | None]:
    """``window`` as ``(left, right)``, each None or an int >= 0."""
    if window is None:
        return None, None
    if isinstance(window, (tuple, list)):
        if len(window) != 2:
            raise ValueError(f"window must be an int or a (left, right) pair, "
                             f"got {len(window)} items: {window!r}")
        return _window_side(window[0]), _window_side(window[1])
    n = _window_side(window)
    return n, n


def _at_least_2d(m: np.ndarray) -> np.ndarray:
    return m if m.ndim >= 2 else m.reshape((1,) * (2 - m.ndim) + m.shape)


# The plans without a mask array, built once (the per-call overhead of tiny problems).
_NO_MASK = MaskPlan(False, 0, UNBOUNDED, UNBOUNDED, None, None, None)
_NO_MASK_CAUSAL = MaskPlan(True, 0, UNBOUNDED, UNBOUNDED, None, None, None)  # upper-left


def resolve(attn_mask, is_causal, key_padding_mask, batch: tuple, L: int, S: int,
            compute_dtype: np.dtype, query_ndim: int, window=None) -> MaskPlan:
    """Check every mask and the window against the problem ``batch + (L, S)``
    and return the plan."""
    if attn_mask is None and key_padding_mask is None and window is None:
        # the common call: no mask array, no window (the plans built once)
        if is_causal is False:
            return _NO_MASK
        if is_causal is True:
            return _NO_MASK_CAUSAL
    wl = wr = UNBOUNDED
    if window is not None:
        left, right = check_window(window)
        wl = UNBOUNDED if left is None else min(left, UNBOUNDED)
        wr = UNBOUNDED if right is None else min(right, UNBOUNDED)
    if attn_mask is None and key_padding_mask is None:
        return MaskPlan(*causal_offset(is_causal, L, S), wl, wr, None, None, None)
    causal, offset = causal_offset(is_causal, L, S)
    bool_mask = add_mask = pad = None
    target = batch + (L, S)
    if attn_mask is not None:
        m = attn_mask if isinstance(attn_mask, np.ndarray) else as_array(attn_mask, "attn_mask")
        if m.dtype == np.bool_:
            bool_mask = _at_least_2d(m.view(np.uint8))
        elif m.dtype.kind == "f" or is_bfloat16(m.dtype):
            add_mask = _at_least_2d(m.astype(compute_dtype, copy=False))
            if not add_mask.flags.aligned:
                add_mask = np.ascontiguousarray(add_mask)
        else:
            raise TypeError(f"attn_mask must be bool (True = may attend) or floating point "
                            f"(added to the scores), got dtype {m.dtype}")
        if not _broadcastable(m.shape, target):
            raise ValueError(f"attn_mask of shape {m.shape} does not broadcast to "
                             f"(..., L, S) = {target}")
    if key_padding_mask is not None:
        p = key_padding_mask if isinstance(key_padding_mask, np.ndarray) \
            else as_array(key_padding_mask, "key_padding_mask")
        if p.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must be bool (True = padding), got dtype {p.dtype}")
        if p.ndim == 1 and p.shape[0] == S:
            pad = p.view(np.uint8).reshape(1, S)
        elif p.ndim == 2 and p.shape[1] == S and query_ndim >= 3 and len(batch) >= query_ndim - 2:
            n0 = batch[len(batch) - (query_ndim - 2)]
            if p.shape[0] not in (n0, 1):
                raise ValueError(f"key_padding_mask of shape {p.shape} needs (N, S) with "
                                 f"N = query.shape[0] = {n0} and S = {S}")
            pad = p.view(np.uint8).reshape((p.shape[0],) + (1,) * (query_ndim - 2) + (S,))
        else:
            raise ValueError(f"key_padding_mask of shape {p.shape} must be (S,) = ({S},) or "
                             f"(N, S) with N = query.shape[0] (query needs >= 3 dimensions)")
    return MaskPlan(causal, offset, wl, wr, bool_mask, add_mask, pad)


def _broadcastable(shape: tuple, target: tuple) -> bool:
    if len(shape) > len(target):
        return False
    for a, b in zip(reversed(shape), reversed(target)):
        if a != b and a != 1:
            return False
    return True


def check_head_masks(attn_mask, key_padding_mask, n: int, num_heads: int, L: int, S: int, *,
                     unbatched: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The masks of a multi-head call, as arrays, their shapes checked.

    ``attn_mask`` must broadcast to ``(n, num_heads, L, S)`` (``unbatched``:
    shown as ``(num_heads, L, S)``); ``key_padding_mask`` must be bool of shape
    ``(S,)`` or ``(n, S)`` (``unbatched``: ``(S,)`` or ``(1, S)``).  Values are
    left to :func:`resolve`.
    """
    if attn_mask is not None:
        attn_mask = as_array(attn_mask, "attn_mask")
        full = (n, num_heads, L, S)
        try:
            ok = np.broadcast_shapes(attn_mask.shape, full) == full
        except ValueError:
            ok = False
        if not ok:
            what, shown = (("(num_heads, L, S)", full[1:]) if unbatched
                           else ("(N, num_heads, L, S)", full))
            raise ValueError(f"attn_mask of shape {attn_mask.shape} is not broadcastable "
                             f"to {what}={shown}")
    if key_padding_mask is not None:
        key_padding_mask = as_array(key_padding_mask, "key_padding_mask")
        if key_padding_mask.dtype != bool:
            raise TypeError(f"key_padding_mask must be boolean (True = padding), got dtype "
                            f"{key_padding_mask.dtype}")
        allowed = [(S,)] if unbatched else [(S,), (n, S)]
        if key_padding_mask.shape not in allowed and not (unbatched
                                                          and key_padding_mask.shape == (1, S)):
            raise ValueError(f"key_padding_mask has shape {key_padding_mask.shape}; expected "
                             + " or ".join(str(a) for a in allowed)
                             + f" (S={S} keys)")
    return attn_mask, key_padding_mask


def check_cache_causal(is_causal) -> None:
    """A KV cache is always causal, lower-right aligned: reject any other named alignment."""
    if isinstance(is_causal, str) and is_causal != "lower_right":
        raise ValueError(f"is_causal={is_causal!r} cannot be used with kv_cache: the "
                         "cache is always causal, lower-right aligned")
