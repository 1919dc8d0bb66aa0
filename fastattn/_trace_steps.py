"""The walkthrough's steps computed: :func:`trace` (the function that
:mod:`fastattn.trace` exports) and the checks of its variants, which the
command line (:mod:`fastattn._trace_cli`) shares.

Without variants the weights and the output come from
:func:`fastattn.attention`; with them every step is computed here in NumPy,
in the reference's order."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, SupportsFloat

import numpy as np

from . import _api
from ._masks import check_window
from ._scores import check_softcap

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["trace", "check_variants", "WALKTHROUGH_X", "KEYS", "VARIANT_KEYS"]

#: The walkthrough's example: tokens A = (1, 0), B = (0, 1), C = (1, 1).
WALKTHROUGH_X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])

KEYS = ("X", "W_Q", "W_K", "W_V", "Q", "K", "V", "scores", "scale", "scaled", "mask",
        "weights", "output")

#: The keys of the variants' steps, each pair or triple present only when its
#: option is given, in the order of the steps (after "scaled", before "mask",
#: and between "mask" and "weights" for the sink).
VARIANT_KEYS = {
    "softcap": ("softcap", "capped"),
    "alibi": ("alibi_slope", "alibi_bias", "biased"),
    "window": ("window",),
    "sink": ("sink", "sink_weight"),
}

def _matrix(a, name):
    arr = np.array(a, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must hold finite numbers")
    return arr


def trace(x: ArrayLike | None = None, w_q: ArrayLike | None = None,
          w_k: ArrayLike | None = None, w_v: ArrayLike | None = None, *,
          is_causal: bool = False, scale: SupportsFloat | None = None,
          window: int | tuple[int | None, int | None] | None = None,
          alibi: SupportsFloat | None = None, softcap: SupportsFloat | None = None,
          sink: SupportsFloat | None = None) -> dict[str, Any]:
    """Every intermediate of one attention head, as in the walkthrough.

    Parameters
    ----------
    x : array_like, shape (n_tokens, d_model), optional
        Token embeddings, one row per token.  Default: the walkthrough's
        ``[[1, 0], [0, 1], [1, 1]]`` (tokens A, B, C).
    w_q, w_k : array_like, shape (d_model, d_k), optional
        Query and key projections (default: identity of size d_model).
    w_v : array_like, shape (d_model, d_v), optional
        Value projection (default: identity of size d_model).
    is_causal : bool, optional
        Add the causal mask (token ``i`` sees tokens ``j <= i``).
    scale : float, optional
        Factor applied to the raw scores (default ``1/sqrt(d_k)``);
        ``scale=1`` removes the scaling.
    window : int or (left, right), optional
        Sliding window: token ``i`` sees tokens ``i - left <= j <= i + right``
        (an int ``w`` means ``(w, w)``, None on a side means unbounded);
        combines with ``is_causal``.
    alibi : float, optional
        ALiBi slope ``m``: the bias ``-m * |i - j|`` is added to the scores.
    softcap : float, optional
        Soft-capping ``c > 0``: the scaled scores become ``c * tanh(s / c)``.
    sink : float, optional
        Attention-sink logit ``t``: it joins every row's softmax denominator
        and contributes no value, so a row's weights sum to less than 1.

    Returns
    -------
    dict
        float64 NumPy arrays under the keys ``X, W_Q, W_K, W_V, Q, K, V``,
        ``scores`` (``Q @ K.T``), ``scale`` (0-d), ``scaled``
        (``scale * scores``), ``mask`` (the additive mask, ``0`` where
        attending is allowed and ``-inf`` where not, or ``None`` without
        ``is_causal``), ``weights`` (row-wise softmax of ``scaled + mask``)
        and ``output`` (``weights @ V``).  ``weights`` and ``output`` come
        from :func:`fastattn.attention` with ``return_weights=True``.

        The variants add their steps, in order, only when given:
        ``softcap`` (0-d) and ``capped`` (``softcap * tanh(scaled /
        softcap)``); ``alibi_slope`` (0-d), ``alibi_bias`` (``-slope * |i -
        j|``) and ``biased`` (the scores so far plus the bias); ``window``
        (``[left, right]``, ``inf`` for an unbounded side), whose hidden
        positions are ``-inf`` in ``mask``; ``sink`` (0-d) and
        ``sink_weight`` (per row, the sink's share of the denominator).
        With any of them, ``weights`` (over the final scores plus ``mask``,
        with the sink's term in the denominator) and ``output`` are computed
        here in NumPy, step by step, as :mod:`fastattn.reference` defines
        them.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.trace import trace
    >>> t = trace()
    >>> print(np.round(t["weights"], 2))
    [[0.4  0.2  0.4 ]
     [0.2  0.4  0.4 ]
     [0.25 0.25 0.5 ]]
    >>> print(np.round(t["output"], 2))
    [[0.8  0.6 ]
     [0.6  0.8 ]
     [0.75 0.75]]
    >>> print(np.round(trace(is_causal=True)["weights"], 2))
    [[1.   0.   0.  ]
     [0.33 0.67 0.  ]
     [0.25 0.25 0.5 ]]
    >>> t = trace(window=(1, 0), alibi=0.5, sink=0.0)
    >>> print(np.round(t["alibi_bias"], 2))
    [[ 0.  -0.5 -1. ]
     [-0.5  0.  -0.5]
     [-1.  -0.5  0. ]]
    >>> print(np.round(t["weights"], 2), np.round(t["sink_weight"], 2))
    [[0.67 0.   0.  ]
     [0.17 0.56 0.  ]
     [0.   0.19 0.65]] [0.33 0.28 0.16]
    """
    x = WALKTHROUGH_X.copy() if x is None else _matrix(x, "x")
    d_model = x.shape[1]
    eye = np.eye(d_model)
    w_q = eye.copy() if w_q is None else _matrix(w_q, "w_q")
    w_k = eye.copy() if w_k is None else _matrix(w_k, "w_k")
    w_v = eye.copy() if w_v is None else _matrix(w_v, "w_v")
    for w, name in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v")):
        if w.shape[0] != d_model:
            raise ValueError(f"{name} has shape {w.shape}: its first dimension must be "
                             f"d_model={d_model} (x has shape {x.shape})")
    if w_q.shape[1] != w_k.shape[1]:
        raise ValueError(f"w_q {w_q.shape} and w_k {w_k.shape} must have the same number of "
                         f"columns (d_k)")
    d_k = w_q.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    else:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number, got {scale}")
    variants = check_variants(window, alibi, softcap, sink)

    q = x @ w_q
    k = x @ w_k
    v = x @ w_v
    scores = q @ k.T
    scaled = scores * scale
    n = x.shape[0]
    mask = None
    if is_causal:
        mask = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, 0.0)

    if variants:
        return _trace_variants(x, w_q, w_k, w_v, q, k, v, scores, scale, scaled,
                               bool(is_causal), **variants)

    output, weights = _api.attention(q, k, v, is_causal=bool(is_causal), scale=scale,
                                return_weights=True)
    return {
        "X": x, "W_Q": w_q, "W_K": w_k, "W_V": w_v,
        "Q": q, "K": k, "V": v,
        "scores": scores, "scale": np.float64(scale), "scaled": scaled,
        "mask": mask, "weights": np.asarray(weights), "output": np.asarray(output),
    }


def _real(name, value, *, neg_inf_ok=False):
    """A finite float (or ``-inf`` when ``neg_inf_ok``); bool and non-reals are TypeErrors."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    f = float(value)
    if not (math.isfinite(f) or (neg_inf_ok and f == -np.inf)):
        allowed = "finite or -inf" if neg_inf_ok else "finite"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return f


def check_variants(window, alibi, softcap, sink) -> dict[str, Any]:
    """The variants given, checked as :mod:`fastattn.reference` checks them."""
    variants: dict[str, Any] = {}
    if softcap is not None:
        variants["softcap"] = check_softcap(softcap)
    if alibi is not None:
        variants["alibi"] = _real("alibi", alibi)
    if window is not None:
        variants["window"] = check_window(window)
    if sink is not None:
        variants["sink"] = _real("sink", sink, neg_inf_ok=True)
    return variants


def _trace_variants(x, w_q, w_k, w_v, q, k, v, scores, scale, scaled, is_causal, *,
                    softcap=None, alibi=None, window=None, sink=None) -> dict[str, Any]:
    """trace() with the variants: every step in NumPy, in the reference's order
    (scale, soft-cap, ALiBi, the masks, the softmax with the sink)."""
    n = x.shape[0]
    t: dict[str, Any] = {"X": x, "W_Q": w_q, "W_K": w_k, "W_V": w_v, "Q": q, "K": k, "V": v,
                         "scores": scores, "scale": np.float64(scale), "scaled": scaled}
    logits = scaled
    if softcap is not None:
        logits = softcap * np.tanh(logits / softcap)
        t["softcap"], t["capped"] = np.float64(softcap), logits
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if alibi is not None:
        bias = -alibi * np.abs(i - j).astype(np.float64) + 0.0     # + 0.0: no "-0.00"
        logits = logits + bias
        t["alibi_slope"], t["alibi_bias"], t["biased"] = np.float64(alibi), bias, logits
    hidden = np.zeros((n, n), dtype=bool)
    if is_causal:
        hidden |= j > i
    if window is not None:
        left, right = window
        if left is not None:
            hidden |= j < i - left
        if right is not None:
            hidden |= j > i + right
        t["window"] = np.array([np.inf if s is None else s for s in window], dtype=np.float64)
    t["mask"] = np.where(hidden, -np.inf, 0.0) if hidden.any() or window is not None else None
    hidden |= logits == -np.inf
    masked = np.where(hidden, -np.inf, logits)
    dead = hidden.all(axis=1, keepdims=True)
    top = np.where(dead, 0.0, masked.max(axis=1, keepdims=True))
    if sink is not None:
        top = np.maximum(top, sink)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(hidden, 0.0, np.exp(masked - top))
        sink_term = np.exp(sink - top) if sink is not None else 0.0
        denominator = e.sum(axis=1, keepdims=True) + sink_term
        weights = np.where(dead, 0.0, e / np.where(dead, 1.0, denominator))
    if sink is not None:
        t["sink"] = np.float64(sink)
        t["sink_weight"] = np.where(dead, 0.0, sink_term / np.where(dead, 1.0, denominator))[:, 0]
    t["weights"] = weights
    t["output"] = weights @ v
    return t
