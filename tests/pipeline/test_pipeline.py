"""`accel optimize` end to end on a tiny random Llama: every stage, reuse, partial reruns, gates, crashes, export."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from accel.recipe import parse_recipe
from tests.conftest import save_tiny_model

STAGES = ["load", "calibrate", "sensitivity", "plan", "quantize", "draft", "evaluate", "gates", "report", "export"]


def tiny_recipe(model_dir, out_dir, **sections) -> dict:
    data = {
        "name": "tiny", "output_dir": str(out_dir), "model": {"path": str(model_dir)},
        "calibration": {"num_samples": 16, "max_seq_len": 64, "length_buckets": [64]},
        "quantization": {"method": "rtn", "candidates": ["int4", "int8", "fp16"], "int4_group_size": 32,
                         "budget": {"max_mean_kl": 0.05},
                         "sensitivity": {"metric": "kl", "num_samples": 4, "max_seq_len": 64}},
        "speculation": {"method": "ngram"},
        "runtime": {"num_kv_blocks": 64},
        "eval": {"domains": ["prose", "code"], "window": 64, "max_windows_per_domain": 1, "tasks": False,
                 "workloads": [
                     {"name": "batch1", "num_requests": 2, "prompt_tokens": [8, 16], "output_tokens": [8, 8],
                      "concurrency": 1}]},
    }
    for k, v in sections.items():
        data[k] = {**data[k], **v} if isinstance(data.get(k), dict) else v
    return data


def _run(data, **kw):
    from accel.pipeline.optimize import optimize

    events = []
    t0 = time.perf_counter()
    try:
        records = optimize(parse_recipe(data), on_event=lambda kind, st, rec: events.append((kind, st.name)), **kw)
    finally:
        elapsed = time.perf_counter() - t0
    return records, events, elapsed


@pytest.fixture(scope="module")
def small_eval():
    import accel.pipeline.evaluate as pe

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pe, "SPEC_EVAL_PROMPTS", 2)
        mp.setattr(pe, "SPEC_EVAL_NEW_TOKENS", 16)
        yield


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, small_eval):
    root = tmp_path_factory.mktemp("pipeline")
    model_dir = save_tiny_model(root / "tiny-model")
    data = tiny_recipe(model_dir, root / "runs")
    records, events, elapsed = _run(data)
    return data, records, elapsed


def test_first_run_writes_every_stage(first_run):
    data, records, _ = first_run
    assert list(records) == STAGES
    assert all(r.status == "ran" for r in records.values())
    run = parse_recipe(data).run_dir()
    for f in ("model.json", "calibration.jsonl", "sensitivity.json", "plan.json", "checkpoint_quantized", "draft.json",
              "eval.json", "gates.json", "report.html", "report.md", "checkpoint/accel.json", "manifest.json"):
        assert (run / f).exists(), f
    assert not list(run.glob(".stage-*"))
    # the quantize stage states the whole file's bits per parameter (table, scales, norms: more than the Linears')
    file_bits = records["quantize"].summary["file_bits"]
    assert 0 < file_bits < 32 and file_bits > records["plan"].summary["avg_bits"] - 1
    summary = json.loads((run / "eval.json").read_text())["summary"]
    for k in ("kl_mean", "top1", "ppl_base", "ppl_quant", "ppl_increase_pct", "speedup_batch1", "tok_s_batch1_base",
              "tok_s_batch1_quant", "acceptance_rate", "mean_acceptance_length"):
        assert summary[k] is not None, k
    ev = json.loads((run / "eval.json").read_text())
    assert [v["name"] for v in ev["variants"]] == ["baseline", "quantized", "quantized+spec"]
    assert ev["variants"][2]["spec"]["num_draft_tokens"] > 0
    # the speculative variant is measured through the speculating engine, like the others
    assert ev["variants"][2]["speed"]["batch1"]["output_throughput"] > 0


def test_export_verifies_and_carries_the_run(first_run):
    from accel.export import verify_export

    data, _, _ = first_run
    ck = parse_recipe(data).run_dir() / "checkpoint"
    res = verify_export(ck)
    assert res.ok, res.problems
    manifest = json.loads((ck / "accel.json").read_text())
    assert manifest["quantization_format"] == "compressed-tensors"
    assert manifest["plan"]["schemes"] and manifest["eval"]["kl_mean"] is not None
    draft = manifest["draft"]  # n-gram: the pairing and vLLM's equivalent, no draft model to ship
    assert draft["method"] == "ngram" and "path" not in draft and draft["measured"]["acceptance_rate"] is not None
    assert draft["vllm_speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    qcfg = json.loads((ck / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "compressed-tensors" and qcfg["config_groups"]
    assert (ck / "generation_config.json").is_file() and (ck / "tokenizer.json").is_file()


def test_export_greedy_agrees_in_transformers_and_accel_runtime(first_run):
    from accel.export import verify_export
    from accel.export.load import load_engine
    from accel.runtime.sampling_params import SamplingParams

    data, _, _ = first_run
    ck = parse_recipe(data).run_dir() / "checkpoint"
    prompts = ["The quick brown fox", "def add(a, b):", "What is the capital of France?"]
    hf = verify_export(ck, prompts=prompts).details["greedy"]
    engine = load_engine(ck, num_kv_blocks=64)
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0))
    for h, o in zip(hf, outs):
        n = min(len(h), len(o.token_ids))
        assert n > 0 and o.token_ids[:n] == h[:n]


def test_second_run_reuses_every_stage(first_run, small_eval):
    data, _, _ = first_run
    records, events, _ = _run(data)  # no wall-time assertion: reuse is what the stages record, not a timing
    assert all(r.status == "reused" for r in records.values())
    assert [k for k, _ in events] == ["reused"] * len(STAGES)


def test_changed_gates_rerun_only_dependants_and_block_export(first_run, small_eval):
    from accel.pipeline.optimize import GateFailed

    data, _, _ = first_run
    blocked = {**data, "gates": {"min_speedup": 1000.0, "max_mean_kl": 10.0}}
    with pytest.raises(GateFailed, match=r"min_speedup: measured .*, limit 1000"):
        _run(blocked)
    run = parse_recipe(data).run_dir()
    gates = json.loads((run / "gates.json").read_text())
    assert gates["failed"] == ["min_speedup"] and gates["checked"]["max_mean_kl"]["ok"]
    assert "FAIL" in (run / "report.md").read_text()
    # override: the same numbers, exported anyway; upstream of gates is reused
    records, _, _ = _run({**data, "gates": {**blocked["gates"], "override": True}})
    status = {n: r.status for n, r in records.items()}
    assert all(status[s] == "reused" for s in STAGES[:7])
    assert status["export"] == "ran"
    manifest = json.loads((run / "checkpoint" / "accel.json").read_text())
    assert manifest["eval"]["gates"]["failed"] == ["min_speedup"]
    # back to the original recipe: only gates-dependent stages rerun
    records, _, _ = _run(data)
    status = {n: r.status for n, r in records.items()}
    assert all(status[s] == "reused" for s in STAGES[:7]) and status["gates"] == "ran"


def test_a_vllm_target_blocks_an_export_vllm_cannot_load(first_run, small_eval):
    from accel.pipeline.optimize import GateFailed

    data, _, _ = first_run
    # a 16-bit lm_head: the table's scheme then does not depend on the target, and the plan is the same for both
    q = {**data["quantization"], "candidates": ["int4f", "fp16"], "budget": {"max_mean_kl": 10.0}, "lm_head": "fp16"}
    int4f = {**data, "name": "tiny-int4f", "quantization": q, "export": {"target": "vllm"}}
    with pytest.raises(GateFailed, match=r"loader: vllm cannot load \d+ layers, e.g. .*float zero points"):
        _run(int4f)
    gates = json.loads((parse_recipe(int4f).run_dir() / "gates.json").read_text())
    assert gates["failed"] == ["loader"] and gates["checked"]["loader"]["refused"]
    records, _, _ = _run({**int4f, "export": {"target": "transformers"}})  # transformers loads int4f
    assert records["gates"].status == "ran" and records["quantize"].status == "reused"
    manifest = json.loads((parse_recipe(int4f).run_dir() / "checkpoint" / "accel.json").read_text())
    assert manifest["loaders"]["transformers"]["loads"] and not manifest["loaders"]["vllm"]["loads"]


def test_crash_mid_stage_leaves_no_half_written_output(first_run, small_eval, monkeypatch):
    import accel.pipeline.optimize as pipeline

    data, _, _ = first_run
    run = parse_recipe(data).run_dir()
    before = (run / "report.md").read_text()

    def crashing_report(ctx):
        (ctx.out_dir / "report.md").write_text("half")
        raise KeyboardInterrupt

    changed = {**data, "name": data["name"], "eval": data["eval"]}
    monkeypatch.setattr(pipeline, "stage_report", crashing_report)
    with pytest.raises(KeyboardInterrupt):
        _run(changed, force=("report",))
    assert (run / "report.md").read_text() == before
    assert not list(run.glob(".stage-*"))
    monkeypatch.undo()
    records, _, _ = _run(changed, force=("report",))
    assert records["report"].status == "ran" and records["export"].status == "reused"


def test_cli_bad_recipe_and_bad_force_exit_2_before_work(tmp_path):
    from typer.testing import CliRunner

    from accel.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "output_dir": str(tmp_path / "runs"), "quantisation": {}}))
    r = CliRunner().invoke(app, ["optimize", str(bad)])
    assert r.exit_code == 2 and "quantisation" in r.output
    assert not (tmp_path / "runs").exists()
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text(yaml.safe_dump({"name": "x", "output_dir": str(tmp_path / "runs"),
                                       "model": {"path": str(tmp_path / "nowhere")}}))
    r = CliRunner().invoke(app, ["optimize", str(nowhere)])
    assert r.exit_code == 2 and "model.path" in r.output and "not found" in r.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"name": "x", "output_dir": str(tmp_path / "runs"),
                                    "model": {"path": str(save_tiny_model(tmp_path / "tiny"))}}))
    r = CliRunner().invoke(app, ["optimize", str(good), "--force", "nope"])
    assert r.exit_code == 2 and "no such stage" in r.output
    assert not (tmp_path / "runs").exists()


def test_cli_optimize_reports_failed_gate_with_exit_1(first_run, small_eval, tmp_path):
    from typer.testing import CliRunner

    from accel.cli import app

    data, _, _ = first_run
    f = tmp_path / "gated.yaml"
    f.write_text(yaml.safe_dump({**data, "gates": {"min_speedup": 1000.0}}))
    r = CliRunner().invoke(app, ["optimize", str(f)])
    assert r.exit_code == 1, r.output
    assert "gates failed" in r.output and "min_speedup" in r.output
    log = parse_recipe(data).run_dir() / "log.txt"  # other libraries' output, kept out of the terminal
    assert log.exists() and "log.txt:" in r.output
    r = CliRunner().invoke(app, ["optimize", str(f), "--override-gates"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["export", "run", str(parse_recipe(data).run_dir())])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["quantize", str(f)])  # load .. quantize only, all reused
    assert r.exit_code == 0, r.output
    assert "quantize" in r.output and "reused" in r.output and "evaluate" not in r.output


@pytest.mark.parametrize("kind", ["eagle", "layers"])
def test_distilled_draft_without_quantization_is_exported_beside_the_weights(tmp_path, small_eval, kind):
    from accel.export import verify_export
    from accel.speculative.eagle import is_eagle_draft

    model_dir = save_tiny_model(tmp_path / "tiny-model")
    data = tiny_recipe(model_dir, tmp_path / "runs", name="tiny-distilled",
                       speculation={"method": "distilled", "num_speculative_tokens": 3,
                                    "distill": {"kind": kind, "num_layers": 1, "time_budget_minutes": 0.5,
                                                "num_prompts": 4, "max_new_tokens": 8,
                                                "model_written_fraction": 0.25}},
                       eval={"speed": False, "variants": ["baseline", "baseline+spec"]})
    data["name"] = "tiny-distilled"
    data["quantization"] = {"enabled": False}
    records, _, _ = _run(data)
    assert "quantize" not in records and records["export"].status == "ran"
    ck = parse_recipe(data).run_dir() / "checkpoint"
    assert (ck / "draft" / "config.json").is_file()
    res = verify_export(ck)
    assert res.ok, res.problems
    manifest = json.loads((ck / "accel.json").read_text())
    assert manifest["quantization_format"] == "none"
    assert manifest["draft"]["path"] == "draft" and manifest["draft"]["method"] == "distilled"
    assert manifest["draft"]["kind"] == kind and is_eagle_draft(ck / "draft") == (kind == "eagle")
    assert manifest["draft"]["measured"]["num_draft_tokens"] > 0
    assert any(f.startswith("draft/") for f in manifest["files"])
    train = json.loads((parse_recipe(data).run_dir() / "draft.json").read_text())["train"]
    assert (kind == "eagle") == ("num_model_written_prompts" in train) == ("heldout_second" in train)


@pytest.mark.parametrize("method", ["gptq", "rtn"])
def test_the_sensitivity_of_a_gptq_recipe_measures_gptqs_int4(tmp_path, method, monkeypatch):
    """A GPTQ recipe's INT4 damage is measured on the weights GPTQ makes (layer-wise), RTN's otherwise."""
    from pathlib import Path

    from accel.pipeline import optimize as opt
    from accel.pipeline.stages import StageContext
    from accel.quant.sensitivity import SensitivityResult

    model_dir = save_tiny_model(tmp_path / "tiny-model")
    data = tiny_recipe(model_dir, tmp_path / "runs", quantization={"method": method})
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(recipe=parse_recipe(data), run_dir=out, out_dir=out, summaries={}, state={})
    calls = []
    real = opt.gptq_int4_weights
    monkeypatch.setattr(opt, "gptq_int4_weights", lambda *a: calls.append(r := real(*a)) or r)
    summary = opt.stage_sensitivity(ctx)
    assert summary["int4_quantizer"] == ("gptq (layer-wise)" if method == "gptq" else "rtn")
    sens = SensitivityResult.from_json(Path(out) / "sensitivity.json")
    if method == "rtn":
        assert calls == []
        return
    (given,) = calls
    assert set(given) == {"int4"} and set(given["int4"]) == {m for ms in sens.unit_map().values() for m in ms}
    # the damage measured is that of GPTQ's weights: the same measurement with them given reproduces it
    from accel.quant.plan import token_batches
    from accel.quant.sensitivity import measure_sensitivity

    q = ctx.recipe.quantization
    batches = token_batches(opt.calibration_draw(ctx).train, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    rtn = measure_sensitivity(opt.fresh_model(ctx), batches, sens.candidates, 32, q.sensitivity.metric, False)
    assert any(abs(sens.damage[u]["int4"] - rtn.damage[u]["int4"]) > 1e-3 * rtn.damage[u]["int4"]
               for u in sens.damage)
    assert all(sens.damage[u]["int8"] == pytest.approx(rtn.damage[u]["int8"], rel=1e-6) for u in sens.damage)


def test_scale_tuning_runs_in_the_quantize_stage_and_keys_it(tmp_path):
    """`quantization.scale_tuning_steps` tunes the quantized model's scales inside the quantize stage (its summary
    says so) and is part of that stage's key, not the plan's."""
    model_dir = save_tiny_model(tmp_path / "tiny-model")
    data = tiny_recipe(model_dir, tmp_path / "runs", quantization={"budget": {"target_avg_bits": 6.0}})
    records, _, _ = _run(data, until="quantize")
    assert records["quantize"].summary["scale_tuning"] is None
    tuned = tiny_recipe(model_dir, tmp_path / "runs", quantization={"budget": {"target_avg_bits": 6.0},
                                                                    "scale_tuning_steps": 3})
    records, _, _ = _run(tuned, until="quantize")
    assert [records[s].status for s in ("sensitivity", "plan", "quantize")] == ["reused", "reused", "ran"]
    summary = records["quantize"].summary["scale_tuning"]
    assert summary["steps"] == 3 and summary["linears"] > 0 and summary["loss_first"] > 0
    assert summary["rows"] == 3 * 4  # distinct rows, one per read, from the draw and the units it left unused


def test_optimize_refuses_a_memory_limit_it_cannot_fit_and_runs_within_one_it_can(tmp_path):
    """ACCEL_MEMORY_LIMIT (or a cgroup) is checked before any stage runs: over it, one line with the numbers and
    nothing started; under one that fits, the whole run (every stage's peak RSS, measured) stays within it."""
    import os
    import subprocess
    import sys

    model_dir = save_tiny_model(tmp_path / "tiny-model")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(model_dir, tmp_path / "runs")))

    def run(limit):
        env = {**os.environ, "ACCEL_MEMORY_LIMIT": limit}
        return subprocess.run([sys.executable, "-m", "accel", "optimize", str(recipe)], capture_output=True,
                              text=True, env=env, timeout=900)

    refused = run("50M")
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr
    assert "accel optimize of tiny-model needs" in err and "fp32 model" in err and "ACCEL_MEMORY_LIMIT=50M allows" in err
    assert "Traceback" not in refused.stderr and not (tmp_path / "runs" / "tiny" / "manifest.json").exists()
    fits = run("3G")
    assert fits.returncode == 0, fits.stderr[-2000:]
    stages = json.loads((tmp_path / "runs" / "tiny" / "manifest.json").read_text())["stages"]
    assert list(stages) == STAGES
    peaks = [s["peak_rss_gb"] for s in stages.values()]
    assert all(p is not None for p in peaks) and max(peaks) <= 3 * (1 << 30) / 1e9
    assert f"{max(peaks):.2f}" in fits.stdout  # the summary table's total row


