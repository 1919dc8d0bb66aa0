"""The attention walkthrough, step by step, with the library's own kernels.

:func:`trace` returns every intermediate of one attention head (X, the
projections, Q, K, V, the raw and scaled scores, the mask, the softmax weights
and the output) for the walkthrough's 3-token, 2-dimension example or for
your own numbers; with the variants (soft-capping, ALiBi, a sliding window,
an attention sink) also their steps: the capped scores, the ALiBi bias and
the biased scores, the window in the mask, the sink's share of each row.  :func:`main` is ``python -m fastattn trace``, which prints
those steps in the walkthrough's order so that it can be followed line by
line, including its drills::

    python -m fastattn trace                        # the worked example
    python -m fastattn trace --causal               # with the causal mask
    python -m fastattn trace --x "1,0;1,1;1,1"      # drill: token B = (1, 1)
    python -m fastattn trace --random 3,8 --scale 1 # drill: grow d_k, no scaling
    python -m fastattn trace --window 1,0 --alibi 0.5 --softcap 2 --sink 0
    python -m fastattn trace --json                 # machine-readable
    python -m fastattn trace --plot weights.png     # heatmap (needs matplotlib)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any, SupportsFloat

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["trace", "main"]

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

PROG = "python -m fastattn trace"


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
    variants = _check_variants(window, alibi, softcap, sink)

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

    from ._api import attention
    output, weights = attention(q, k, v, is_causal=bool(is_causal), scale=scale,
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


def _check_variants(window, alibi, softcap, sink) -> dict[str, Any]:
    """The variants given, checked as :mod:`fastattn.reference` checks them."""
    variants: dict[str, Any] = {}
    if softcap is not None:
        from .reference import _check_softcap
        variants["softcap"] = _check_softcap(softcap)
    if alibi is not None:
        variants["alibi"] = _real("alibi", alibi)
    if window is not None:
        from .reference import _check_window
        variants["window"] = _check_window(window)
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


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------

class _UsageError(Exception):
    """A bad command-line value: one line on stderr, exit status 2."""


def _parse_matrix(text, option):
    rows = [r.strip() for r in text.strip().strip(";").split(";")]
    if not text.strip() or any(not r for r in rows):
        raise _UsageError(f"argument {option}: malformed matrix {text!r}: expected rows "
                          f"separated by ';' and numbers by ',', e.g. \"1,0;0,1\"")
    values = []
    for i, row in enumerate(rows, 1):
        try:
            values.append([float(item) for item in row.split(",")])
        except ValueError:
            raise _UsageError(f"argument {option}: malformed matrix {text!r}: row {i} "
                              f"({row!r}) is not a comma-separated list of numbers") from None
        if not all(math.isfinite(val) for val in values[-1]):
            raise _UsageError(f"argument {option}: malformed matrix {text!r}: row {i} holds "
                              f"a non-finite number")
    widths = {len(r) for r in values}
    if len(widths) != 1:
        raise _UsageError(f"argument {option}: malformed matrix {text!r}: rows have "
                          f"different lengths {[len(r) for r in values]}")
    return np.array(values)


def _parse_random(text):
    try:
        n, d = (int(p) for p in text.split(","))
    except ValueError:
        raise _UsageError(f"argument --random: expected N,D (two positive integers), got "
                          f"{text!r}") from None
    if n < 1 or d < 1:
        raise _UsageError(f"argument --random: N and D must be positive, got {text!r}")
    return n, d


def _parse_number(text, option):
    try:
        return float(text)
    except ValueError:
        raise _UsageError(f"argument {option}: not a number: {text!r}") from None


def _parse_window(text):
    parts = text.split(",")
    if len(parts) > 2:
        raise _UsageError(f"argument --window: expected W or LEFT,RIGHT, got {text!r}")
    sides = []
    for part in parts:
        part = part.strip()
        if part.lower() == "none":
            sides.append(None)
            continue
        try:
            sides.append(int(part))
        except ValueError:
            raise _UsageError(f"argument --window: expected W or LEFT,RIGHT (integers >= 0 "
                              f"or 'none'), got {text!r}") from None
    return sides[0] if len(sides) == 1 else tuple(sides)


def _parse_variants(args):
    """trace()'s keyword arguments for --window, --alibi, --softcap and --sink,
    checked as trace() checks them."""
    given = {}
    if args.window is not None:
        given["window"] = ("--window", _parse_window(args.window))
    for option, key in (("--alibi", "alibi"), ("--softcap", "softcap"), ("--sink", "sink")):
        text = getattr(args, key)
        if text is not None:
            given[key] = (option, _parse_number(text, option))
    for key, (option, value) in given.items():
        try:
            _check_variants(**{k: value if k == key else None
                               for k in ("window", "alibi", "softcap", "sink")})
        except (TypeError, ValueError) as exc:
            raise _UsageError(f"argument {option}: {exc}") from None
    return {key: value for key, (_, value) in given.items()}


def _token_names(n):
    if n <= 26:
        return [chr(ord("A") + i) for i in range(n)]
    return [f"t{i}" for i in range(n)]


def _fmt(value):
    if value == -np.inf:
        return "-inf"
    return f"{value:.2f}"


def _print_matrix(title, a, row_names=None, col_names=None, row_sums=False, indent="    "):
    print(f"{title}  shape {a.shape}")
    cells = [[_fmt(v) for v in row] for row in a]
    width = max([len(c) for row in cells for c in row] + [len(c) for c in (col_names or [])]
                + [4])
    name_w = max((len(r) for r in row_names), default=0) if row_names else 0
    if col_names:
        head = (" " * (name_w + 2) if row_names else "") + " ".join(
            c.rjust(width) for c in col_names)
        print(indent + head.rstrip())
    for i, row in enumerate(cells):
        label = (row_names[i].ljust(name_w) + "  ") if row_names else ""
        line = indent + label + " ".join(c.rjust(width) for c in row)
        if row_sums:
            line += f"   | sum = {a[i].sum():.2f}"
        print(line)


def _window_text(window):
    left, right = (None if math.isinf(w) else int(w) for w in window)
    sees = (f"i - {left} <= " if left is not None else "") + "j" + (
        f" <= i + {right}" if right is not None else "")
    return f"{_window_pair(window)}: token i sees the keys j with {sees}"


def _print_text(t, *, causal, scale_given):
    x = t["X"]
    n, d_model = x.shape
    d_k = t["Q"].shape[1]
    names = _token_names(n)
    dims = [f"d{j}" for j in range(max(d_model, d_k, t["V"].shape[1]))]
    step = iter(range(1, 100))

    variants = [what for what, present in (
        ("causal", causal), (f"softcap {_num(t.get('softcap'))}", "softcap" in t),
        (f"ALiBi slope {_num(t.get('alibi_slope'))}", "alibi_slope" in t),
        (f"window {_window_pair(t.get('window'))}", "window" in t),
        (f"sink {_num(t.get('sink'))}", "sink" in t)) if present]
    print(f"Attention, one head: {n} tokens, d_model = {d_model}, d_k = {d_k}, "
          f"d_v = {t['V'].shape[1]}{''.join(', ' + v for v in variants)}")
    print()
    _print_matrix(f"{next(step)}. X (input tokens, one row per token)", x, names,
                  dims[:d_model])
    print()
    print(f"{next(step)}. Projections W_Q, W_K (d_model x d_k), W_V (d_model x d_v)")
    for key in ("W_Q", "W_K", "W_V"):
        _print_matrix(f"  {key}", t[key], dims[:d_model], dims[:t[key].shape[1]],
                      indent="      ")
    print()
    for key, formula in (("Q", "X W_Q"), ("K", "X W_K"), ("V", "X W_V")):
        _print_matrix(f"{next(step)}. {key} = {formula}", t[key], names,
                      dims[:t[key].shape[1]])
        print()
    s = t["scores"]
    _print_matrix(f"{next(step)}. scores S_raw = Q K^T  (row i: query i against every key)",
                  s, names, names)
    print(f"    largest |raw score| = {np.abs(s).max():.2f}")
    print()
    scale = float(t["scale"])
    if scale_given:
        how = "given with --scale" if scale != 1 else "given with --scale: no scaling"
        print(f"{next(step)}. scale = {scale:.4g}  ({how}; 1/sqrt(d_k) would be "
              f"{1 / math.sqrt(d_k):.4f})")
    else:
        print(f"{next(step)}. scale = 1/sqrt(d_k) = 1/sqrt({d_k}) = {scale:.4f}  (~{scale:.2f})")
    print()
    _print_matrix(f"{next(step)}. scaled scores S_scaled = S_raw * scale", t["scaled"],
                  names, names)
    print()
    logits = "S_scaled"
    if "capped" in t:
        c = float(t["softcap"])
        _print_matrix(f"{next(step)}. soft-capped scores S_cap = c * tanh({logits} / c), "
                      f"c = {c:.4g}  (every score pulled into (-c, c))", t["capped"],
                      names, names)
        print(f"    largest |score|: {np.abs(t['scaled']).max():.2f} before, "
              f"{np.abs(t['capped']).max():.2f} after capping")
        print()
        logits = "S_cap"
    if "alibi_bias" in t:
        _print_matrix(f"{next(step)}. ALiBi bias B = -m * |i - j|, slope m = "
                      f"{float(t['alibi_slope']):.4g}  (the farther the key, the lower)",
                      t["alibi_bias"], names, names)
        print()
        _print_matrix(f"{next(step)}. biased scores S_bias = {logits} + B", t["biased"],
                      names, names)
        print()
        logits = "S_bias"
    if t["mask"] is None:
        print(f"{next(step)}. mask: none (no causal mask; every token sees every token)")
    else:
        why = (["causal: -inf above the diagonal"] if causal else []) + (
            [f"window {_window_text(t['window'])}"] if "window" in t else [])
        _print_matrix(f"{next(step)}. mask M ({'; '.join(why)}; -inf = hidden, added before "
                      f"softmax)", t["mask"], names, names)
    print()
    w = t["weights"]
    plus_m = " + M" if t["mask"] is not None else ""
    if "sink_weight" in t:
        sw = t["sink_weight"]
        tl = float(t["sink"])
        print(f"{next(step)}. the sink: logit t = {_num(tl)} joins each row's softmax "
              f"denominator and brings no value:")
        print(f"    w_ij = exp(s_ij - m_i) / (sum_k exp(s_ik - m_i) + exp(t - m_i)),  "
              f"m_i = max(max_k s_ik, t)")
        print("    the sink's share of each row: " + ", ".join(
            f"{names[i]} {sw[i]:.2f}" for i in range(n)))
        print()
        _print_matrix(f"{next(step)}. softmax weights = softmax({logits}{plus_m}) with the "
                      f"sink, row by row (sum + the sink's share = 1)",
                      w, names, names, row_sums=True)
    else:
        _print_matrix(f"{next(step)}. softmax weights = softmax({logits}{plus_m}), row by row",
                      w, names, names, row_sums=True)
    print(f"    largest weight per row: " + ", ".join(
        f"{names[i]} {w[i].max():.2f}" for i in range(n)))
    print()
    what = ("weighted sum of the value rows, the weights summing to less than 1"
            if "sink_weight" in t else "weighted average of the value rows")
    _print_matrix(f"{next(step)}. output = weights V  (each row: {what})", t["output"], names,
                  dims[:t["output"].shape[1]])


def _num(value):
    """A number as the text shows a given option: 4 significant digits, or inf."""
    return "None" if value is None else ("-inf" if value == -np.inf else f"{float(value):.4g}")


def _window_pair(window):
    if window is None:
        return "None"
    left, right = ("None" if math.isinf(w) else str(int(w)) for w in window)
    return f"({left}, {right})"


def _jsonable(value):
    """float64 arrays -> nested lists; non-finite numbers -> "inf"/"-inf"/"nan"."""
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64)

    def conv(v):
        v = float(v)
        if math.isfinite(v):
            return v
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")

    if arr.ndim == 0:
        return conv(arr)
    return np.vectorize(conv, otypes=[object])(arr).tolist()


def to_json(t):
    """The dict of :func:`trace` as a JSON string.

    Arrays become lists of lists, ``None`` becomes ``null``, ``scale`` a
    number, and the variants' steps appear under their keys when present.
    JSON has no infinities, so every non-finite number (the ``-inf`` entries
    of the causal mask, an unbounded side of ``window``) is written as the
    string ``"-inf"`` (``"inf"``, ``"nan"``); ``float(s)`` reads them back.
    """
    return json.dumps({key: _jsonable(value) for key, value in t.items()}, allow_nan=False)


def _build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Trace one attention head step by step, as in the walkthrough "
                    "(default: its 3-token, 2-dimension example with identity projections). "
                    "Matrices are written row by row: rows separated by ';', numbers by ',', "
                    "e.g. \"1,0;0,1;1,1\".")
    p.add_argument("--x", metavar="ROWS", help="input tokens X, one row per token "
                   "(default \"1,0;0,1;1,1\")")
    p.add_argument("--wq", metavar="ROWS", help="W_Q (d_model x d_k; default identity)")
    p.add_argument("--wk", metavar="ROWS", help="W_K (d_model x d_k; default identity)")
    p.add_argument("--wv", metavar="ROWS", help="W_V (d_model x d_v; default identity)")
    p.add_argument("--causal", action="store_true", help="apply the causal mask")
    p.add_argument("--scale", metavar="VALUE", type=str,
                   help="replace 1/sqrt(d_k) (--scale 1 removes the scaling)")
    p.add_argument("--window", metavar="W|LEFT,RIGHT", help="sliding window: token i sees "
                   "i-LEFT..i+RIGHT (W = W,W; 'none' for an unbounded side)")
    p.add_argument("--alibi", metavar="SLOPE", help="ALiBi: add -SLOPE*|i-j| to the scores")
    p.add_argument("--softcap", metavar="CAP", help="soft-cap the scaled scores: "
                   "CAP*tanh(s/CAP), CAP > 0")
    p.add_argument("--sink", metavar="LOGIT", help="attention sink: one more logit in each "
                   "row's softmax denominator, with no value")
    p.add_argument("--random", metavar="N,D", help="N random tokens of D dimensions "
                   "(standard normal; projections identity of size D unless given)")
    p.add_argument("--seed", metavar="S", type=str, default="0",
                   help="seed for --random (default 0)")
    p.add_argument("--json", action="store_true",
                   help="print the intermediates as JSON (non-finite numbers as strings, "
                        "e.g. \"-inf\") and nothing else")
    p.add_argument("--plot", metavar="FILE.png", help="save a heatmap of the weights "
                   "(needs matplotlib: pip install 'fastattn[plot]')")
    return p


def _save_plot(t, path, names, causal=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = t["weights"]
    n = w.shape[0]
    cols = list(names) if n <= 26 else None
    if "sink_weight" in t:            # the sink's share, as one more column
        w = np.concatenate([w, t["sink_weight"][:, None]], axis=1)
        cols = None if cols is None else cols + ["sink"]
    # With soft-capping or ALiBi, the final scores (masked) in a panel of their own.
    final = t.get("biased", t.get("capped"))
    panels = 1 if final is None else 2
    size = max(3.0, 0.5 * n + 2.0)
    fig, axes = plt.subplots(1, panels, figsize=(panels * (size + 1.0), size), squeeze=False)
    try:
        if final is not None:
            shown = final if t["mask"] is None else np.where(t["mask"] == 0, final, np.nan)
            ax = axes[0, 0]
            im = ax.imshow(shown, cmap="magma")
            what = " + ".join(w for w, k in (("softcap", "capped"), ("ALiBi", "biased"))
                              if k in t)
            ax.set_title(f"scores after {what}" + (", masked" if t["mask"] is not None else ""))
            _label_axes(ax, n, names if n <= 26 else None, names if n <= 26 else None)
            fig.colorbar(im, ax=ax)
        ax = axes[0, panels - 1]
        im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
        _label_axes(ax, n, names if n <= 26 else None, cols)
        if causal is None:            # the mask without a window is the causal one
            causal = t["mask"] is not None and "window" not in t
        ax.set_title("attention weights" + _plot_options(t, causal))
        if n <= 12:
            for i in range(w.shape[0]):
                for j in range(w.shape[1]):
                    ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center",
                            color="white" if w[i, j] < 0.6 else "black")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def _label_axes(ax, n, rows, cols):
    ax.set_xticks(range(n if cols is None else len(cols)), cols)
    ax.set_yticks(range(n), rows)
    ax.set_xlabel("key")
    ax.set_ylabel("query")


def _plot_options(t, causal):
    """The plot title's note: "(causal)", "(window (1, 0), sink 0)", ..."""
    parts = ["causal"] if causal else []
    if "window" in t:
        parts.append(f"window {_window_pair(t['window'])}")
    if "sink" in t:
        parts.append(f"sink {_num(t['sink'])}")
    sep = "\n" if len(parts) > 1 else " "        # a long note on a line of its own
    return f"{sep}({', '.join(parts)})" if parts else ""


