"""Report rendering from a hand-made run result: Markdown tables, self-contained HTML, headless Chromium."""

from __future__ import annotations

import json
import re

import pytest

from accel.bench.latency import RequestRecord, SweepResult, summarize
from accel.report import ReportInputError, RunReport, build_report, machine_info, report_from_bench
from accel.report.environment import cpu_model, memory_gb
from accel.report.plots import pareto_front
from tests.report import browser
from tests.report.fixtures import run_result

NUM_FIGURES = 9  # pareto, size, 2 CDFs, throughput, acceptance per position / domain, sensitivity, bits
NUM_TABLES = 16


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    md, html = build_report(run_result(), out)
    return out, md.read_text(), html.read_text()


# ---- pure parts -------------------------------------------------------------------------------------------
def test_pareto_front():
    pts = [(40, 0.0), (25, 0.004), (15, 0.02), (35, 0.05), (25, 0.01)]
    assert pareto_front(pts) == [2, 1, 0]  # ordered by x; (35, .05) and (25, .01) are dominated
    assert pareto_front([(1, 1), (1, 1)]) == [0, 1]  # equal points both stay
    assert pareto_front([(1, 1)]) == [0]


def test_layer_grid_pivots_transformer_modules():
    from accel.report.plots import _layer_grid

    t = {"model.layers.1.mlp.down_proj": {}, "model.layers.0.self_attn.q_proj": {}, "model.layers.0.mlp.down_proj": {}}
    assert _layer_grid(t) == ([0, 1], ["mlp.down_proj", "self_attn.q_proj"])
    assert _layer_grid({"lm_head": {}, "model.layers.0.mlp.up_proj": {}}) is None


def test_spec_counters_are_derived():
    r = RunReport.from_dict(run_result())
    spec = r.variants[2].spec
    assert spec.acceptance_rate == pytest.approx(230 / 400)
    assert spec.mean_acceptance_length == pytest.approx(1 + 230 / 100)
    assert spec.acceptance_rate_per_pos == pytest.approx([0.9, 0.7, 0.45, 0.25])
    assert r.variants[2].spec_per_domain["code"].acceptance_rate == pytest.approx(0.75)


def test_run_report_round_trip():
    r = RunReport.from_dict(run_result())
    assert RunReport.from_dict(r.to_dict()) == r
    assert r.variants[0].speed["batch1"].errors_by_kind == {"http_503": 1}


def test_machine_info_parsing():
    assert cpu_model("processor: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n") == \
        "AMD EPYC 7763 64-Core Processor"
    assert cpu_model("Hardware\t: BCM2835\n") == "BCM2835"
    assert memory_gb("MemTotal:       16777216 kB\nMemFree: 1 kB\n") == 16.0
    info = machine_info()
    assert info["cpu_count"] >= 1 and isinstance(info["gpus"], list)
    assert info["versions"]["torch"] is not None and "llmcompressor" in info["versions"]


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(variants="x"), "'variants' must be a list"),
    (lambda d: d["variants"][1].pop("name"), r"variants\[1\] must be an object with a non-empty 'name'"),
    (lambda d: d.update(plan={"m": "int3"}), r"plan\['m'\] = 'int3' is not a scheme"),
    (lambda d: d["variants"][2]["spec"].update(num_accepted_tokens=401),
     r"variants\[2\] \(mixed\+spec\).spec: num_accepted_tokens=401 is invalid; allowed: 0 to num_draft_tokens=400"),
    (lambda d: d["variants"][0]["speed"].update(bad={"x": 1}), r"variants\[0\] \(fp32\).speed.bad"),
])
def test_bad_input_names_the_field(mutate, match):
    d = run_result()
    mutate(d)
    with pytest.raises(ReportInputError, match=match):
        RunReport.from_dict(d)


