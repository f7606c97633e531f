from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from accel.cli import app
from accel.recipe import Recipe, RecipeError, dump_recipe, load_recipe, parse_recipe, recipe_json_schema

ROOT = Path(__file__).resolve().parents[1]


def test_three_line_recipe_gets_defaults():
    r = parse_recipe({"name": "demo", "model": {"path": "smollm2-135m"}})
    assert r.name == "demo"
    assert r.quantization.budget.max_mean_kl == 0.005  # default budget: within Q8_0's KLD
    assert r.runtime.block_size == 16
    assert r.run_dir() == Path("runs/demo")


def test_round_trip_load_dump_load(tmp_path):
    r = parse_recipe({
        "name": "rt", "model": {"path": "smollm2-135m"}, "calibration": {"allocation": "weights", "weights": {"code": 2.0, "chat": 1.0}},
        "quantization": {"budget": {"target_avg_bits": 5.0}, "overrides": {r"layers\.0\.": "fp16"}},
        "speculation": {"method": "draft", "draft_model": "some/folder", "num_speculative_tokens": 3},
        "eval": {"workloads": [{"name": "w", "prompt_tokens": [8, 64], "output_tokens": [4, 4], "concurrency": 2}]},
    })
    p = tmp_path / "r.yaml"
    p.write_text(dump_recipe(r))
    r2 = load_recipe(p)
    assert r2 == r
    assert dump_recipe(r2) == dump_recipe(r)
    assert r2.quantization.budget.max_mean_kl is None and r2.quantization.budget.target_avg_bits == 5.0


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_are_valid(path):
    assert isinstance(load_recipe(path), Recipe)