def test_memory_need_is_the_fp32_model_plus_the_largest_stage_working_set(tmp_path):
    from transformers import AutoModelForCausalLM

    from accel.pipeline.optimize import memory_need

    model_dir = save_tiny_model(tmp_path / "tiny-model")
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    data = tiny_recipe(model_dir, tmp_path / "runs")
    need = memory_need(parse_recipe(data))
    assert need.parts["fp32 model"] == 4 * params
    longer = memory_need(parse_recipe(tiny_recipe(model_dir, tmp_path / "runs",
                                                  calibration={"max_seq_len": 4096, "num_samples": 16})))
    assert longer.parts["working set"] > need.parts["working set"] > 0
    proxy = memory_need(parse_recipe(tiny_recipe(model_dir, tmp_path / "runs", quantization={
        "sensitivity": {"metric": "proxy", "num_samples": 4, "max_seq_len": 4096}})))
    kl = memory_need(parse_recipe(tiny_recipe(model_dir, tmp_path / "runs", quantization={
        "sensitivity": {"metric": "kl", "num_samples": 4, "max_seq_len": 4096}})))
    assert proxy.parts["working set"] > kl.parts["working set"]  # gradients through every layer


def test_a_stages_fresh_model_is_transformers_model_read_into_its_own_memory(tmp_path):
    """fresh_model reads the folder a module at a time (no mapped file whose read pages would stay in RSS beside the
    tensors GPTQ writes): the same model as transformers' from_pretrained, parameter for parameter."""
    import torch
    from transformers import AutoModelForCausalLM

    from accel.pipeline import optimize as opt
    from accel.pipeline.stages import StageContext

    model_dir = save_tiny_model(tmp_path / "tiny-model")
    ctx = StageContext(recipe=parse_recipe(tiny_recipe(model_dir, tmp_path / "runs")), run_dir=tmp_path,
                       out_dir=tmp_path, summaries={}, state={})
    ours = opt.fresh_model(ctx)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert type(ours) is type(ref) and not ours.training
    assert str(ours.config.name_or_path) == str(model_dir)  # llm-compressor re-reads the folder from here
    mine, theirs = ours.state_dict(), ref.state_dict()
    assert mine.keys() == theirs.keys()
    for k in theirs:
        assert mine[k].dtype == torch.float32 and torch.equal(mine[k], theirs[k]), k
    ids = torch.randint(3, 200, (2, 12))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ref(ids).logits)