def main(argv=None):
    """``python -m fastattn trace``: print (or export) the walkthrough's steps.

    Returns the exit status: 0 on success, 2 for a malformed argument (one
    line on stderr), 1 when ``--plot`` is asked for without matplotlib or the
    plot cannot be written.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:            # --help (0) or an argparse error (2)
        return exc.code if isinstance(exc.code, int) else 2

    def fail(message, status=2):
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return status

    try:
        mats = {}
        for opt, key in (("--x", "x"), ("--wq", "wq"), ("--wk", "wk"), ("--wv", "wv")):
            text = getattr(args, key)
            if text is not None:
                mats[key] = _parse_matrix(text, opt)
        scale = None
        if args.scale is not None:
            try:
                scale = float(args.scale)
            except ValueError:
                raise _UsageError(f"argument --scale: not a number: {args.scale!r}") from None
            if not math.isfinite(scale):
                raise _UsageError(f"argument --scale: must be finite, got {args.scale!r}")
        variants = _parse_variants(args)
        try:
            seed = int(args.seed)
        except ValueError:
            raise _UsageError(f"argument --seed: not an integer: {args.seed!r}") from None
        if args.random is not None:
            if "x" in mats:
                raise _UsageError("argument --random: cannot be combined with --x")
            n, d = _parse_random(args.random)
            mats["x"] = np.random.default_rng(seed).standard_normal((n, d))
        x = mats.get("x")
        d_model = (x if x is not None else WALKTHROUGH_X).shape[1]
        for opt, key in (("--wq", "wq"), ("--wk", "wk"), ("--wv", "wv")):
            if key in mats and mats[key].shape[0] != d_model:
                raise _UsageError(f"argument {opt}: has {mats[key].shape[0]} rows but the "
                                  f"tokens have d_model={d_model} dimensions")
        if "wq" in mats and "wk" in mats and mats["wq"].shape[1] != mats["wk"].shape[1]:
            raise _UsageError(f"arguments --wq/--wk: must have the same number of columns "
                              f"(d_k), got {mats['wq'].shape[1]} and {mats['wk'].shape[1]}")
        for opt, key in (("--wq", "wq"), ("--wk", "wk")):
            other = "wk" if key == "wq" else "wq"
            if key in mats and other not in mats and mats[key].shape[1] != d_model:
                raise _UsageError(f"argument {opt}: has {mats[key].shape[1]} columns (d_k) but "
                                  f"the default identity {'--wk' if key == 'wq' else '--wq'} "
                                  f"has {d_model}; give both")
    except _UsageError as exc:
        return fail(str(exc))

    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("--plot needs matplotlib, which is not installed "
                        "(pip install 'fastattn[plot]')", status=1)

    t = trace(mats.get("x"), mats.get("wq"), mats.get("wk"), mats.get("wv"),
              is_causal=args.causal, scale=scale, **variants)
    try:
        if args.json:
            print(to_json(t))
        else:
            _print_text(t, causal=args.causal, scale_given=scale is not None)
        sys.stdout.flush()
    except BrokenPipeError:              # e.g. piped into `head`: stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    if args.plot is not None:
        try:
            _save_plot(t, args.plot, _token_names(t["X"].shape[0]), causal=args.causal)
        except (OSError, ValueError) as exc:
            return fail(f"--plot: cannot write {args.plot!r}: {exc}".replace("\n", " "),
                        status=1)
        if not args.json:
            print()
            print(f"weights heatmap saved to {args.plot}")
    return 0


# ``fastattn/__init__.py`` rebinds ``fastattn.trace`` to the function above, so
# ``fastattn.trace.main(argv)`` must also work on the function.
trace.main = main
trace.to_json = to_json
