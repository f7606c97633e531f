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


def test_peers_with_an_importance_matrix_learn_it_from_the_calibration_text_only(tmp_path):
    """`TYPE+imatrix` peers: llama-imatrix runs once over calibration_data/ (never the eval text), and
    llama-quantize takes it for those peers only; plain k- / i-quant peers are quantized without it."""
    import json
    import stat

    log = tmp_path / "calls.jsonl"
    for tool in ("llama-imatrix", "llama-quantize"):  # fake binaries: record argv, write the output file
        script = tmp_path / tool
        out_arg = "-o" if tool == "llama-imatrix" else None
        script.write_text(
            "#!/usr/bin/env python3\nimport json, sys\n"
            f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
            + (f"open(sys.argv[sys.argv.index({out_arg!r}) + 1], 'w').write('m')\n" if out_arg else
               "open(sys.argv[-2], 'w').write('q')\n")
            + ("import pathlib; t = pathlib.Path(sys.argv[sys.argv.index('-f') + 1]).read_text()\n"
               f"open({str(tmp_path / 'seen.txt')!r}, 'w').write(t)\n" if out_arg else ""))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    f32 = tmp_path / "model.F32.gguf"
    f32.write_text("f")
    files = bench_quality.imatrix_ggufs(tmp_path, f32, ["Q4_K_M+imatrix", "IQ4_XS+imatrix", "Q3_K_M"], 2)
    assert {k: v.name for k, v in files.items()} == {"Q4_K_M+imatrix": "model.Q4_K_M-imatrix.gguf",
                                                     "IQ4_XS+imatrix": "model.IQ4_XS-imatrix.gguf",
                                                     "Q3_K_M": "model.Q3_K_M.gguf"}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [Path(c[0]).name for c in calls] == ["llama-imatrix", "llama-quantize", "llama-quantize", "llama-quantize"]
    assert calls[0][1:] == ["-m", str(f32), "-f", calls[0][4], "-o", str(f32.with_suffix(".imatrix.gguf")), "-c",
                            "128", "-b", "128", "-t", "2", "--no-ppl"]
    assert [("--imatrix" in c) for c in calls[1:]] == [True, True, False]
    seen = (tmp_path / "seen.txt").read_text()
    assert seen == bench_quality.calibration_text() and "Happy birthday, Grandma" in seen
    held_out = [json.loads(line)["text"] for f in (Path(__file__).parents[1] / "eval" / "text").glob("*.jsonl")
                for line in f.read_text().splitlines() if line.strip()]
    assert held_out and not any(t[:200] in seen for t in held_out)
    assert "IQ3_XXS+imatrix" in bench_quality.allowed_peers() and "IQ3_XXS" not in bench_quality.allowed_peers()
