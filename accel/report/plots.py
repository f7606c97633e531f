"""The report's plots, as PNG bytes (matplotlib, Agg backend: no display, no network).

Each function takes plain data and returns PNG bytes, so it can be tested and embedded without files.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib

matplotlib.use("Agg")  # headless: never open a window or need a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 110


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both minimised), ordered by x.

    A point is dominated when another is <= on both coordinates and < on at least one. Ties (equal points)
    both stay on the front.
    """
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(a <= x and b <= y and (a < x or b < y) for j, (a, b) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def pareto_scatter(names: list[str], xs: list[float], ys: list[float], xlabel: str, ylabel: str, title: str) -> bytes:
    """Scatter of variants (lower-left is better) with the Pareto front drawn as a step line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    front = pareto_front(list(zip(xs, ys)))
    on_front = set(front)
    for i, (n, x, y) in enumerate(zip(names, xs, ys)):
        ax.scatter([x], [y], s=60, color="C3" if i in on_front else "C0", zorder=3)
        ax.annotate(n, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9)
    if len(front) > 1:
        ax.step([xs[i] for i in front], [ys[i] for i in front], where="post", color="C3", alpha=0.7,
                label="Pareto front")
        ax.legend(loc="best")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (lower-left is better)")
    ax.grid(alpha=0.3)
    return _png(fig)


def throughput_vs_concurrency(series: dict[str, list[tuple[float, float]]], knees: dict[str, int | None]) -> bytes:
    """Output tokens/s vs concurrency per variant; the knee (if found) is circled."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (name, pts) in enumerate(series.items()):
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, color=f"C{k}")
        knee = knees.get(name)
        if knee is not None and knee < len(pts):
            ax.scatter([pts[knee][0]], [pts[knee][1]], s=220, facecolors="none", edgecolors=f"C{k}", linewidths=2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput vs concurrency (circle = knee)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _png(fig)


def latency_cdfs(series: dict[str, dict[str, list[float]]], metrics: tuple[str, ...] = ("TTFT", "TPOT")) -> bytes:
    """Empirical CDFs of each metric (ms), one panel per metric, one line per series (variant / workload)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for k, (name, vals) in enumerate(series.items()):
            v = np.sort(np.asarray(vals.get(m, []), dtype=float))
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=name, color=f"C{k}")
        ax.set_xlabel(f"{m} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{m} CDF")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _png(fig)


def acceptance_per_position(series: dict[str, list[float]]) -> bytes:
    """Acceptance rate at each draft position (1-based), one line per variant."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (name, rates) in enumerate(series.items()):
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name, color=f"C{k}")
    width = max((len(r) for r in series.values()), default=1)
    ax.set_xticks(range(1, width + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance per draft position")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def acceptance_per_domain(series: dict[str, dict[str, float]]) -> bytes:
    """Grouped bars: acceptance rate per domain, one bar per variant."""
    domains = sorted({d for v in series.values() for d in v})
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(domains) + 2), 4))
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(domains))
    for k, (name, rates) in enumerate(series.items()):
        ax.bar(x + k * width, [rates.get(d, 0.0) for d in domains], width, label=name, color=f"C{k}")
    ax.set_xticks(x + width * (len(series) - 1) / 2, domains, rotation=20)
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance rate per domain")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)$")


def _layer_grid(table: dict[str, dict[str, float]]) -> tuple[list[int], list[str]] | None:
    """(layer indices, module kinds) when every module name is '...layers.<i>.<kind>', else None."""
    parsed = [LAYER_RE.search(m) for m in table]
    if not parsed or not all(parsed):
        return None
    layers = sorted({int(p.group(1)) for p in parsed})
    kinds = list(dict.fromkeys(p.group(2) for p in parsed))
    return layers, kinds


def sensitivity_heatmap(table: dict[str, dict[str, float]]) -> bytes:
    """Colour = log10 KL of quantizing one module alone. For transformer layers: one panel per scheme, layers
    (rows) x module kinds (columns); otherwise modules (rows) x schemes (columns)."""
    schemes = sorted({s for v in table.values() for s in v})
    grid = _layer_grid(table)
    log_kl = {m: {s: math.log10(max(k, 1e-12)) for s, k in v.items()} for m, v in table.items()}
    if grid is None:
        modules = list(table)
        data = np.array([[log_kl[m].get(s, np.nan) for s in schemes] for m in modules])
        fig, ax = plt.subplots(figsize=(2.2 + 1.2 * len(schemes), min(12, max(3, 0.16 * len(modules) + 1))))
        im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(len(schemes)), schemes)
        step = max(1, len(modules) // 60)  # keep labels legible on big models
        ax.set_yticks(range(0, len(modules), step), [modules[i] for i in range(0, len(modules), step)], fontsize=6)
        fig.colorbar(im, ax=ax, label="log10 KL (quantize this module alone)")
        ax.set_title("Per-layer sensitivity")
        return _png(fig)
    layers, kinds = grid
    where = {(int(p.group(1)), p.group(2)): m for m in table for p in [LAYER_RE.search(m)]}
    vals = [x for v in log_kl.values() for x in v.values()]
    vmin, vmax = (min(vals), max(vals)) if vals else (0.0, 1.0)
    fig, axes = plt.subplots(1, len(schemes), figsize=(1.0 + 3.2 * len(schemes), min(12, 2 + 0.22 * len(layers))),
                             squeeze=False)
    for j, (ax, s) in enumerate(zip(axes[0], schemes)):
        data = np.array([[log_kl.get(where.get((li, k), ""), {}).get(s, np.nan) for k in kinds] for li in layers])
        im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest", vmin=vmin, vmax=vmax)
        ax.set_xticks(range(len(kinds)), [k.split(".")[-1] for k in kinds], rotation=45, ha="right", fontsize=8)
        step = max(1, len(layers) // 30)
        ax.set_yticks(range(0, len(layers), step), [str(layers[i]) for i in range(0, len(layers), step)], fontsize=7)
        if j == 0:
            ax.set_ylabel("layer")
        ax.set_title(s)
    fig.colorbar(im, ax=list(axes[0]), label="log10 KL (quantize this module alone)")
    fig.suptitle("Per-layer sensitivity")
    return _png(fig)


def bits_per_layer(modules: list[str], bits: list[int]) -> bytes:
    """Bar per quantizable module (in model order): the bits its weights got in the plan."""
    fig, ax = plt.subplots(figsize=(min(12, max(7, 0.05 * len(modules) + 4)), 3.5))
    colors = {4: "C3", 8: "C1", 16: "C2", 32: "C0"}
    ax.bar(range(len(modules)), bits, color=[colors.get(b, "C7") for b in bits], width=1.0)
    ax.set_xlabel("module (model order)")
    ax.set_ylabel("weight bits")
    ax.set_yticks(sorted(set(bits)))
    ax.set_title(f"Bits per layer (average {np.mean(bits):.2f})")
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)
