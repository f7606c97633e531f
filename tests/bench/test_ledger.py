"""The benchmark ledger: entries as written, README blocks rendered from them, and README held to its ledger."""

import ast
import json
import sys
from pathlib import Path

import pytest

from accel.bench import ledger
from accel.bench.readme import BLOCK, RENDERED, RENDERERS, machine_line, render

ROOT = Path(__file__).resolve().parents[2]


def test_a_figure_is_the_median_and_spread_of_its_repeats():
    assert ledger.figure([3.0, 1.0, 2.0], "tok/s") == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3,
                                                      "unit": "tok/s"}
    assert ledger.ratio([2.0, 3.0], [1.0, 2.0])["median"] == pytest.approx(1.75)
    with pytest.raises(ValueError, match="at least one value"):
        ledger.figure([], "s")
    with pytest.raises(ValueError, match="pairs equal"):
        ledger.ratio([1.0], [1.0, 2.0])


def test_an_entry_records_command_commit_machine_load_and_figures(tmp_path):
    with ledger.Entry("demo-1", argv=["scripts/bench_x.py", "--a", "b c"], directory=tmp_path) as e:
        e.figures["decode"] = ledger.figure([10.0, 12.0], "tok/s")
        e.info["model"] = "tiny"
    entry = json.loads((tmp_path / "demo-1.json").read_text())
    assert entry["command"] == "scripts/bench_x.py --a 'b c'"
    assert entry["commit"] == "unknown" or len(entry["commit"].split("+")[0]) == 40
    assert entry["machine"]["cores"] >= 1 and isinstance(entry["machine"]["flags"], list)
    assert set(entry["load"]) == {"others_cores", "steal_pct", "contended"}
    assert entry["figures"]["decode"]["median"] == 11.0 and entry["info"] == {"model": "tiny"}
    assert ledger.read("demo-1", tmp_path)["key"] == "demo-1"
    with pytest.raises(FileNotFoundError, match="have: \\['demo-1'\\]"):
        ledger.read("missing", tmp_path)


def test_a_failed_measurement_writes_nothing_and_bad_keys_are_refused(tmp_path):
    with pytest.raises(RuntimeError):
        with ledger.Entry("demo", directory=tmp_path) as e:
            e.figures["x"] = ledger.figure([1.0], "s")
            raise RuntimeError("benchmark crashed")
    assert not list(tmp_path.iterdir())
    for bad in ("a/b", "", ".hidden", "a b"):
        with pytest.raises(ValueError, match="ledger key"):
            ledger.Entry(bad)
    with pytest.raises(ValueError, match="no figures"):
        ledger.Entry("empty", directory=tmp_path).write()


def test_every_benchmark_script_writes_a_ledger_entry():
    """Each scripts/bench_*.py constructs an `Entry`, so a new benchmark that forgets the ledger fails here."""
    scripts = sorted((ROOT / "scripts").glob("bench_*.py"))
    assert scripts, "no scripts/bench_*.py found"

    def constructs_entry(path: Path) -> bool:
        return any(isinstance(node, ast.Call) and "Entry" in (getattr(node.func, "id", None),
                                                              getattr(node.func, "attr", None))
                   for node in ast.walk(ast.parse(path.read_text(), filename=str(path))))

    missing = [p.name for p in scripts if not constructs_entry(p)]
    assert not missing, f"benchmark scripts that write no ledger entry (`with Entry(KEY) as entry:`): {missing}"


def _entry(key: str, cpu: str = "Test CPU", **figs) -> dict:
    return {"key": key, "command": ".venv/bin/python scripts/bench_optimize.py recipes/x.yaml", "commit": "a" * 40,
            "machine": {"cpu": cpu, "cores": 2, "flags": ["avx2", "avx512f"], "memory_gb": 24.0},
            "figures": {k.replace("_", ".", 1): v for k, v in figs.items()}}


def test_optimize_costs_renders_minutes_and_peak_from_the_entries(tmp_path):
    e = _entry("optimize-x", sensitivity_seconds=ledger.figure([600.0], "s"),
               total_seconds=ledger.figure([1500.0], "s"), total_peak_gb=ledger.figure([11.234], "GB"))
    text = RENDERERS["optimize_costs"]([e])
    assert "Test CPU, 2 cores (avx512f), 24 GB; commit aaaaaaa:" in text
    assert "| `x` | 10.0 | - | - | 25.0 | 11.23 |" in text
    assert "scripts/bench_optimize.py recipes/x.yaml" in text
    with pytest.raises(ValueError, match="different machines"):
        machine_line([e, _entry("optimize-y", cpu="Other CPU")])


def test_render_rewrites_only_ledger_blocks_and_refuses_unknown_renderers(tmp_path):
    (tmp_path / "optimize-x.json").write_text(json.dumps(
        _entry("optimize-x", total_seconds=ledger.figure([60.0, 120.0, 90.0], "s"))))
    text = "# title\n\n<!-- ledger: optimize_costs optimize-x -->\nstale table\n<!-- /ledger -->\n\nafter\n"
    out = render(text, tmp_path)
    assert out.startswith("# title\n\n<!-- ledger: optimize_costs optimize-x -->\n") and out.endswith(
        "<!-- /ledger -->\n\nafter\n")
    assert "| `x` | - | - | - | 1.5 ± 0.5 | - |" in out and "stale" not in out
    assert render(out, tmp_path) == out
    with pytest.raises(ValueError, match="renderer 'nope'"):
        render("<!-- ledger: nope optimize-x -->\n<!-- /ledger -->", tmp_path)


