"""``python -m fastattn trace``: the command line of the walkthrough trace.

Parses the options (matrices as ``"1,0;0,1"``, the variants' values), runs
:func:`fastattn.trace.trace` and prints or exports its steps through
:mod:`fastattn._trace_show`.  A malformed value exits with status 2 and one
line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from ._trace_grad import check_backward, scale_comparison, trace_backward
from ._trace_show import (print_grad_text, print_scale_comparison, print_text, save_plot,
                          to_json, token_names)
from ._trace_steps import WALKTHROUGH_X, check_variants, trace

__all__ = ["main"]

PROG = "python -m fastattn trace"


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


_WINDOW_MAX = 2**62  # a side this long reaches past any trace's tokens


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
            side = int(part)
        except ValueError:
            raise _UsageError(f"argument --window: expected W or LEFT,RIGHT (integers >= 0 "
                              f"or 'none'), got {text!r}") from None
        sides.append(min(side, _WINDOW_MAX))  # past every token either way
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
            check_variants(**{k: value if k == key else None
                               for k in ("window", "alibi", "softcap", "sink")})
        except (TypeError, ValueError) as exc:
            raise _UsageError(f"argument {option}: {exc}") from None
    return {key: value for key, (_, value) in given.items()}


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
    p.add_argument("--grad", action="store_true",
                   help="also the backward: dO, dV, dP, D, dS, dQ, dK step by step, checked "
                        "against fastattn.attention_backward; with --scale, the softmax's "
                        "saturation and the gradient norms with and without 1/sqrt(d_k)")
    p.add_argument("--grad-out", metavar="ROWS", help="dO, the gradient flowing into the "
                   "output (n_tokens x d_v; default ones); implies --grad")
    p.add_argument("--json", action="store_true",
                   help="print the intermediates as JSON (non-finite numbers as strings, "
                        "e.g. \"-inf\") and nothing else")
    p.add_argument("--plot", metavar="FILE.png", help="save a heatmap of the weights "
                   "(needs matplotlib: pip install 'fastattn[plot]')")
    return p


def _read_options(args):
    """The parsed options as arrays and numbers: ``(matrices, scale, variants)``;
    a malformed or inconsistent value raises ``_UsageError``."""
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
    if seed < 0:
        raise _UsageError(f"argument --seed: must be >= 0, got {seed}")
    if args.random is not None:
        if "x" in mats:
            raise _UsageError("argument --random: cannot be combined with --x")
        n, d = _parse_random(args.random)
        mats["x"] = np.random.default_rng(seed).standard_normal((n, d))
    _check_projections(mats)
    if args.grad_out is not None:
        mats["grad_out"] = _parse_matrix(args.grad_out, "--grad-out")
    return mats, scale, variants


def _backward(t, mats, args, scale, variants):
    """--grad: the backward steps, their check, and with --scale the
    comparison with the 1/sqrt(d_k) scale -> (g, diff, comparison or None)."""
    d_o = mats.get("grad_out")
    if d_o is not None and d_o.shape != t["output"].shape:
        raise _UsageError(f"argument --grad-out: must have the output's shape "
                          f"{t['output'].shape} (n_tokens x d_v), got {d_o.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # told below, naming the option
        g = trace_backward(t, d_o)
    if not all(np.isfinite(x).all() for x in g.values() if isinstance(x, np.ndarray)):
        raise _UsageError("argument --grad-out: the gradients overflow float64; give smaller "
                          "values")
    comp = None
    if scale is not None:
        t0 = trace(mats.get("x"), mats.get("wq"), mats.get("wk"), mats.get("wv"),
                   is_causal=args.causal, **variants)
        comp = scale_comparison(t0, trace_backward(t0, d_o), t, g)
    return g, check_backward(t, g), comp


def _check_scores(t):
    """The error for finite inputs whose scores overflow float64 (the softmax
    of such a row would be NaN): which option to make smaller."""
    if not np.isfinite(t["scores"]).all():
        raise _UsageError("arguments --x/--wq/--wk: the scores Q.K^T overflow float64; "
                          "give smaller values")
    if not np.isfinite(t["scaled"]).all():
        raise _UsageError(f"argument --scale: the scaled scores overflow float64 (scale "
                          f"{float(t['scale']):g}); give a smaller scale")
    if "biased" in t and not np.isfinite(t["biased"]).all():  # (a soft cap bounds the rest)
        raise _UsageError("argument --alibi: the scores plus the ALiBi bias overflow float64; "
                          "give a smaller slope")


def _check_projections(mats):
    """The projections' shapes against the tokens' and each other's."""
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


def _print_json(t, grad):
    """The trace as JSON; with --grad its gradients' keys too, the check and
    the scale comparison."""
    if grad is None:
        print(to_json(t))
        return
    g, diff, comp = grad
    doc = json.loads(to_json({**t, **g}))
    doc["grad_check"] = diff
    if comp is not None:
        doc["scale_comparison"] = comp
    print(json.dumps(doc, allow_nan=False))


def _print_steps(t, args, scale, grad=None) -> bool:
    """The steps (and the backward's, ``grad``) as text or JSON on stdout;
    False if stdout was closed early."""
    try:
        if args.json:
            _print_json(t, grad)
        else:
            nxt = print_text(t, causal=args.causal, scale_given=scale is not None)
            if grad is not None:
                g, diff, comp = grad
                nxt = print_grad_text(t, g, diff, first_step=nxt,
                                      grad_given=args.grad_out is not None)
                if comp is not None:
                    print_scale_comparison(comp, first_step=nxt, d_k=t["Q"].shape[1])
        sys.stdout.flush()
    except BrokenPipeError:              # e.g. piped into `head`: stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return False
    return True


def _fail(message, status=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv=None):
    """``python -m fastattn trace``: print (or export) the walkthrough's steps.

    Returns the exit status: 0 on success, 2 for a malformed argument (one
    line on stderr), 1 when ``--plot`` is asked for without matplotlib or the
    plot cannot be written.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exc:            # --help (0) or an argparse error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        mats, scale, variants = _read_options(args)
    except _UsageError as exc:
        return _fail(str(exc))
    except MemoryError as exc:  # --random N,D's tokens
        return _fail(f"argument --random: the tokens do not fit in memory: {exc}")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib, which is not installed "
                         "(pip install 'fastattn[plot]')", status=1)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # _check_scores names the option
            t = trace(mats.get("x"), mats.get("wq"), mats.get("wk"), mats.get("wv"),
                      is_causal=args.causal, scale=scale, **variants)
        _check_scores(t)
        grad = None
        if args.grad or args.grad_out is not None:
            grad = _backward(t, mats, args, scale, variants)
    except _UsageError as exc:
        return _fail(str(exc))
    except MemoryError as exc:  # --random N,D: N x N scores, D x D projections
        return _fail(f"the trace's matrices do not fit in memory: {exc}")
    if not _print_steps(t, args, scale, grad):
        return 1
    if args.plot is not None:
        try:
            save_plot(t, args.plot, token_names(t["X"].shape[0]), causal=args.causal)
        except (OSError, ValueError) as exc:
            return _fail(f"--plot: cannot write {args.plot!r}: {exc}".replace("\n", " "),
                         status=1)
        if not args.json:
            print()
            print(f"weights heatmap saved to {args.plot}")
    return 0
