"""attention_backward(): the gradients of :func:`fastattn.attention`.

The arguments are checked by the forward's own steps (dtypes and problem
shape from :mod:`fastattn._api`, masks from :mod:`fastattn._masks`, score
options from :mod:`fastattn._scores`), then ``grad_out``, ``out``, ``lse``
and ``grad_lse`` against the forward call.  The C kernel computes one
gradient per batch index of the broadcast batch shape (grouped-query heads
as a stride-0 key/value view, as :mod:`fastattn._gqa` runs them per head),
in float32 for float32 and 16-bit inputs, float64 for float64; where the
forward broadcast (batch dimensions of length 1, the query heads of a
group), the per-index gradients are summed here with NumPy, in a fixed
order, and each is rounded once to its input's dtype. So the extra memory is
those per-index gradients (at most the broadcast factor times an input),
never ``L x S`` but for a float mask's gradient, whose per-index buffer is
bounded by running the batch in chunks (``MASK_GRAD_CHUNK_BYTES``); where
nothing is summed and the kernel can (16-bit inputs on its matrix path,
:func:`fastattn._core.backward_rounds`), it rounds the gradients once itself
and writes them in the inputs' dtype directly. The sinks' gradient comes
back per batch index too, and is summed to the shape of ``sinks`` likewise.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

import numpy as np

from . import _core
from . import _half
from . import _scores
from ._api import arrays_and_dtypes, kernel_operand, problem_shape
from ._gqa import group_heads
from ._grads import (check_lse, drop_features, grad_as, grad_lse_operand,
                     no_empty_features, sinks_grad, sum_to)
from ._masks import MaskPlan, resolve
from ._validate import as_array, check_scale, forward_array, thread_count

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from numpy.typing import ArrayLike, NDArray

    _Float: TypeAlias = NDArray[np.floating[Any]]
    _Causal: TypeAlias = bool | Literal["upper_left", "lower_right"]
    _Window: TypeAlias = SupportsIndex | tuple[SupportsIndex | None, SupportsIndex | None] | None

__all__ = ["attention_backward"]


def attention_backward(grad_out: ArrayLike, query: ArrayLike, key: ArrayLike, value: ArrayLike,
                       out: ArrayLike, lse: ArrayLike, attn_mask: ArrayLike | None = None,
                       is_causal: _Causal = False, scale: SupportsFloat | None = None,
                       enable_gqa: bool = False, *, key_padding_mask: ArrayLike | None = None,
                       window: _Window = None, alibi_slopes: ArrayLike | None = None,
                       softcap: SupportsFloat | None = None, sinks: ArrayLike | None = None,
                       grad_lse: ArrayLike | None = None,
                       num_threads: SupportsIndex | None = None,
                       return_mask_grad: bool = False) -> tuple[_Float, ...]:
    """Gradients of :func:`fastattn.attention` with respect to its inputs.

    Streams over key and query blocks, recomputing the weights from ``lse``
    (no ``L x S`` buffer), with the GIL released.

    Parameters
    ----------
    grad_out : array_like, shape (..., L, Ev)
        The gradient flowing into the output: the output's shape and dtype.
    query, key, value, attn_mask, is_causal, scale, enable_gqa
        As given to :func:`fastattn.attention`.
    out : array_like, shape (..., L, Ev)
        The forward's output (its dtype).
    lse : array_like, shape (..., L)
        The forward's ``return_lse=True`` result (float32 for float16,
        bfloat16 and float32 inputs, float64 for float64): ``-inf`` on a
        row that sees no key, finite elsewhere.
    key_padding_mask, window, alibi_slopes, softcap, sinks
        As given to :func:`fastattn.attention`.  Masks, the window and the
        slopes are constants (no gradient).
    grad_lse : array_like, shape (..., L), optional
        The gradient flowing into ``lse``; None means zero.
    num_threads : int, optional
        OpenMP threads; None = the OpenMP default.  The gradients are
        bitwise the same for every thread count.
    return_mask_grad : bool, default False
        Also return the gradient of a floating-point ``attn_mask`` (a
        learned bias, such as T5's relative position bias): the gradient of
        the logits, ``P * (dP - D + g)`` before the soft cap's factor,
        computed by the same pass into a float buffer of ``batch + (L, S)``
        (the extra memory, one element per batch index, row and key), then
        summed over what the mask broadcast and rounded once to the mask's
        dtype.

    Returns
    -------
    grad_query, grad_key, grad_value : ndarray
        Each of its input's shape and dtype (float64 for integer inputs),
        summed over what the forward broadcast, as autograd would; 16-bit
        ones accumulated in float32 and rounded once.
    grad_sinks : ndarray
        Only when ``sinks`` is given: the shape of ``sinks``.
    grad_attn_mask : ndarray
        Only with ``return_mask_grad``, last: the shape and dtype of
        ``attn_mask``; zero where the mask (or the causal limit, the
        window, the padding) hides the key.

    Raises
    ------
    ValueError
        ``grad_out``, ``out``, ``lse`` or ``grad_lse`` whose shape or dtype is
        not the forward's; an ``lse`` that is NaN or ``+inf``, or ``-inf`` on
        a row that sees a key; ``return_mask_grad`` without a floating-point
        ``attn_mask``; anything :func:`fastattn.attention` rejects.
    TypeError
        As :func:`fastattn.attention`, and a non-float ``grad_lse``.

    Notes
    -----
    A row with no visible key gets zero gradients; a hidden position never
    reaches a gradient, even when its key or value holds NaN or Inf.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    >>> out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse,
    ...                                          is_causal=True)
    >>> dq.shape, dk.shape, dv.shape
    ((2, 5, 4), (2, 5, 4), (2, 5, 4))
    >>> bool(np.allclose(dv.sum(axis=-2), 5.0))   # each row's weights sum to 1
    True

    A learned bias's gradient (a softmax does not change when a row's
    logits all move together, so each row of it sums to 0):

    >>> bias = rng.standard_normal((5, 5))
    >>> out, lse = fastattn.attention(q, k, v, bias, return_lse=True)
    >>> *_, d_bias = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse, bias,
    ...                                          return_mask_grad=True)
    >>> d_bias.shape, bool(np.allclose(d_bias.sum(axis=-1), 0.0))
    ((5, 5), True)
    """
    q, k, v, cdt, odt = arrays_and_dtypes(query, key, value)
    batch, gqa, L, S, E, Ev = problem_shape(q.shape, k.shape, v.shape, enable_gqa)
    adt = _half.arith(cdt)
    sc = check_scale(scale, adt) if scale is not None else 1.0 / math.sqrt(E) if E > 0 else 1.0
    nt = 0 if num_threads is None else thread_count(num_threads)
    plan = resolve(attn_mask, is_causal, key_padding_mask, batch, L, S, cdt, q.ndim, window)
    opts = _scores.resolve(alibi_slopes, softcap, sinks, batch, adt)
    d_o = forward_array("grad_out", grad_out, batch + (L, Ev), odt)
    o = forward_array("out", out, batch + (L, Ev), odt)
    lse_a = forward_array("lse", lse, batch + (L,), adt)
    check_lse(lse_a)
    g_lse = None if grad_lse is None else grad_lse_operand(grad_lse, batch + (L,), adt)
    mask = _grad_mask(attn_mask, plan) if return_mask_grad else None
    grads = _run(no_empty_features((q, k, v, o, d_o), L, S), lse_a, g_lse, cdt, adt, batch,
                 gqa, sc, plan, opts, nt, None if mask is None else mask.shape)
    result = tuple(grad_as(sum_to(drop_features(g, x), x.shape), x)
                   for g, x in zip(grads, (q, k, v)))
    if sinks is not None:
        result += (sinks_grad(grads[3], sinks),)
    if mask is not None:
        result += (grad_as(sum_to(grads[4], mask.shape), mask),)
    return result


def _grad_mask(attn_mask: Any, plan: MaskPlan) -> np.ndarray:
    """The floating-point ``attn_mask`` as an array (its shape and dtype
    are its gradient's); a ValueError if there is none."""
    if plan.add_mask is None:
        what = "none" if attn_mask is None else f"dtype {as_array(attn_mask, 'attn_mask').dtype}"
        raise ValueError(f"return_mask_grad=True needs a floating-point attn_mask (a bool "
                         f"mask has no gradient), got {what}")
    return attn_mask if isinstance(attn_mask, np.ndarray) else as_array(attn_mask, "attn_mask")


# The most bytes of a float attn_mask's per-batch-index gradients held at once
# where the mask is shared along a batch axis (T5's bias, one per head, over a
# batch of sequences): the backward then runs over that axis in chunks, each
# chunk's gradients added into the mask's, so the extra memory is about this
# much, not the batch's size times the mask's.
MASK_GRAD_CHUNK_BYTES = 16 << 20


def _run(arrays, lse, g_lse, cdt, adt, batch, gqa, sc, plan, opts, nt, mask_shape) -> tuple:
    """The kernel's per-batch-index gradients (arrays of adt, or of cdt when
    the kernel rounds them itself: 16-bit, nothing to sum): dq of batch +
    (L, E); dk, dv of batch + (S, .), or of batch[:-1] + (kv heads, S, .)
    when grouped-query (summed over each key head's query heads by the
    kernel, in order); with sinks, the sink's of batch; with mask_shape (a
    float mask's, else None), the logits' of batch + (L, S), already summed
    in order along the batch axis it chunked (of length 1 there; else None)."""
    q, k, v, o, d_o = (kernel_operand(x, cdt) for x in arrays)
    L, E, S, Ev = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    bm, am, pad = plan.bool_mask, plan.add_mask, plan.pad
    cap, al, sk = opts
    kb = batch if gqa is None else batch[:-1] + gqa  # (..., kv heads, group)
    # nothing to compute (no rows, keys or batch index): zero gradients
    no_batch = math.prod(kb) == 0
    empty = np.zeros if L == 0 or S == 0 or no_batch else np.empty
    kvb = batch if gqa is None else batch[:-1] + gqa[:1]  # the gradients' batch
    whole = q.shape[:-2] == batch and k.shape[:-2] == kvb and v.shape[:-2] == kvb
    gdt = cdt if whole and _half.is_half(cdt) and _core.backward_rounds(q) else adt
    dq = empty(batch + (L, E), gdt)
    dk, dv = empty(kvb + (S, E), gdt), empty(kvb + (S, Ev), gdt)
    ds = None if sk is None else np.zeros(batch + (1, 1))
    chunks = None if mask_shape is None else _mask_chunks(batch, gqa, mask_shape, L * S, adt)
    # the positions the pass does not compute are hidden: zero gradients;
    # chunked along ax, dm is their sum along it (length 1 there)
    ax, n = chunks or (0, 0)
    dm = None if mask_shape is None else np.zeros((_set(batch, ax, 1) if chunks else batch)
                                                  + (L, S), adt)
    if no_batch:
        return dq, dk, dv, None if ds is None else ds[..., 0, 0], dm
    rows = [q, o, d_o, lse[..., None], None if g_lse is None else g_lse[..., None], dq, ds]
    if gqa is not None:
        hk, g = gqa
        full = batch + (L, S)
        rows = [None if x is None else group_heads(np.broadcast_to(x, batch + x.shape[-2:]), hk, g)
                for x in rows]
        k, v = k[..., None, :, :], v[..., None, :, :]
        bm = None if bm is None else group_heads(np.broadcast_to(bm, full), hk, g)
        am = None if am is None else group_heads(np.broadcast_to(am, full), hk, g)
        pad = None if pad is None else group_heads(np.broadcast_to(pad, batch + (1, S)), hk, g)
        al, sk = (None if x is None else group_heads(np.broadcast_to(x, batch + (1, 1)), hk, g)
                  for x in (al, sk))
    qb, ob, dob, lse3, glse3, dqb, dsb = rows
    # grouped: dk, dv of length 1 along the group (stride 0): the kernel sums it
    dkb, dvb = (dk, dv) if gqa is None else (dk[..., None, :, :], dv[..., None, :, :])
    ops = (qb, k, v, ob, lse3, dob, dqb, dkb, dvb)
    kw = {"bool_mask": bm, "add_mask": am, "pad": pad, "alibi": al, "sinks": sk,
          "glse": glse3, "dsinks": dsb}
    if not chunks:
        _backward(ops, kw, kb, dm, gqa, sc, plan, cap, nt)
        return dq, dk, dv, None if ds is None else ds[..., 0, 0], dm
    dmc = np.zeros(_set(batch, ax, n) + (L, S), adt)  # one chunk's, zeroed before each
    for a in range(0, kb[ax], n):
        b = min(a + n, kb[ax])
        part = dmc[(slice(None),) * ax + (slice(0, b - a),)]
        if a:
            part.fill(0)
        _backward(tuple(_along(x, ax, len(kb), a, b) for x in ops),
                  {name: _along(x, ax, len(kb), a, b) for name, x in kw.items()},
                  _set(kb, ax, b - a), part, gqa, sc, plan, cap, nt)
        _add_along(dm, part, ax)
    return dq, dk, dv, None if ds is None else ds[..., 0, 0], dm


def _backward(ops: tuple, kw: dict, kb: tuple, dm, gqa, sc, plan: MaskPlan, cap, nt) -> None:
    """One kernel call over ``ops`` (q, k, v, out, lse, dout, dq, dk, dv) and
    ``kw`` (the masks', ALiBi's, sinks', grad_lse's and dsinks' operands) for
    kernel batch kb, the mask's gradient into dm (batch-shaped, or None)."""
    _core.attention_backward(*ops, batch=kb, scale=sc, causal=plan.causal,
                             causal_offset=plan.offset, win_left=plan.win_left,
                             win_right=plan.win_right, num_threads=nt, softcap=cap,
                             dmask=dm if dm is None or gqa is None else group_heads(dm, *gqa),
                             **kw)


def _mask_chunks(batch: tuple, gqa, mask_shape: tuple, ls: int, adt) -> tuple[int, int] | None:
    """(axis, n): the backward runs over batch axis ``axis`` n indices at a
    time and sums the chunks' mask gradients along it, where the mask
    broadcasts along that axis and the whole batch's gradients would exceed
    MASK_GRAD_CHUNK_BYTES; else None (one call, the sum left to ``sum_to``).
    The axis is the outermost the mask broadcasts along, never the query
    heads of a grouped call (whose key heads' gradients the kernel sums)."""
    nb = len(batch)
    m = (1,) * (nb + 2 - len(mask_shape)) + tuple(mask_shape)
    axes = [i for i in range(nb - (gqa is not None)) if m[i] == 1 and batch[i] > 1]
    if not axes:
        return None
    one = math.prod(batch) // batch[axes[0]] * ls * np.dtype(adt).itemsize  # one index's
    n = MASK_GRAD_CHUNK_BYTES // max(one, 1)
    return (axes[0], max(1, n)) if n < batch[axes[0]] else None


def _set(shape: tuple, axis: int, n: int) -> tuple:
    """shape with shape[axis] = n (shape itself when it has no such axis)."""
    return shape[:axis] + (n,) + shape[axis + 1:] if axis < len(shape) else shape


def _along(x, axis: int, nb: int, a: int, b: int):
    """x's indices a:b of batch axis ``axis`` of nb (its dims right-aligned
    against nb + 2, as the kernel reads them): x itself where it has no such
    dimension or broadcasts along it."""
    if x is None:
        return None
    d = axis - (nb + 2 - x.ndim)
    if d < 0 or x.shape[d] == 1:
        return x
    return x[(slice(None),) * d + (slice(a, b),)]


def _add_along(total: np.ndarray, part: np.ndarray, axis: int) -> None:
    """total (length 1 along ``axis``) += each of part's indices along it, in
    order: as NumPy's sum over that axis adds them, from zero."""
    for j in range(part.shape[axis]):
        np.add(total, part[(slice(None),) * axis + (slice(j, j + 1),)], out=total)
