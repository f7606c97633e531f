"""accel export verify --target vllm / vllm-cpu with a real server: the check's rules, and the whole check against a
stand-in server (tests/export/fake_vllm.py); the real vLLM-CPU where its side venv and an export are here."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from accel.export import vllm_serve
from accel.export.checkpoint import verify_export, write_export
from accel.export.compatibility import VllmCheckUnavailable

ROOT = Path(__file__).resolve().parents[2]


def test_first_divergence_and_the_bucketed_kld_bound():
    assert vllm_serve.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert vllm_serve.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert vllm_serve.first_divergence([1, 2], [1, 2, 3]) == 2
    p = torch.log_softmax(torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0]), -1)
    q = torch.log_softmax(torch.tensor([1.5, 1.2, 0.1, -0.5, -2.0]), -1)
    full = float((p.exp() * (p - q)).sum())
    everything = dict(enumerate(p.tolist()))
    assert math.isclose(vllm_serve.bucketed_kld(everything, q), full, rel_tol=1e-6)
    top2 = dict(list(everything.items())[:2])
    assert 0 < vllm_serve.bucketed_kld(top2, q) <= full  # merging the tail never raises the divergence
    assert vllm_serve.bucketed_kld(everything, p) == pytest.approx(0, abs=1e-9)


def test_metric_totals_sum_a_counters_labelled_samples_only():
    text = ('# HELP vllm:generation_tokens_total x\nvllm:generation_tokens_total{model_name="m",a="1"} 30.0\n'
            'vllm:generation_tokens_total{model_name="m",a="2"} 2.0\nvllm:generation_tokens_total_created 9.0\n')
    assert vllm_serve.metric_total(text, "vllm:generation_tokens_total") == 32.0
    assert vllm_serve.metric_total(text, "vllm:prompt_tokens_total") is None


def test_serve_dtype_is_fp32_but_bf16_for_4_bit_weights():
    four = {"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": 4}}}}}
    assert vllm_serve.serve_dtype({}) == "float32" and vllm_serve.serve_dtype(four) == "bfloat16"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """ACCEL_VLLM_CPU_PYTHON -> a launcher of tests/export/fake_vllm.py with this interpreter."""
    launcher = tmp_path / "python"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests" / "export" / "fake_vllm.py"} "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("ACCEL_VLLM_CPU_PYTHON", str(launcher))
    monkeypatch.setattr(vllm_serve, "local_loader", lambda: "vllm-cpu-avx2")
    monkeypatch.setattr(vllm_serve, "PROMPTS_PER_TASK", 1)  # 5 prompts: the check's every path, in CI's time
    monkeypatch.setattr(vllm_serve, "MAX_TOKENS", 8)
    return launcher


def test_verify_serves_the_export_and_finds_greedy_equal_a_stream_and_metrics(tmp_path, tiny_model_dir, fake_vllm):
    out = write_export(tmp_path / "export", tiny_model_dir)
    lines = []
    res = verify_export(out, load=False, target="vllm-cpu", progress=lines.append)
    serve = res.details["vllm_serve"]
    assert res.ok, res.problems
    assert serve["equal"] == len(serve["prompts"]) == 5
    assert all(p["first_divergence"] is None and p["kld_mean"] is None for p in serve["prompts"])
    assert serve["stream"]["text_equal"] and serve["stream"]["chunks"] >= 1
    assert serve["metrics"]["generation_tokens_total"] >= sum(len(p["vllm"]) for p in serve["prompts"])
    assert serve["loader"] == "vllm-cpu-avx2" and serve["dtype"] == "float32"
    assert any("vLLM-CPU: starting" in line for line in lines)


def test_where_the_server_parts_from_accel_verify_reports_where_and_the_kld(tmp_path, tiny_model_dir, fake_vllm,
                                                                            monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FLIP", "3")
    out = write_export(tmp_path / "export", tiny_model_dir)
    serve = verify_export(out, load=False, target="vllm-cpu").details["vllm_serve"]
    parted = [p for p in serve["prompts"] if p["first_divergence"] is not None]
    assert parted and all(p["first_divergence"] == 3 for p in parted)
    # the stand-in's distributions are accel's own: along its (flipped) tokens the KLD is 0, the top-1 the same
    assert all(p["kld_mean"] == pytest.approx(0, abs=1e-4) and p["same_top1"] == 1 for p in parted)


def test_verify_without_vllm_cpu_says_how_to_build_it_or_skips_for_the_vllm_target(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    out = write_export(tmp_path / "export", tiny_model_dir)
    monkeypatch.setenv("ACCEL_VLLM_CPU_PYTHON", str(tmp_path / "none" / "python"))
    with pytest.raises(VllmCheckUnavailable, match="setup_vllm_cpu.sh"):
        verify_export(out, load=False, target="vllm-cpu")
    monkeypatch.setattr("accel.export.compatibility.run_vllm_check", lambda root: {"ok": True})
    res = verify_export(out, load=False, target="vllm")  # the parse check alone, the serve check skipped
    assert res.ok and "setup_vllm_cpu.sh" in res.details["vllm_serve"]["skipped"]


def test_an_export_this_cpus_vllm_build_cannot_run_is_refused_before_starting(tmp_path, tiny_model_dir, fake_vllm,
                                                                              monkeypatch):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["model.layers.0.self_attn.q_proj"], "format": "pack-quantized", "input_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}}}}
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    out = write_export(tmp_path / "export", tiny_model_dir)
    res = verify_export(out, load=False, target="vllm-cpu")
    assert "AVX2 build" in res.details["vllm_serve"]["skipped"] and not res.ok
    assert any("cannot run" in p for p in res.problems)


REAL = [ROOT / "runs" / name / "checkpoint" for name in ("vllm-cpu-w8a8", "vllm-cpu")]


@pytest.mark.skipif(not vllm_serve.vllm_cpu_python().is_file(), reason="no vllm-cpu side venv "
                    "(scripts/peers/setup_vllm_cpu.sh)")
@pytest.mark.skipif(os.environ.get("ACCEL_RUN_VLLM_CPU") != "1", reason="starts vLLM-CPU (~3 minutes): set "
                    "ACCEL_RUN_VLLM_CPU=1")
@pytest.mark.parametrize("export", REAL, ids=[p.parent.name for p in REAL])
def test_the_real_vllm_cpu_serves_the_vllm_cpu_recipes_exports_as_accel_does(export):
    if not (export / "accel.json").is_file():
        pytest.skip(f"{export} not made (accel optimize recipes/{export.parent.name}.yaml)")
    res = verify_export(export, load=False, target="vllm-cpu")
    serve = res.details["vllm_serve"]
    if "skipped" in serve:
        assert vllm_serve.local_loader() == "vllm-cpu-avx2" and "AVX2 build" in serve["skipped"]
        return
    assert res.ok, res.problems  # equal, or parted by rounding: a KLD under the export's own
    assert serve["equal"] >= 1 and serve["stream"]["text_equal"]


def test_cli_verify_prints_the_serve_check(tmp_path, tiny_model_dir, fake_vllm):
    from typer.testing import CliRunner

    from accel.cli import app

    out = write_export(tmp_path / "export", tiny_model_dir)
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load", "--target", "vllm-cpu"])
    n = 5
    assert res.exit_code == 0, res.output
    assert f"greedy equal to accel on {n} of {n} eval prompts" in res.output and "vllm-cpu-avx2" in res.output


def test_a_vllm_peer_is_served_on_its_folder_for_the_evaluate_stage(tmp_path, tiny_model_dir, fake_vllm,
                                                                    monkeypatch):
    """eval.peers [{vllm: base | quantized}]: a vLLM-CPU server started on that folder, measured as a url peer."""
    import httpx

    from accel.pipeline import evaluate
    from accel.recipe import parse_recipe

    recipe = parse_recipe({"name": "v", "model": {"path": str(tiny_model_dir)},
                           "eval": {"peers": [{"name": "vllm-cpu", "vllm": "base"}]}})
    seen = {}

    def fake_speed(recipe, peer, requests, progress):
        from accel.bench.probes import serving_pids

        seen.update(url=peer.url, model=peer.model, health=httpx.get(peer.url + "/health").status_code,
                    pids=serving_pids(peer.url))  # what CpuLoad counts as the engine while it is measured
        return {"batch1": {"output_throughput": 1.0}}

    monkeypatch.setattr(evaluate, "peer_speed", fake_speed)
    out = evaluate.vllm_peer_speed(recipe, recipe.eval.peers[0], tiny_model_dir, {}, False)
    assert out == ({"batch1": {"output_throughput": 1.0}}, "fake")  # its speed, and its version for the report
    assert seen["health"] == 200 and seen["model"] == vllm_serve.SERVED_NAME
    assert seen["pids"] and os.getpid() not in seen["pids"]
    with pytest.raises(httpx.ConnectError):  # stopped with the measurement
        httpx.get(seen["url"] + "/health")
    with pytest.raises(ValueError, match="no quantized checkpoint"):
        evaluate.vllm_peer_speed(recipe, recipe.eval.peers[0], None, {}, False)


def test_the_kld_two_engines_may_differ_by_is_the_exports_own(tmp_path, tiny_model_dir, fake_vllm, monkeypatch):
    out = write_export(tmp_path / "export", tiny_model_dir, eval_summary={"kl_mean": 0.02})
    assert vllm_serve.kld_limit(out) == 0.02
    assert vllm_serve.kld_limit(write_export(tmp_path / "plain", tiny_model_dir)) == vllm_serve.KLD_FLOOR
    monkeypatch.setenv("FAKE_VLLM_FLIP", "0")
    monkeypatch.setattr(vllm_serve, "_teacher_forced_kld", lambda *a: (0.03, 0.9))  # more than the export's own
    res = verify_export(out, load=False, target="vllm-cpu")
    assert not res.ok and any("over 0.0200, the export's own" in p for p in res.problems)
    monkeypatch.setattr(vllm_serve, "_teacher_forced_kld", lambda *a: (0.01, 0.9))  # rounding: under it
    assert verify_export(out, load=False, target="vllm-cpu").ok
