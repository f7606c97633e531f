"""scripts/bench_quality.py's table (the llama-perplexity parsing is accel.eval.gguf's, tests/eval/test_gguf.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_quality", Path(__file__).parents[1] / "scripts" / "bench_quality.py")
bench_quality = importlib.util.module_from_spec(_spec)
sys.modules["bench_quality"] = bench_quality
_spec.loader.exec_module(bench_quality)

from accel.eval.gguf import parse_kld  # noqa: E402
from tests.eval.test_gguf import KLD_OUTPUT  # noqa: E402


def test_the_table_has_one_row_per_model_file():
    rows = [{"name": "accel runs/int8/checkpoint", "size_mib": 236.6, "kld_mean": 0.00431, "same_top1": 0.9681,
             "ppl_ratio": 1.0031, "num_tokens": 9450},
            {"name": "llama.cpp Q8_0", "size_mib": 138.2, **parse_kld(KLD_OUTPUT), "num_tokens": 9450}]
    lines = bench_quality.render(rows).splitlines()
    assert lines[2] == "| accel runs/int8/checkpoint | 237 MiB | 0.0043 | 96.8% | 1.003 | 9450 |"
    assert lines[3] == "| llama.cpp Q8_0 | 138 MiB | 0.0045 | 96.6% | 1.005 | 9450 |"


def test_bench_quality_takes_every_quantize_type_with_and_without_an_importance_matrix():
    assert "IQ3_XXS+imatrix" in bench_quality.allowed_peers() and "IQ3_XXS" not in bench_quality.allowed_peers()
    assert "shipped" in bench_quality.allowed_peers()


def test_exports_are_scored_as_accel_runs_them(tiny_model_dir, monkeypatch):
    """An export scored against its own base: accel's loader (the stored weights) gives the base's logits back."""
    import accel.kernels.loader
    import accel.hub

    monkeypatch.setattr(accel.hub, "resolve_model", lambda name: tiny_model_dir)
    loaded = []
    real = accel.kernels.loader.load_hf_model
    monkeypatch.setattr(accel.kernels.loader, "load_hf_model", lambda p: loaded.append(p) or real(p))
    text = " ".join(f"word{i % 37} and more text {i}" for i in range(400))
    rows, ppl_base = bench_quality.accel_rows("tiny", [tiny_model_dir], text, n_ctx=32, chunks=4)
    assert loaded == [tiny_model_dir] and ppl_base > 1
    assert rows[0]["kld_mean"] < 1e-6 and rows[0]["same_top1"] == 1.0 and abs(rows[0]["ppl_ratio"] - 1) < 1e-5