BROKEN = [
    # (recipe, substrings the error must contain)
    ({"export": {"target": "vllm-cpu"}}, ["export.target vllm-cpu", "'int8'", "lm_head 'int8'", "['int4', 'w8a8', 'fp16']"]),
    ({"export": {"target": "vllm-cpu"}, "quantization": {"candidates": ["int4", "fp16"], "lm_head": "fp16",
                                                         "overrides": {"down_proj": "int4f"}}}, ["['int4f']"]),
    ({"quantizaton": {}}, ["quantizaton", "unknown field", "did you mean 'quantization'"]),
    ({"eval": {"peers": [{"name": "v", "vllm": "export"}]}}, ["eval.peers.0.vllm", "'base' or 'quantized'"]),
    ({"eval": {"peers": [{"name": "v", "vllm": "base", "url": "http://x"}]}}, ["both a url and vllm"]),
    ({"quantization": {"int4_group_size": 100}}, ["quantization.int4_group_size", "100", "32, 64 or 128"]),
    ({"quantization": {"candidates": ["int3"]}}, ["quantization.candidates.0", "int3", "allowed: int4, w4a8, int4f, int5, int8, w8a8, int8g, fp16"]),
    ({"quantization": {"budget": {"max_mean_kl": 0.1, "target_avg_bits": 5}}},
     ["quantization.budget", "exactly one budget"]),
    ({"quantization": {"budget": {"max_mean_kl": -1}}}, ["quantization.budget.max_mean_kl", "-1", "greater than 0"]),
    ({"eval": {"repeats": 0}}, ["eval.repeats", "0", "greater than or equal to 1"]),
    ({"quantization": {"overrides": {"(": "int8"}}}, ["quantization.overrides", "not a valid regex"]),
    ({"calibration": {"num_samples": "many"}}, ["calibration.num_samples", "'many'", "integer"]),
    ({"calibration": {"num_samples": 0}}, ["calibration.num_samples", "greater than or equal to 1"]),
    ({"calibration": {"length_buckets": [256, 64]}}, ["calibration.length_buckets", "strictly increasing"]),
    ({"calibration": {"allocation": "weights"}}, ["calibration", "needs calibration.weights"]),
    ({"speculation": {"method": "draft"}}, ["speculation", "needs draft_model"]),
    ({"speculation": {"method": "medusa"}}, ["speculation.method", "medusa", "'ngram'"]),
    ({"speculation": {"num_speculative_tokens": 99}}, ["speculation.num_speculative_tokens", "99", "16"]),
    ({"speculation": {"ngram_min_n": 5, "ngram_max_n": 2}}, ["speculation.ngram_min_n", "ngram_min_n=5, ngram_max_n=2 are invalid", "ngram_min_n <= ngram_max_n"]),
    ({"speculation": {"distill": {"model_written_fraction": 1.5}}},
     ["speculation.distill.model_written_fraction", "1.5", "less than or equal to 1"]),
    ({"speculation": {"disable_above_batch_size": "sometimes"}},
     ["speculation.disable_above_batch_size", "sometimes", "'auto'"]),
    ({"speculation": {"distill": {"chain_weight": 0.5}}},
     ["speculation.distill.chain_weight", "unknown field", "model_written_fraction"]),
    ({"speculation": {"distill": {"kind": "layers", "init_from": "runs/x"}}},
     ["speculation.distill", "init_from is set with kind 'layers'", "kind eagle only"]),
    ({"speculation": {"distill": {"gen_fraction": 1.0}}},
     ["speculation.distill.gen_fraction", "1.0", "less than or equal to 0.95"]),
    ({"speculation": {"draft_min_path_confidence": 1.5}},
     ["speculation.draft_min_path_confidence", "1.5", "in (0, 1)"]),
    ({"speculation": {"draft_context_window": 0}}, ["speculation.draft_context_window", "unknown field"]),
    ({"speculation": {"method": "ngram", "draft_ngram_first": True}},
     ["speculation.draft_ngram_first", "needs a draft model", "'ngram'"]),
    ({"runtime": {"block_size": 0}}, ["runtime.block_size", "block_size=0 is invalid", ">= 1"]),
    ({"runtime": {"max_num_seqs": 0}}, ["runtime.max_num_seqs", "max_num_seqs=0 is invalid", ">= 1"]),
    ({"runtime": {"num_scheduler_steps": 0}}, ["runtime.num_scheduler_steps", ">= 1"]),
    ({"eval": {"workloads": [{"name": "w", "prompt_tokens": [10, 5]}]}}, ["eval.workloads.0", "min <= max"]),
    ({"eval": {"variants": ["turbo"]}}, ["eval.variants.0", "turbo"]),
    ({"gates": {"min_top1_agreement": 1.5}}, ["gates.min_top1_agreement", "1.5", "less than or equal to 1"]),
    ({"name": "has space"}, ["name", "has space", "pattern"]),
    ({"model": {"path": "smollm2-135m", "dtype": "float8"}}, ["model.dtype", "float8"]),
    ({"model": {"path": ""}}, ["model.path", "at least 1 character"]),
    ({"model": {}}, ["model.path", "Field required"]),
    ({"quantization": {"candidates": ["int8", "fp16"], "budget": {"target_avg_bits": 4.0}}},
     ["budget.target_avg_bits 4.0 is unreachable", "int8", "allowed: >= 8"]),
    ({"quantization": {"int4_group_size": 32, "budget": {"target_avg_bits": 4.5}}},
     ["budget.target_avg_bits 4.5 is unreachable", "allowed: >= 4.625"]),
    ({"quantization": {"int4_group_size": [32, 32]}}, ["quantization.int4_group_size", "without repeats", "[32, 32]"]),
    ({"quantization": {"int4_group_size": []}}, ["quantization.int4_group_size", "non-empty list"]),
    ({"quantization": {"int4_group_size": [32, 100]}}, ["quantization.int4_group_size", "100", "32, 64 or 128"]),
    (["not", "a", "mapping"], ["must be a mapping"]),
]
BASE = {"name": "x", "model": {"path": "smollm2-135m"}}


@pytest.mark.parametrize("data,expected", BROKEN, ids=[str(i) for i in range(len(BROKEN))])
def test_broken_recipes_name_path_value_and_allowed(data, expected):
    with pytest.raises(RecipeError) as ei:
        parse_recipe({**BASE, **data} if isinstance(data, dict) else data)
    msg = str(ei.value)
    for s in expected:
        assert s in msg, f"{s!r} not in {msg!r}"


