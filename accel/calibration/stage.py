"""The calibration stage of a run: load the source, draw (stratified or random), record it in the run folder."""
from __future__ import annotations

from pathlib import Path

from accel.calibration.record import write_draw
from accel.calibration.sampler import CalibrationDraw, random_draw, stratified_draw
from accel.calibration.sources import load_samples


def run_calibration(cfg, tokenizer, run_dir: str | Path | None = None, *, method: str = "stratified",
                    root: str | Path | None = None) -> CalibrationDraw:
    """Load `cfg.source`, draw `cfg.num_samples` units and, when `run_dir` is given, write
    calibration.jsonl and calibration_summary.json there. `method` is "stratified" or "random"."""
    draws = {"stratified": stratified_draw, "random": random_draw}
    if method not in draws:
        raise ValueError(f"method must be 'stratified' or 'random', got {method!r}")
    draw = draws[method](load_samples(cfg, root=root), tokenizer, cfg)
    if run_dir is not None:
        write_draw(draw, run_dir)
    return draw
