"""Heatmap grid layout on a hand-made table, and the PNG is written."""

from __future__ import annotations

import math

from accel.quant.heatmap import plot_heatmap, sensitivity_grid
from accel.quant.sensitivity import SensitivityResult

SENS = SensitivityResult(metric="kl", group_size=32, candidates=["int4", "int8", "fp16"], num_tokens=8, damage={
    "model.layers.0.self_attn.q_proj": {"int4": 1e-2, "int8": 1e-4, "fp16": 0.0},
    "model.layers.0.mlp.down_proj": {"int4": 2e-2, "int8": 2e-4, "fp16": 0.0},
    "model.layers.1.self_attn.q_proj": {"int4": 3e-2, "int8": 3e-4, "fp16": 0.0},
})


def test_grid_layout():
    layers, cols, rows = sensitivity_grid(SENS)
    assert layers == [0, 1]
    assert cols == ["q_proj:int4", "down_proj:int4", "q_proj:int8", "down_proj:int8"]
    assert rows[0] == [1e-2, 2e-2, 1e-4, 2e-4]
    assert rows[1][0] == 3e-2 and math.isnan(rows[1][1]) and rows[1][2] == 3e-4


def test_png_written(tmp_path):
    out = plot_heatmap(SENS, tmp_path / "s.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