# ---- Markdown / HTML ------------------------------------------------------------------------------------
def test_markdown_has_every_table_and_section(rendered):
    out, md, _ = rendered
    for title in ("Summary", "Quality vs latency", "Quality vs size", "Quality", "Speed", "Throughput vs concurrency",
                  "Speculative decoding", "Quantization", "Definitions", "Reproduce"):
        assert f"\n## {title}\n" in md
    assert md.count("\n|---|") == NUM_TABLES
    assert "| fp32 | 513.0 | 32.00 | 10.00 | 0 | 0 | 0 | 1.00 | 0.4 | 140.4 | 1.00x | 55.00 | 40.00 |" in md
    assert "| int8 | 140.0 | 0.004 | yes |" in md  # quality vs size: +spec variants are the same file, left out
    assert "| int4-bad | 35.00 | 0.05 | no |" in md and "| mixed+spec | 15.00 | 0.02 | yes |" in md
    assert "| mixed+spec | 100 | 400 | 230 | 0.575 | 3.30 |" in md  # spec counters and derived rates
    assert "| mixed+spec | 0.9 | 0.7 | 0.45 | 0.25 |" in md  # acceptance per position
    assert "http_503: 1" in md and "8/9" in md  # errors by kind, ok/total
    assert "(E2E latency - TTFT) / (output tokens - 1)" in md  # vLLM's TPOT in Definitions
    assert "Test CPU 9000" in md and "| llmcompressor | not installed |" in md
    assert "```yaml\nname: demo\nmodel:\n  path: smollm2-135m\n```" in md
    assert "```bash\naccel optimize recipes/default.yaml\n```" in md
    links = re.findall(r"!\[[^\]]*\]\((plots/[^)]+\.png)\)", md)
    assert len(links) == NUM_FIGURES and all((out / p).read_bytes()[:4] == b"\x89PNG" for p in links)


def test_html_is_self_contained(rendered):
    _, _, html = rendered
    assert html.count('<img alt="') == NUM_FIGURES
    assert html.count("<table>") == NUM_TABLES
    assert html.count('src="data:image/png;base64,') == NUM_FIGURES
    assert not re.search(r'(src|href)="(?!data:|#)', html)  # nothing loaded from anywhere
    assert "<script" not in html


def test_minimal_result_renders_and_records_this_machine(tmp_path):
    md, html = build_report({"name": "tiny", "variants": [{"name": "only"}]}, tmp_path)
    text = md.read_text()
    assert "## Summary" in text and "## Definitions" in text and "## Reproduce" in text
    assert "## Speed" not in text and "## Quantization" not in text
    assert machine_info()["cpu_model"] in text


def test_a_contended_speed_measurement_is_flagged(tmp_path):
    from accel.pipeline.evaluate import contended
    from accel.pipeline.ui import headline_table

    result = run_result()
    busy = {"others_cores": 0.98, "steal_pct": 0.4, "contended": True}
    quiet = {"others_cores": 0.02, "steal_pct": 0.0, "contended": False}
    result["variants"][1]["speed"]["batch1"]["load"] = [quiet, busy, quiet]
    md, _ = build_report(result, tmp_path)
    assert ("**Contended**: the machine was shared during int8/batch1 (other processes 0.98 cores, steal 0%)"
            in md.read_text())
    summary = contended({v["name"]: v["speed"] for v in result["variants"]})
    assert summary == "int8/batch1 (other processes 0.98 cores, steal 0%)"
    (tmp_path / "eval.json").write_text(json.dumps({"summary": {"contended": summary}}))
    assert "contended" in headline_table(tmp_path).caption
    assert contended({"quantized": {"batch1": {"load": [quiet]}}}) == "none"
    (tmp_path / "eval.json").write_text(json.dumps({"summary": {"contended": "none"}}))
    assert headline_table(tmp_path).caption is None


def test_bench_only_report(tmp_path):
    points = [summarize([RequestRecord("a", 0.0, 1.0, 4, 3, [0.2, 0.5, 1.0])],
                        config={"concurrency": c, "request_rate": None, "model": "m"}) for c in (1, 2)]
    md, _ = build_report(report_from_bench(SweepResult(points, None, "rule")), tmp_path)
    text = md.read_text()
    assert "## Throughput vs concurrency" in text and "| m | 2 | 3.00 |" in text
    assert "| variant | out tok/s (c1) | speedup |" in text  # no all-n/a quality columns


