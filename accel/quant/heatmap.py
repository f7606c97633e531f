"""Sensitivity heatmap: decoder layer x (Linear, precision), colour = log10 damage."""

from __future__ import annotations

import math
from pathlib import Path

from accel.quant.schemes import layer_index
from accel.quant.sensitivity import SensitivityResult


def sensitivity_grid(sens: SensitivityResult) -> tuple[list[int], list[str], list[list[float]]]:
    """(layers, column labels 'proj:scheme', rows[layer][column] damage) over the quantized candidates."""
    schemes = [c for c in sens.candidates if c != "fp16"]
    kinds: list[str] = []
    for name in sens.damage:
        kind = name.rsplit(".", 1)[-1]
        if kind not in kinds:
            kinds.append(kind)
    layers = sorted({layer_index(n) for n in sens.damage})
    by_key = {(layer_index(n), n.rsplit(".", 1)[-1]): d for n, d in sens.damage.items()}
    cols = [f"{k}:{s}" for s in schemes for k in kinds]
    rows = [[by_key.get((li, c.split(":")[0]), {}).get(c.split(":")[1], float("nan")) for c in cols] for li in layers]
    return layers, cols, rows


def plot_heatmap(sens: SensitivityResult, path: str | Path, title: str | None = None) -> Path:
    """Write a PNG heatmap (layers down, Linear x precision across) of log10(damage)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, cols, rows = sensitivity_grid(sens)
    floor = 1e-12
    data = [[math.log10(max(v, floor)) if v == v else float("nan") for v in r] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(cols) + 2), max(4, 0.25 * len(layers) + 1.5)))
    im = ax.imshow(data, aspect="auto", cmap="magma")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(layers)), [str(i) for i in layers], fontsize=7)
    ax.set_ylabel("decoder layer")
    unit = "mean KL" if sens.metric == "kl" else "relative output MSE"
    fig.colorbar(im, ax=ax, label=f"log10 {unit}")
    ax.set_title(title or f"per-layer sensitivity ({sens.metric}, int4 group {sens.group_size})", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
