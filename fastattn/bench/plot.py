"""The benchmark's bar chart (``--plot``): GFLOP/s per attention shape and
thread count, fastattn and the peers, with the float32 matmul peaks as lines.
Needs matplotlib."""

from __future__ import annotations


def write_plot(path: str, rows: list[dict], peaks: list[dict], peers) -> None:
    """Write the bar chart of the attention ``rows`` to ``path`` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["kind"] == "attention" and r["gflops"] is not None
            and r["section"] != "overhead"]
    cases = list(dict.fromkeys((r["case"], r["dtype"], r["causal"]) for r in rows))
    threads = sorted({r["threads"] for r in rows})
    impls = ["fastattn"] + [p for p in peers if any(p in r["impls"] for r in rows)]
    series = [(imp, t) for imp in impls for t in threads]
    colors = {"fastattn": "tab:blue", "torch": "tab:orange", "numpy": "tab:green"}
    idx = {(r["case"], r["dtype"], r["causal"], r["threads"]): r for r in rows}

    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cases) + 2), 4.8))
    for si, (imp, t) in enumerate(series):
        ys = []
        for c in cases:
            r = idx.get(c + (t,))
            if r is None:
                ys.append(0.0)
            elif imp == "fastattn":
                ys.append(r["gflops"])
            else:
                g = r["impls"].get(imp, {}).get("gflops")
                ys.append(g or 0.0)
        xs = [i - 0.4 + width * (si + 0.5) for i in range(len(cases))]
        alpha = 0.45 + 0.55 * (threads.index(t) + 1) / len(threads)
        ax.bar(xs, ys, width, label=f"{imp} {t}t", color=colors.get(imp, "gray"),
               alpha=alpha, hatch="" if threads.index(t) == 0 else "//",
               edgecolor="black", linewidth=0.3)
    for p in peaks:
        if p["dtype"] == "float32" and p["threads"] in threads:
            ax.axhline(p["gflops"], linestyle="--", linewidth=0.8, color="gray")
            ax.text(len(cases) - 0.5, p["gflops"], f" f32 matmul peak {p['threads']}t",
                    va="bottom", ha="right", fontsize=7, color="gray")
    labels = [f"{c}\n{d}{' causal' if k else ''}" for c, d, k in cases]
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("GFLOP/s (4·B·H·L·S·D, causal halved)")
    ax.set_title("fastattn attention throughput by shape and thread count")
    ax.legend(fontsize=7, ncol=max(1, len(threads)))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
