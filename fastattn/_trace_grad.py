"""The walkthrough's backward pass: the gradients of one head's output,
step by step, from a :func:`fastattn.trace.trace` result, and their check
against :func:`fastattn.attention_backward` and
:func:`fastattn.reference.attention_backward`.

The steps are FlashAttention's, written out on the whole (small) matrices:
``dV = P^T dO``, ``dP = dO V^T``, ``D = rowsum(dO * O)``, ``dS = P * (dP -
D)`` (the gradient of the scores the softmax read), through the soft cap
when there is one, then ``dQ = dS K * scale`` and ``dK = dS^T Q * scale``.
A mask, a window and ALiBi only make weights zero or shift scores by
constants, so they change no formula; a sink adds its own gradient,
``-sum_i sink_weight_i * D_i``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import reference
from .backward import attention_backward
from ._api import attention

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["trace_backward", "GRAD_KEYS", "check_backward", "scale_comparison"]

#: The keys :func:`trace_backward` returns, in the order of the steps
#: ("dS_cap" only with a soft cap, "d_sink" only with a sink).
GRAD_KEYS = ("dO", "dV", "dP", "D", "dS_cap", "dS", "dQ", "dK", "d_sink")


def _grad_out(grad_out: ArrayLike | None, shape: tuple[int, ...]) -> np.ndarray:
    if grad_out is None:
        return np.ones(shape)
    d_o = np.array(grad_out, dtype=np.float64)
    if d_o.shape != shape:
        raise ValueError(f"grad_out must have the output's shape {shape}, got {d_o.shape}")
    if not np.all(np.isfinite(d_o)):
        raise ValueError("grad_out must hold finite numbers")
    return d_o


def trace_backward(t: dict[str, Any], grad_out: ArrayLike | None = None) -> dict[str, Any]:
    """The backward of a traced head, step by step.

    Parameters
    ----------
    t : dict
        A result of :func:`fastattn.trace.trace` (its weights, Q, K, V,
        output, scale and variants are read).
    grad_out : array_like, shape (n_tokens, d_v), optional
        The gradient flowing into the output, ``dO``; default all ones.

    Returns
    -------
    dict
        float64 arrays: ``dO``; ``dV = P^T dO``; ``dP = dO V^T``; ``D =
        rowsum(dO * O)`` (shape (n, 1)); with a soft cap ``dS_cap = P * (dP
        - D)`` (the gradient of the capped scores); ``dS``, the gradient of
        the scaled scores (``P * (dP - D)``, times ``1 - (S_cap / c)^2``
        with a soft cap); ``dQ = dS K * scale``; ``dK = dS^T Q * scale``;
        with a sink ``d_sink`` (0-d), ``-sum_i sink_weight_i D_i``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.trace import trace, trace_backward
    >>> g = trace_backward(trace())
    >>> print(np.round(g["dV"], 2))     # dO = ones: each key's total weight
    [[0.85 0.85]
     [0.85 0.85]
     [1.31 1.31]]
    >>> print(np.round(g["dQ"], 3))
    [[0.056 0.114]
     [0.114 0.056]
     [0.088 0.088]]
    """
    p, q, k, v, o = (np.asarray(t[key], dtype=np.float64)
                     for key in ("weights", "Q", "K", "V", "output"))
    scale = float(t["scale"])
    d_o = _grad_out(grad_out, o.shape)
    g: dict[str, Any] = {"dO": d_o, "dV": p.T @ d_o, "dP": d_o @ v.T,
                         "D": (d_o * o).sum(axis=1, keepdims=True)}
    d_s = p * (g["dP"] - g["D"])
    if "capped" in t:
        g["dS_cap"] = d_s
        d_s = d_s * (1.0 - (t["capped"] / float(t["softcap"])) ** 2)
    g["dS"] = d_s
    g["dQ"] = d_s @ k * scale
    g["dK"] = d_s.T @ q * scale
    if "sink_weight" in t:
        g["d_sink"] = np.float64(-(t["sink_weight"] * g["D"][:, 0]).sum())
    return g


def _library_kwargs(t: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the library's attention for the traced head's options,
    as one head of shape (1, n, d): the mask (causal and window) as a
    boolean mask, the soft cap, the ALiBi slope and the sink."""
    kw: dict[str, Any] = {"scale": float(t["scale"])}
    if t.get("mask") is not None:
        kw["attn_mask"] = np.asarray(t["mask"]) == 0
    if "softcap" in t:
        kw["softcap"] = float(t["softcap"])
    if "alibi_slope" in t:
        kw["alibi_slopes"] = np.array([float(t["alibi_slope"])])
    if "sink" in t:
        kw["sinks"] = np.array([float(t["sink"])])
    return kw


def check_backward(t: dict[str, Any], g: dict[str, Any]) -> dict[str, float]:
    """The largest absolute difference of the traced gradients (dQ, dK, dV,
    and the sink's) from :func:`fastattn.attention_backward`'s and from
    :func:`fastattn.reference.attention_backward`'s on the same head ->
    ``{"fastattn": ..., "reference": ...}``."""
    q, k, v = (np.asarray(t[key], dtype=np.float64)[None] for key in ("Q", "K", "V"))
    kw = _library_kwargs(t)
    d_o = g["dO"][None]
    mine = [g["dQ"], g["dK"], g["dV"]] + ([g["d_sink"]] if "d_sink" in g else [])
    out, lse = attention(q, k, v, return_lse=True, **kw)
    got = {"fastattn": attention_backward(d_o, q, k, v, out, lse, **kw),
           "reference": reference.attention_backward(d_o, q, k, v, out, lse, **kw)}
    diff = {}
    for name, grads in got.items():
        parts = [np.asarray(a, dtype=np.float64).reshape(np.shape(b))
                 for a, b in zip(grads, mine)]
        diff[name] = max(float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(parts, mine))
    return diff


def _stats(t: dict[str, Any], g: dict[str, Any]) -> dict[str, float]:
    """One column of :func:`scale_comparison`."""
    w = np.asarray(t["weights"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(w > 0, w * np.log(w), 0.0).sum(axis=1)
    return {"scale": float(t["scale"]),
            "max_abs_scaled": float(np.abs(t["scaled"]).max()),
            "max_weight_mean": float(w.max(axis=1).mean()),
            "entropy_mean": float(ent.mean()),
            **{f"norm_{key}": float(np.linalg.norm(g[key])) for key in ("dS", "dQ", "dK", "dV")}}


def scale_comparison(t_default: dict[str, Any], g_default: dict[str, Any],
                     t_given: dict[str, Any], g_given: dict[str, Any]) -> dict[str, Any]:
    """The softmax's saturation and the gradient norms of the same head with
    the 1/sqrt(d_k) scale (``*_default``) and with a given one -> ``{"default":
    column, "given": column, "uniform_entropy": ln(n)}``; a column holds the
    scale, the largest |scaled score|, the mean over rows of the largest
    weight and of the weights' entropy (nats), and the Frobenius norms of dS,
    dQ, dK and dV."""
    n = np.asarray(t_default["weights"]).shape[0]
    return {"default": _stats(t_default, g_default), "given": _stats(t_given, g_given),
            "uniform_entropy": math.log(n)}
