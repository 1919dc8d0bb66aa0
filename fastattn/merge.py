"""Merging attention computed over disjoint parts of the keys.

Attention over a key set split into disjoint parts can be computed part by
part -- a KV cache in chunks, keys spread over devices or threads, a prefix
shared by many queries -- and combined exactly afterwards, provided every
part also returns the log-sum-exp (LSE) of each row's logits, as
``fastattn.reference.attention(..., return_lse=True)`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._half import is_bfloat16

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import ArrayLike, NDArray

__all__ = ["merge_attention"]


_FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _parts(name, parts):
    """``parts`` as a list of at least one floating ndarray (bfloat16
    included) of one shape and dtype."""
    if isinstance(parts, np.ndarray) and parts.ndim == 0:
        raise ValueError(f"{name} must be a sequence of arrays, got a 0-d array")
    try:
        items = list(parts)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of arrays, "
                        f"got {type(parts).__name__}") from None
    arrays = []
    for i, p in enumerate(items):
        try:
            arrays.append(np.asarray(p))
        except (TypeError, ValueError) as e:  # a ragged nested list, a foreign array
            raise type(e)(f"{name}[{i}] cannot be made an array: {e}") from None
    if not arrays:
        raise ValueError(f"{name} is empty: merge_attention needs at least one part")
    first = arrays[0]
    if first.dtype not in _FLOATS and not is_bfloat16(first.dtype):
        raise TypeError(f"{name} must hold float16, bfloat16, float32 or float64 arrays, "
                        f"got dtype {first.dtype}")
    for i, a in enumerate(arrays):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(f"{name}[{i}] has shape {a.shape} and dtype {a.dtype}, "
                             f"but {name}[0] has shape {first.shape} and dtype {first.dtype}")
    return arrays


def merge_attention(outputs: Sequence[ArrayLike], lses: Sequence[ArrayLike]
                    ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
    """Combine attention results over disjoint key sets into the whole.

    If ``out_p, lse_p`` is the attention of the same queries over a key set
    ``K_p`` (with its log-sum-exp), and the ``K_p`` are disjoint, the result
    is the attention over their union::

        lse = log(sum_p exp(lse_p))
        out = sum_p exp(lse_p - lse) * out_p

    computed stably: with ``m = max_p lse_p`` and ``e_p = exp(lse_p - m)``,
    ``lse = m + log(sum_p e_p)`` and ``exp(lse_p - lse)`` is taken as
    ``e_p / sum_q e_q`` (the same number, without the cancellation of
    ``lse_p - lse`` when the LSEs are large).  A part whose row has ``lse_p = -inf`` (no visible key there)
    contributes nothing to that row, whatever its output holds; a row with
    ``-inf`` in every part gets a zero output and ``lse = -inf``.  A NaN (or
    ``+inf``) ``lse_p`` makes the row's output and ``lse`` NaN.

    Parameters
    ----------
    outputs : sequence of array_like, each of shape (..., H, L, Dv)
        The parts' outputs, of one shape and one floating dtype (float16,
        bfloat16 -- ``ml_dtypes.bfloat16`` --, float32 or float64).
    lses : sequence of array_like, each of shape (..., H, L)
        The parts' natural-log LSEs, in the same order, of one shape
        (``outputs[0].shape[:-1]``) and one floating dtype.

    Returns
    -------
    out : ndarray, shape (..., H, L, Dv)
        In the outputs' dtype (a 16-bit one rounded once, to nearest even,
        from the float32 merge).
    lse : ndarray, shape (..., H, L)
        float64 when the outputs are float64, float32 otherwise.

    Raises
    ------
    ValueError
        If there is no part, ``outputs`` and ``lses`` differ in length, the
        parts differ in shape or dtype, or ``lses`` do not have the shape
        ``outputs[0].shape[:-1]``.
    TypeError
        If the arrays are not floating point.

    Notes
    -----
    The sums run over the parts in the order given, in float32 for float16,
    bfloat16 and float32 outputs and in float64 for float64, so the result is
    deterministic; another order of the parts may differ in the last bits.
    Splitting the keys changes the rounding too: the merge matches the
    single call to within the accumulation dtype's rounding, not bitwise.

    ``attention_varlen`` and ``attention_paged`` return token-major outputs,
    ``(total, H, Dv)``, with head-major lses, ``(H, total)``: move their
    heads first (``out.transpose(1, 0, 2)``) before merging, and back after.
    Where ``total == H`` the unmoved parts pass the shape check and merge
    wrongly.

    Examples
    --------
    Attention over six keys, computed as two halves and merged:

    >>> import numpy as np
    >>> from fastattn.merge import merge_attention
    >>> from fastattn.reference import attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 3, 4))       # (H, L, E)
    >>> k = rng.standard_normal((2, 6, 4))       # (H, S, E)
    >>> v = rng.standard_normal((2, 6, 5))       # (H, S, Ev)
    >>> whole, whole_lse = attention(q, k, v, return_lse=True)
    >>> a, a_lse = attention(q, k[:, :2], v[:, :2], return_lse=True)
    >>> b, b_lse = attention(q, k[:, 2:], v[:, 2:], return_lse=True)
    >>> out, lse = merge_attention([a, b], [a_lse, b_lse])
    >>> out.shape, lse.shape
    ((2, 3, 5), (2, 3))
    >>> bool(np.allclose(out, whole) and np.allclose(lse, whole_lse))
    True
    """
    outs = _parts("outputs", outputs)
    ls = _parts("lses", lses)
    if len(outs) != len(ls):
        raise ValueError(f"outputs and lses must have as many parts, "
                         f"got {len(outs)} and {len(ls)}")
    if outs[0].ndim == 0:
        raise ValueError("outputs must be arrays of shape (..., H, L, Dv), got 0-d arrays")
    if ls[0].shape != outs[0].shape[:-1]:
        raise ValueError(f"lses must have the shape outputs[0].shape[:-1] = "
                         f"{outs[0].shape[:-1]}, got {ls[0].shape}")
    odt = outs[0].dtype
    acc = np.dtype(np.float64) if odt == np.float64 else np.dtype(np.float32)
    ls = [a.astype(acc) for a in ls]
    with np.errstate(all="ignore"):
        m = ls[0]
        for a in ls[1:]:
            m = np.maximum(m, a)            # NaN propagates
        dead = m == -np.inf
        m0 = np.where(dead, 0, m)           # keep -inf - -inf away from dead rows
        scaled = [np.exp(a - m0) for a in ls]
        total = np.zeros_like(m)
        for e in scaled:
            total += e
        lse = np.where(dead, -np.inf, m0 + np.log(total))
        out = np.zeros(outs[0].shape, dtype=acc)
        term = np.empty_like(out)           # one part's term at a time: two outputs' memory
        for o, a, e in zip(outs, ls, scaled):
            # exp(lse_p - lse), without the cancellation of lse_p - lse
            np.multiply((e / total)[..., None], o if o.dtype == acc else o.astype(acc),
                        out=term)
            # A part with nothing visible in a row never touches that row.
            term[a == -np.inf] = 0
            out += term
    return out.astype(odt, copy=False), lse
