"""scripts/bench_quality.py's parsing and table, with a fake llama-perplexity (the real run builds llama.cpp)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_quality", Path(__file__).parents[1] / "scripts" / "bench_quality.py")
bench_quality = importlib.util.module_from_spec(_spec)
sys.modules["bench_quality"] = bench_quality
_spec.loader.exec_module(bench_quality)

# the tail of `llama-perplexity --kl-divergence-base base.kld --kl-divergence` (lines not read trimmed)
KLD_OUTPUT = """
====== Perplexity statistics ======
Mean PPL(Q)                   :   9.803251 ±   0.232071
Mean PPL(base)                :   9.753967 ±   0.230675
Cor(ln(PPL(Q)), ln(PPL(base))):  99.87%
Mean ln(PPL(Q)/PPL(base))     :   0.005040 ±   0.001211
Mean PPL(Q)/PPL(base)         :   1.005053 ±   0.001217
Mean PPL(Q)-PPL(base)         :   0.049284 ±   0.011887

====== KL divergence statistics ======
Mean    KLD:   0.004512 ±   0.000109
Maximum KLD:   0.361245

====== Token probability statistics ======
Mean    Δp: -0.036 ± 0.015 %
Same top p: 96.571 ± 0.187 %
"""


def test_llama_perplexity_kld_output_is_parsed():
    out = bench_quality.parse_kld(KLD_OUTPUT)
    assert out == pytest.approx({"kld_mean": 0.004512, "same_top1": 0.96571, "ppl_ratio": 1.005053,
                                 "ppl": 9.803251, "ppl_base": 9.753967})
    with pytest.raises(ValueError, match="no 'kld_mean' line"):
        bench_quality.parse_kld(KLD_OUTPUT.replace("Mean    KLD", "Mean KL"))


def test_the_table_has_one_row_per_model_file():
    rows = [{"name": "accel runs/int8/checkpoint", "size_mib": 236.6, "kld_mean": 0.00431, "same_top1": 0.9681,
             "ppl_ratio": 1.0031, "num_tokens": 9450},
            {"name": "llama.cpp Q8_0", "size_mib": 138.2, **bench_quality.parse_kld(KLD_OUTPUT), "num_tokens": 9450}]
    lines = bench_quality.render(rows).splitlines()
    assert lines[2] == "| accel runs/int8/checkpoint | 237 MiB | 0.0043 | 96.8% | 1.003 | 9450 |"
    assert lines[3] == "| llama.cpp Q8_0 | 138 MiB | 0.0045 | 96.6% | 1.005 | 9450 |"
