"""How a trace is shown: the walkthrough's text, its JSON and the heatmap.

The renderings of :func:`fastattn.trace.trace`'s result for ``python -m
fastattn trace`` (:mod:`fastattn._trace_cli`): the steps printed in the
walkthrough's order, the JSON with non-finite numbers as strings, and the
weights heatmap (needs matplotlib).
"""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["print_text", "print_grad_text", "print_scale_comparison", "save_plot", "to_json",
           "token_names"]


def token_names(n):
    """Token labels: A, B, C, ... up to 26 tokens, else t0, t1, ..."""
    if n <= 26:
        return [chr(ord("A") + i) for i in range(n)]
    return [f"t{i}" for i in range(n)]


def _fmt(value):
    if value == -np.inf:
        return "-inf"
    return f"{round(float(value), 2) + 0.0:.2f}"      # + 0.0: no "-0.00"


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
            line += f"   | sum = {_fmt(a[i].sum())}"
        print(line)


def _window_text(window):
    left, right = (None if math.isinf(w) else int(w) for w in window)
    sees = (f"i - {left} <= " if left is not None else "") + "j" + (
        f" <= i + {right}" if right is not None else "")
    return f"{_window_pair(window)}: token i sees the keys j with {sees}"


def print_text(t, *, causal, scale_given) -> int:
    """The trace ``t`` printed as the walkthrough's numbered steps; -> the
    number the next step would take."""
    n = t["X"].shape[0]
    names = token_names(n)
    dims = [f"d{j}" for j in range(max(t["X"].shape[1], t["Q"].shape[1], t["V"].shape[1]))]
    step = iter(range(1, 100))
    _print_inputs(t, step, names, dims, causal)
    _print_scale(t, step, names, scale_given)
    logits = _print_variants(t, step, names)
    _print_mask(t, step, names, causal)
    _print_weights(t, step, names, logits)
    _print_matrix(f"{next(step)}. output = weights V  (each row: {_output_text(t)})",
                  t["output"], names, dims[:t["output"].shape[1]])
    return next(step)