def test_every_problem_is_listed():
    with pytest.raises(RecipeError) as ei:
        parse_recipe({**BASE, "runtime": {"max_num_seqs": 0}, "speculation": {"num_speculative_tokens": 99},
                      "modle": {}})
    assert len(ei.value.problems) == 3


@pytest.mark.parametrize("data,expected", [
    (None, "the recipe is empty"),
    ({}, "name: Field required"),
    ({"model": {"path": "smollm2-135m"}}, "name: Field required"),
    ({"name": "x"}, "model: Field required"),
])
def test_empty_recipe_and_missing_name_or_model_are_errors_not_defaults(data, expected):
    with pytest.raises(RecipeError, match=expected):
        parse_recipe(data)


def test_binary_recipe_file_is_a_one_line_problem(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    with pytest.raises(RecipeError, match="not a text file: byte 0 is not UTF-8"):
        load_recipe(p)


def test_bad_yaml_and_missing_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(p)
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_schema_lists_sections():
    schema = recipe_json_schema()
    assert set(schema["properties"]) >= {"model", "calibration", "quantization", "speculation", "runtime", "eval",
                                         "export", "gates"}
    assert schema["additionalProperties"] is False


runner = CliRunner()


def test_cli_recipe_check_broken_exits_2(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "quantization": {"int4_group_size": 100}}))
    res = runner.invoke(app, ["recipe", "check", str(p)])
    assert res.exit_code == 2
    assert "quantization.int4_group_size" in res.output and "100" in res.output


def test_cli_recipe_check_ok_and_show():
    res = runner.invoke(app, ["recipe", "check", str(ROOT / "recipes" / "default.yaml"), "--show"])
    assert res.exit_code == 0, res.output
    assert "block_size: 16" in res.output


def test_cli_optimize_broken_recipe_fails_before_work(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nruntime: {blok_size: 16}\n")
    res = runner.invoke(app, ["optimize", str(p)])
    assert res.exit_code == 2
    assert "runtime.blok_size" in res.output and "block_size" in res.output
    assert not (tmp_path / "runs").exists()


def test_distill_prompt_count_scales_with_a_longer_eagle_budget():
    from accel.recipe import DistillConfig, default_num_prompts

    assert DistillConfig().resolved("num_prompts") == 1200  # 30 minutes: the default
    assert DistillConfig(time_budget_minutes=5).resolved("num_prompts") == 1200
    assert DistillConfig(time_budget_minutes=80).resolved("num_prompts") == 3200
    assert DistillConfig(time_budget_minutes=80, num_prompts=10).resolved("num_prompts") == 10  # as given
    assert DistillConfig(kind="layers", time_budget_minutes=80).resolved("num_prompts") == 256
    assert default_num_prompts("eagle", 120) == 4800
    assert DistillConfig().resolved("learning_rate") == 1e-3


def test_lm_head_group_size_applies_to_an_int8g_head_only():
    from accel.recipe import Recipe

    base = {"name": "x", "model": {"path": "m"}}
    ok = Recipe.model_validate({**base, "quantization": {"lm_head": "int8g", "lm_head_group_size": 128}})
    assert ok.quantization.lm_head_group_size == 128
    with pytest.raises(ValueError, match="lm_head_group_size 64 applies to an int8g lm_head only; lm_head is 'int8'"):
        Recipe.model_validate({**base, "quantization": {"lm_head": "int8", "lm_head_group_size": 64}})


def test_a_vllm_cpu_export_plans_with_what_its_kernels_run():
    from accel.quant.plan import joining_candidates, table_scheme
    from tests.conftest import make_tiny_llama

    r = parse_recipe({"name": "x", "model": {"path": "smollm2-135m"}, "export": {"target": "vllm-cpu"},
                      "quantization": {"candidates": ["int4", "fp16"], "lm_head": "fp16"}})
    assert r.export.target == "vllm-cpu"
    model = make_tiny_llama(tie_word_embeddings=True)
    assert joining_candidates(model, ["int4", "fp16"], 32, "vllm-cpu") == (["int4", "fp16"], {})  # no int4f
    assert table_scheme(True, r.quantization.model_copy(update={"lm_head": "int8"}), "vllm-cpu") == "fp16"
