"""What the disk can tell about a recipe is refused before any work, by `recipe check` and by `optimize` (exit 2,
the field path named, no traceback, no run folder)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from accel.cli import app
from accel.preflight import preflight
from accel.recipe import parse_recipe
from tests.conftest import save_tiny_model

runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # hidden 64, intermediate 128: group 128 does not divide the 64-wide inputs
    return save_tiny_model(tmp_path_factory.mktemp("pre") / "tiny")


def _recipe(model_dir, tmp_path, **sections):
    return {"name": "pre", "output_dir": str(tmp_path / "runs"), "model": {"path": str(model_dir)}, **sections}


def _cases(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "binary.jsonl").write_bytes(b"\x00\xff\xfe\x00")
    (tmp_path / "list.json").write_text('{"text": "an object, not a list"}')
    (tmp_path / "not_eagle").mkdir()
    return [
        ({"model": {"path": str(tmp_path / "nowhere")}}, ["model.path", "nowhere", "not found", "registry name"]),
        ({"model": {"path": str(tmp_path)}}, ["model.path", "neither a Hugging Face folder"]),
        ({"calibration": {"source": str(tmp_path / "missing.jsonl")}},
         ["calibration.source", "missing.jsonl", "does not exist"]),
        ({"calibration": {"source": str(tmp_path / "notes.txt")}},
         ["calibration.source", "notes.txt", "is not a data file", ".jsonl, .json, .parquet"]),
        ({"calibration": {"source": str(tmp_path / "binary.jsonl")}}, ["calibration.source", "binary.jsonl"]),
        ({"calibration": {"source": str(tmp_path / "list.json")}}, ["calibration.source", "must hold a list"]),
        ({"calibration": {"source": "hf:no/such/dataset"}}, ["calibration.source", "not a local folder or file"]),
        ({"calibration": {"domains": ["klingon"]}}, ["calibration.source", "klingon", "available domains"]),
        ({"quantization": {"candidates": ["int4", "int8", "fp16"], "int4_group_size": 128}},
         ["quantization.int4_group_size", "128", "does not divide", "allowed here: [32, 64]"]),
        ({"quantization": {"int4_group_size": [32, 128]}},
         ["quantization.int4_group_size", "128", "does not divide", "allowed here: [32, 64]"]),
        ({"quantization": {"candidates": ["int8", "fp16"], "overrides": {"q_proj": "fp16"},
                           "budget": {"target_avg_bits": 8.2}}},
         ["quantization.budget.target_avg_bits", "8.2", "unreachable", "cheapest plan averages"]),
        ({"quantization": {"table": "int4"}}, ["quantization.table 'int4'", "allowed:"]),
        ({"speculation": {"method": "draft", "draft_model": str(tmp_path / "no-draft")}},
         ["speculation.draft_model", "no-draft", "not found"]),
        ({"quantization": {"candidates": ["int4"], "int4_group_size": 32, "budget": {"max_mean_kl": 0.01}}},
         ["quantization.budget", "one scheme (int4)", "nothing to allocate"]),
        ({"calibration": {"num_samples": 4}}, ["quantization.budget", "num_samples=4", "holds none out"]),
        ({"speculation": {"method": "distilled", "distill": {"init_from": str(tmp_path / "not_eagle")}}},
         ["speculation.distill.init_from", "not_eagle", "accel_draft.json and model.safetensors"]),
        ({"quantization": {"enabled": False}, "eval": {"peers": [{"name": "v", "vllm": "quantized"}]}},
         ["eval.peers[0].vllm", "setup_vllm_cpu.sh", "quantization.enabled is false; allowed: base"]),
    ]


def test_each_disk_problem_is_named_with_its_field(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_VLLM_CPU_PYTHON", str(tmp_path / "no-venv" / "python"))
    for sections, expected in _cases(tmp_path):
        problems = preflight(parse_recipe(_recipe(model_dir, tmp_path, **sections)))
        text = "\n".join(problems)
        assert problems, sections
        for s in expected:
            assert s in text, f"{s!r} not in {text!r} ({sections})"


def test_a_good_recipe_has_no_problems(model_dir, tmp_path):
    good = _recipe(model_dir, tmp_path, quantization={"int4_group_size": 32, "budget": {"target_avg_bits": 5.0}})
    assert preflight(parse_recipe(good)) == []


def test_recipe_check_and_optimize_exit_2_before_any_work(model_dir, tmp_path):
    for i, (sections, expected) in enumerate(_cases(tmp_path)):
        f = tmp_path / f"r{i}.yaml"
        f.write_text(yaml.safe_dump(_recipe(model_dir, tmp_path, **sections)))
        for cmd in (["recipe", "check", str(f)], ["optimize", str(f)]):
            res = runner.invoke(app, cmd)
            assert res.exit_code == 2, (cmd, res.output)
            assert expected[0] in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()


def test_library_optimize_runs_the_same_checks(model_dir, tmp_path):
    from accel.pipeline.optimize import optimize
    from accel.recipe import RecipeError

    bad = parse_recipe(_recipe(model_dir, tmp_path, calibration={"source": str(tmp_path / "gone.parquet")}))
    with pytest.raises(RecipeError, match="calibration.source"):
        optimize(bad)
    assert not (tmp_path / "runs").exists()


def test_a_real_eagle_draft_folder_passes(model_dir, tmp_path):
    d = tmp_path / "draft"
    d.mkdir()
    (d / "accel_draft.json").write_text(json.dumps({"method": "eagle"}))
    (d / "model.safetensors").write_bytes(b"")
    r = _recipe(model_dir, tmp_path, speculation={"method": "distilled", "distill": {"init_from": str(d)}})
    assert preflight(parse_recipe(r)) == []


def test_one_candidate_needs_no_budget_and_measures_nothing(model_dir, tmp_path):
    """The eleven-line recipe of one candidate: no problem before the run, and the sensitivity stage measures
    nothing (every unit gets the candidate), so no default budget can fail it after minutes of work."""
    from tests.conftest import make_tiny_llama

    recipe = parse_recipe(_recipe(model_dir, tmp_path, quantization={"candidates": ["int4"], "method": "rtn",
                                                                     "int4_group_size": 32},
                                  calibration={"num_samples": 16}))
    assert preflight(recipe) == []

    from accel.quant.plan import allocates
    from accel.quant.sensitivity import unmeasured

    assert not allocates(recipe.quantization)  # so the sensitivity stage writes `unmeasured` (no forward)
    sens = unmeasured(make_tiny_llama(), "int4", 32, "kl")
    assert sens.num_tokens == 0 and {tuple(d) for d in sens.damage.values()} == {("int4",)}


def test_a_budget_without_held_out_rows_fails_at_the_calibration_draw_not_after_sensitivity():
    from accel.quant.plan import holdout_problem
    from accel.recipe import QuantizationConfig

    class Unit:
        token_ids = list(range(10))
        domain = "chat"

    q = QuantizationConfig()
    assert "needs held-out calibration text" in holdout_problem([Unit(), Unit()], q)  # 20 tokens < one 256 row
    assert holdout_problem([Unit(), Unit()], QuantizationConfig(candidates=["int8"])) is None  # nothing to check
    assert holdout_problem([], QuantizationConfig(budget={"target_avg_bits": 6.0})) is None  # a size budget