def _print_inputs(t, step, names, dims, causal):
    """The header, X, the projections, Q, K, V and the raw scores."""
    x = t["X"]
    n, d_model = x.shape
    variants = [what for what, present in (
        ("causal", causal), (f"softcap {_num(t.get('softcap'))}", "softcap" in t),
        (f"ALiBi slope {_num(t.get('alibi_slope'))}", "alibi_slope" in t),
        (f"window {_window_pair(t.get('window'))}", "window" in t),
        (f"sink {_num(t.get('sink'))}", "sink" in t)) if present]
    print(f"Attention, one head: {n} tokens, d_model = {d_model}, d_k = {t['Q'].shape[1]}, "
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


def _print_scale(t, step, names, scale_given):
    """The scale (given or 1/sqrt(d_k)) and the scaled scores."""
    d_k = t["Q"].shape[1]
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


def _print_variants(t, step, names) -> str:
    """The soft-cap and ALiBi steps, if any; the name of the scores they end with."""
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
    return logits


def _print_mask(t, step, names, causal):
    """The additive mask (causal, window), or that there is none."""
    if t["mask"] is None:
        print(f"{next(step)}. mask: none (no causal mask; every token sees every token)")
    else:
        why = (["causal: -inf above the diagonal"] if causal else []) + (
            [f"window {_window_text(t['window'])}"] if "window" in t else [])
        _print_matrix(f"{next(step)}. mask M ({'; '.join(why)}; -inf = hidden, added before "
                      f"softmax)", t["mask"], names, names)
    print()


def _print_weights(t, step, names, logits):
    """The sink's share (if any) and the softmax weights of each row."""
    n = t["X"].shape[0]
    w = t["weights"]
    plus_m = " + M" if t["mask"] is not None else ""
    if "sink_weight" in t:
        sw = t["sink_weight"]
        tl = float(t["sink"])
        print(f"{next(step)}. the sink: logit t = {_num(tl)} joins each row's softmax "
              f"denominator and brings no value:")
        print("    w_ij = exp(s_ij - m_i) / (sum_k exp(s_ik - m_i) + exp(t - m_i)),  "
              "m_i = max(max_k s_ik, t)")
        print("    the sink's share of each row: " + ", ".join(
            f"{names[i]} {sw[i]:.2f}" for i in range(n)))
        print()
        _print_matrix(f"{next(step)}. softmax weights = softmax({logits}{plus_m}) with the "
                      f"sink, row by row (sum + the sink's share = 1)",
                      w, names, names, row_sums=True)
    else:
        _print_matrix(f"{next(step)}. softmax weights = softmax({logits}{plus_m}), row by row",
                      w, names, names, row_sums=True)
    print("    largest weight per row: " + ", ".join(
        f"{names[i]} {w[i].max():.2f}" for i in range(n)))
    print()


def print_grad_text(t, g, diff, *, first_step, grad_given):
    """The backward steps of :func:`fastattn.trace.trace_backward`'s ``g``,
    numbered from ``first_step``, and their agreement with the library
    (``diff``: :func:`check_backward`'s)."""
    n = t["X"].shape[0]
    names = token_names(n)
    dims = [f"d{j}" for j in range(max(t["Q"].shape[1], t["V"].shape[1]))]
    step = iter(range(first_step, first_step + 100))
    dv, dk = dims[:t["V"].shape[1]], dims[:t["Q"].shape[1]]
    print()
    print("Backward: the gradients of the output, step by step (P = the weights, "
          "O = the output)")
    print()
    how = "given with --grad-out" if grad_given else "ones: the gradient of sum(output)"
    for key, title, cols in (
            ("dO", f"dO, the gradient flowing into the output ({how})", dv),
            ("dV", "dV = P^T dO  (row j: the value row j's gradient)", dv),
            ("dP", "dP = dO V^T  (the gradient of the weights)", names),
            ("D", "D = rowsum(dO * O)  (per row: what the softmax subtracts)", ["D"])):
        _print_matrix(f"{next(step)}. {title}", g[key], names, cols)
        print()
    if "dS_cap" in g:
        _print_matrix(f"{next(step)}. dS_cap = P * (dP - D)  (the gradient of the capped "
                      f"scores)", g["dS_cap"], names, names)
        print()
        title = "dS = dS_cap * (1 - (S_cap / c)^2)  (through the soft cap's tanh)"
    else:
        title = "dS = P * (dP - D)  (the gradient of the scaled scores; 0 where P is 0" + (
            ")" if "sink_weight" in t else "; a row sums to 0, as its weights sum to 1)")
    _print_matrix(f"{next(step)}. {title}", g["dS"], names, names, row_sums=True)
    print()
    scale = float(t["scale"])
    _print_matrix(f"{next(step)}. dQ = dS K * scale  (scale = {scale:.4g})", g["dQ"], names, dk)
    print()
    _print_matrix(f"{next(step)}. dK = dS^T Q * scale", g["dK"], names, dk)
    print()
    if "d_sink" in g:
        print(f"{next(step)}. d_sink = -sum_i sink_weight_i * D_i = {float(g['d_sink']):.4f}")
        print()
    print(f"check: fastattn.attention_backward gives the same dQ, dK, dV"
          f"{', d_sink' if 'd_sink' in g else ''} to {diff['fastattn']:.1e} (largest "
          f"|difference|), fastattn.reference.attention_backward to {diff['reference']:.1e}")
    return next(step)


_COMPARISON_ROWS = (
    ("largest |scaled score|", "max_abs_scaled", "{:.2f}"),
    ("mean over rows of the largest weight", "max_weight_mean", "{:.3f}"),
    ("mean row entropy (nats)", "entropy_mean", "{:.3f}"),
    ("|dS| (Frobenius norm)", "norm_dS", "{:.3g}"),
    ("|dQ|", "norm_dQ", "{:.3g}"),
    ("|dK|", "norm_dK", "{:.3g}"),
    ("|dV|", "norm_dV", "{:.3g}"),
)


def print_scale_comparison(comp, *, first_step, d_k):
    """:func:`scale_comparison`'s columns side by side: the softmax's
    saturation and the gradient norms with 1/sqrt(d_k) and the given scale."""
    a, b = comp["default"], comp["given"]
    print()
    print(f"{first_step}. the same head with and without the 1/sqrt(d_k) scale "
          f"(the same dO)")
    heads = [f"scale {a['scale']:.4g} (1/sqrt({d_k}))", f"scale {b['scale']:.4g} (--scale)"]
    width = max(len(r[0]) for r in _COMPARISON_ROWS)
    print("    " + " " * width + "  " + "  ".join(h.rjust(24) for h in heads))
    for label, key, fmt in _COMPARISON_ROWS:
        print("    " + label.ljust(width) + "  "
              + "  ".join(fmt.format(c[key]).rjust(24) for c in (a, b)))
    print(f"    (uniform weights would have entropy ln(n) = {comp['uniform_entropy']:.3f}; "
          "one-hot rows 0)")
    print("    " + _saturation_text(a, b))
    return first_step + 1


def _saturation_text(a, b) -> str:
    """What the comparison shows: the given scale's softmax against 1/sqrt(d_k)'s."""
    given = f"with scale {b['scale']:.4g} the softmax is"
    if b["max_weight_mean"] == a["max_weight_mean"] and b["norm_dS"] == a["norm_dS"]:
        return f"{given} as saturated as with 1/sqrt(d_k): the same gradients"
    if b["max_weight_mean"] < a["max_weight_mean"]:
        return (f"{given} less saturated than with 1/sqrt(d_k); |dS| is "
                f"{b['norm_dS'] / a['norm_dS'] if a['norm_dS'] else math.inf:.3g}x as large")
    how = ("0: every row is one-hot" if b["norm_dS"] == 0 else
           f"{a['norm_dS'] / b['norm_dS']:.3g}x smaller")
    return (f"{given} more saturated and |dS|, the gradient through it, is {how}\n"
            "    than with 1/sqrt(d_k): dQ and dK, which come only through dS, shrink with it\n"
            "    (dV = P^T dO does not pass through the softmax)")


def _output_text(t) -> str:
    return ("weighted sum of the value rows, the weights summing to less than 1"
            if "sink_weight" in t else "weighted average of the value rows")


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


def save_plot(t, path, names, causal=None):
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