# ---- headless Chromium ---------------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(not browser.have_chromium(),
                                    reason="Debian's chromium is not installed (apt-get install chromium)")

BAD_PAGE = ('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body><img alt="x" src="missing.png">'
            '<script>console.error("boom")</script></body></html>')


@needs_chromium
@pytest.mark.slow
def test_report_in_headless_chromium(rendered, tmp_path):
    out, _, _ = rendered
    dom, console = browser.dump_dom((out / "report.html").as_uri(), tmp_path / "profile")
    assert dom.count("<img ") == NUM_FIGURES and dom.count("<table>") == NUM_TABLES
    assert 'id="fig-pareto"' in dom and 'id="fig-sensitivity"' in dom
    assert console == []
    # the checker itself sees console errors
    bad = tmp_path / "bad.html"
    bad.write_text(BAD_PAGE)
    assert browser.dump_dom(bad.as_uri(), tmp_path / "profile2")[1] == ['"boom", source: ' + bad.as_uri() + " (1)"]


@needs_chromium
@pytest.mark.slow
def test_report_in_chromium_via_chromedriver(rendered, tmp_path):
    pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")
    if not browser.Path(browser.CHROMEDRIVER).exists():
        pytest.skip("Debian's chromium-driver is not installed")
    out, _, _ = rendered
    page = browser.selenium_inspect((out / "report.html").as_uri(), tmp_path / "profile")
    assert page["tables"] == NUM_TABLES and len(page["images"]) == NUM_FIGURES
    assert all(width > 100 for _, width in page["images"])  # every plot decoded
    assert [e for e in page["log"] if e["level"] in ("SEVERE", "WARNING")] == []
    bad = tmp_path / "bad.html"
    bad.write_text(BAD_PAGE)
    page = browser.selenium_inspect(bad.as_uri(), tmp_path / "profile2")
    assert page["images"] == [["x", 0]]
    assert sum(e["level"] == "SEVERE" for e in page["log"]) >= 2  # the missing image and console.error


def test_summary_shows_the_spread_of_repeated_runs(tmp_path):
    result = run_result()
    speed = result["variants"][0]["speed"]["batch1"]
    speed["repeats"] = [speed["output_throughput"] - 10, speed["output_throughput"], speed["output_throughput"] + 5]
    md, _ = build_report(result, tmp_path)
    assert "| 140.4 (130.4-145.4) | 1.00x |" in md.read_text()


def test_gguf_peers_join_the_tables_and_the_pareto_plot_on_llama_cpps_scale(tmp_path):
    from accel.report.sections import pareto_section, quality_section, summary_section

    d = run_result()
    for v, kld in zip(d["variants"], (0.0, 0.01, 0.01)):
        v["quality"].update(kld_llama=kld, top1_llama=1 - 5 * kld, ppl_ratio_llama=1 + kld)
    peer = {**d["variants"][1], "name": "llama.cpp-Q4_K_M", "size_mb": 105.6, "spec": None, "spec_per_domain": {},
            "quality": {"kld_llama": 0.062, "top1_llama": 0.853, "ppl_ratio_llama": 1.09}}
    d["variants"].append(peer)
    r = RunReport.from_dict(d)
    pareto = pareto_section(r)
    table = pareto.blocks[-1]
    assert table.headers[2] == "KLD (llama.cpp scale)"  # the one scale every point has
    assert [row[0] for row in table.rows][-1] == "llama.cpp-Q4_K_M" and table.rows[-1][2] == "0.062"
    q = quality_section(r).blocks[0]
    assert q.headers[-3:] == ["KLD (llama.cpp scale)", "same top-1 (llama.cpp scale)", "PPL ratio (llama.cpp scale)"]
    assert "KLD (llama.cpp scale)" in summary_section(r).blocks[0].headers
    # without GGUF peers the tables keep accel's own columns only
    plain = RunReport.from_dict(run_result())
    assert "KLD (llama.cpp scale)" not in quality_section(plain).blocks[0].headers
    assert pareto_section(plain).blocks[-1].headers[2] == "KL mean"