@pytest.mark.parametrize("name", RENDERED)
def test_readme_tables_are_their_ledger_entries(name):
    """Every ledger block of README (and benchmarks/README.md) equals its rendering from `benchmarks/ledger/`
    (scripts/render_readme.py)."""
    text = (ROOT / name).read_text()
    assert BLOCK.search(text), f"{name} has no ledger block"
    assert render(text) == text, f"{name} differs from its ledger: run scripts/render_readme.py"


def test_peer_speed_renders_each_pairs_absolute_figures_and_ratio(tmp_path):
    e = _entry("peers-m-llama.cpp-inprocess")
    e["command"] = ".venv/bin/python scripts/bench_peers.py --model m"
    e["info"] = {"peer": "llama.cpp", "labels": {"fp16": "fp16 weights / F16"}}
    e["figures"] = {"batch-1 decode, in-process|fp16.accel": ledger.figure([30.0, 32.0, 31.0], "tok/s"),
                    "batch-1 decode, in-process|fp16.peer": ledger.figure([20.0, 22.0, 21.0], "tok/s"),
                    "batch-1 decode, in-process|fp16.ratio": ledger.ratio([30.0, 32.0, 31.0], [20.0, 22.0, 21.0]),
                    # a row against another reference (the roofline) stays in the entry
                    "batch-1 decode, in-process|fp16|weight-bytes roofline.ratio": ledger.ratio([1.0], [2.0])}
    text = RENDERERS["peer_speed"]([e])
    assert "| batch-1 decode, in-process (tok/s) | fp16 weights / F16 | 31.0 ± 1.0 | 21.0 ± 1.0 | 1.48x (1.46-1.50) |" \
        in text
    assert "roofline" not in text and "scripts/bench_peers.py --model m" in text


def test_speculation_renders_each_method_against_no_speculation(tmp_path):
    e = _entry("spec-m-input-grounded-b1")
    e["command"] = ".venv/bin/python scripts/bench_spec.py --target m --methods off,off2,ngram:num_speculative_tokens=15"
    e["info"] = {"target": "/models/m", "quant": "int8", "draft_model": "d", "draft_quantization": "int4"}
    e["figures"] = {"b1|input-grounded|off.tok_s": ledger.figure([100.0, 110.0], "tok/s"),
                    "b1|input-grounded|off2.tok_s": ledger.figure([101.0, 109.0], "tok/s"),
                    "b1|input-grounded|off2.speedup": ledger.figure([0.99, 1.01], "x"),
                    "b1|input-grounded|ngram:num_speculative_tokens=15.tok_s": ledger.figure([200.0, 230.0], "tok/s"),
                    "b1|input-grounded|ngram:num_speculative_tokens=15.speedup": ledger.figure([2.0, 2.1], "x"),
                    "b1|input-grounded|ngram:num_speculative_tokens=15.acceptance": ledger.figure([0.5, 0.6], ""),
                    "b1|input-grounded|ngram:num_speculative_tokens=15.accepted_length":
                        ledger.figure([3.0, 3.4], "tokens"),
                    "b4|input-grounded|draft.tok_s": ledger.figure([50.0], "tok/s"),
                    "b4|input-grounded|draft.speedup": ledger.figure([0.9], "x")}
    text = RENDERERS["speculation"]([e])
    assert ("| m int8 | input-grounded | 1 | n-gram lookup, k=15 | 105.0 ± 5.0 | 215.0 ± 15.0 | 2.05x (2.00-2.10) | "
            "0.55 ± 0.05 | 3.20 ± 0.20 |") in text
    assert "| m int8 | input-grounded | 1 | none, again (the noise floor) | 105.0 ± 5.0 |" in text
    # a draft model is named with its quantization; a figure the entry lacks is a dash
    assert "| m int8 | input-grounded | 4 | draft `d` int4 | - | 50.0 | 0.90x | - | - |" in text
    assert "scripts/bench_spec.py --target m" in text


def test_quality_names_an_export_by_its_run_and_keeps_peers_names():
    e = _entry("quality-m")
    e["command"] = ".venv/bin/python scripts/bench_quality.py runs/m-int4/checkpoint --model m"
    e["info"] = {"rows": ["accel runs/m-int4/checkpoint", "llama.cpp IQ4_XS, importance matrix"], "chunks": 40,
                 "n_ctx": 128}
    e["figures"] = {"accel runs/m-int4/checkpoint.size_mib": ledger.figure([1059.2], "MiB"),
                    "accel runs/m-int4/checkpoint.kld_mean": ledger.figure([0.0291], ""),
                    "accel runs/m-int4/checkpoint.same_top1": ledger.figure([0.927], ""),
                    "llama.cpp IQ4_XS, importance matrix.size_mib": ledger.figure([972.0], "MiB"),
                    "llama.cpp IQ4_XS, importance matrix.kld_mean": ledger.figure([0.0214], "")}
    text = RENDERERS["quality"]([e])
    assert "40 chunks of 128 tokens:" in text
    assert "| accel `m-int4` | 1059 | 0.0291 | 92.7% |" in text
    assert "| llama.cpp IQ4_XS, importance matrix | 972 | 0.0214 | - |" in text
