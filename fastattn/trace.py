"""The attention walkthrough, step by step, with the library's own kernels.

:func:`trace` returns every intermediate of one attention head (X, the
projections, Q, K, V, the raw and scaled scores, the mask, the softmax weights
and the output) for the walkthrough's 3-token, 2-dimension example or for
your own numbers.  :func:`main` is ``python -m fastattn trace``, which prints
those steps in the walkthrough's order so that it can be followed line by
line, including its drills::

    python -m fastattn trace                        # the worked example
    python -m fastattn trace --causal               # with the causal mask
    python -m fastattn trace --x "1,0;1,1;1,1"      # drill: token B = (1, 1)
    python -m fastattn trace --random 3,8 --scale 1 # drill: grow d_k, no scaling
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
          is_causal: bool = False, scale: SupportsFloat | None = None) -> dict[str, Any]:
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

    q = x @ w_q
    k = x @ w_k
    v = x @ w_v
    scores = q @ k.T
    scaled = scores * scale
    n = x.shape[0]
    mask = None
    if is_causal:
        mask = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, 0.0)

    from ._api import attention
    output, weights = attention(q, k, v, is_causal=bool(is_causal), scale=scale,
                                return_weights=True)
    return {
        "X": x, "W_Q": w_q, "W_K": w_k, "W_V": w_v,
        "Q": q, "K": k, "V": v,
        "scores": scores, "scale": np.float64(scale), "scaled": scaled,
        "mask": mask, "weights": np.asarray(weights), "output": np.asarray(output),
    }


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


def _print_text(t, *, causal, scale_given):
    x = t["X"]
    n, d_model = x.shape
    d_k = t["Q"].shape[1]
    names = _token_names(n)
    dims = [f"d{j}" for j in range(max(d_model, d_k, t["V"].shape[1]))]
    step = iter(range(1, 100))

    print(f"Attention, one head: {n} tokens, d_model = {d_model}, d_k = {d_k}, "
          f"d_v = {t['V'].shape[1]}{', causal' if causal else ''}")
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
    if t["mask"] is None:
        print(f"{next(step)}. mask: none (no causal mask; every token sees every token)")
    else:
        _print_matrix(f"{next(step)}. mask M (causal: -inf above the diagonal, added before "
                      f"softmax)", t["mask"], names, names)
    print()
    w = t["weights"]
    _print_matrix(f"{next(step)}. softmax weights = softmax(S_scaled"
                  f"{' + M' if t['mask'] is not None else ''}), row by row",
                  w, names, names, row_sums=True)
    print(f"    largest weight per row: " + ", ".join(
        f"{names[i]} {w[i].max():.2f}" for i in range(n)))
    print()
    _print_matrix(f"{next(step)}. output = weights V  (each row: weighted average of the value "
                  f"rows)", t["output"], names, dims[:t["output"].shape[1]])


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
    number.  JSON has no infinities, so every non-finite number (the
    ``-inf`` entries of the causal mask) is written as the string ``"-inf"``
    (``"inf"``, ``"nan"``); ``float(s)`` reads them back.
    """
    return json.dumps({key: _jsonable(t[key]) for key in KEYS}, allow_nan=False)


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


def _save_plot(t, path, names):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = t["weights"]
    n = w.shape[0]
    size = max(3.0, 0.5 * n + 2.0)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    try:
        im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(n), names if n <= 26 else None)
        ax.set_yticks(range(n), names if n <= 26 else None)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title("attention weights" + (" (causal)" if t["mask"] is not None else ""))
        if n <= 12:
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center",
                            color="white" if w[i, j] < 0.6 else "black")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


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
              is_causal=args.causal, scale=scale)
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
            _save_plot(t, args.plot, _token_names(t["X"].shape[0]))
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
