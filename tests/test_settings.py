"""One declaration per setting: the recipe, `accel serve`, `accel draft train`, the engine and the scheduler read
each default from the config class of the part it configures, and every value given reaches that part."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from accel.cli import app
from accel.recipe import DistillConfig, SpeculationConfig, parse_recipe
from accel.runtime.config import RuntimeConfig
from accel.runtime.engine import Engine, EngineConfig
from accel.runtime.scheduler import SchedulerConfig
from accel.speculative.config import SpeculativeConfig

runner = CliRunner()
RUNTIME_FIELDS = [f.name for f in dataclasses.fields(RuntimeConfig)]
# a value other than the default for every runtime setting (the device stays on the CPU this test runs on)
NON_DEFAULT = dict(device="cpu", block_size=8, num_kv_blocks=None, kv_cache_memory_gb=0.001, kv_cache_dtype="int8",
                   weight_dtype="float16", max_num_seqs=3, max_num_batched_tokens=96, max_waiting=7, max_wait_steps=9,
                   long_prefill_token_threshold=32, preemption_mode="swap", max_model_len=100,
                   enable_prefix_caching=False, num_threads=torch.get_num_threads(), num_scheduler_steps=2)


def _served(monkeypatch, args: list[str]) -> dict:
    """The keyword arguments `accel serve MODEL *args` hands to the server (nothing is served)."""
    import accel.server

    got = {}
    monkeypatch.setattr(accel.server, "run_server", lambda model, **kw: got.update(kw))
    res = runner.invoke(app, ["serve", "some-folder", *args])
    assert res.exit_code == 0, res.output
    return got


def test_the_recipe_the_server_the_engine_and_the_scheduler_share_every_default(monkeypatch):
    defaults = RuntimeConfig().runtime_fields()
    recipe = parse_recipe({"name": "x", "model": {"path": "m"}})
    served = _served(monkeypatch, [])
    from accel.pipeline.evaluate import engine_kwargs

    assert recipe.runtime.runtime_fields() == defaults
    assert {k: served[k] for k in RUNTIME_FIELDS} == defaults
    assert EngineConfig(model="m").runtime_fields() == defaults
    # what `optimize` evaluates with is what `serve` starts: the same EngineConfig from both
    assert EngineConfig(model="m", **engine_kwargs(recipe)) == EngineConfig(
        model="m", dtype="auto", **{k: served[k] for k in RUNTIME_FIELDS})
    assert SchedulerConfig().runtime.runtime_fields() == defaults  # the scheduler holds a RuntimeConfig
    assert NON_DEFAULT.keys() == defaults.keys()


def test_every_serve_option_is_a_runtime_field_and_reaches_the_server(monkeypatch):
    args = []
    for name, value in NON_DEFAULT.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            args += [flag, str(value)]
    served = _served(monkeypatch, args)
    assert {k: served[k] for k in RUNTIME_FIELDS} == NON_DEFAULT


SERVER_NON_DEFAULT = dict(host="0.0.0.0", port=8123, api_key="sk-x", served_model_name="m2", kv_pressure_threshold=0.5,
                          drain_timeout_s=3.0, allow_priority=True, protect_metrics=True, skip_verify=True,
                          log_level="debug")


def test_every_server_setting_is_a_serve_option_that_reaches_the_server(monkeypatch):
    from accel.server.config import ServerConfig

    assert SERVER_NON_DEFAULT.keys() == {f.name for f in dataclasses.fields(ServerConfig)}
    args = []
    for name, value in SERVER_NON_DEFAULT.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    assert _served(monkeypatch, args)["server"] == ServerConfig(**SERVER_NON_DEFAULT)
    assert _served(monkeypatch, [])["server"] == ServerConfig()
    # the key may come from the environment instead of the process list
    monkeypatch.setenv("ACCEL_API_KEY", "sk-env")
    assert _served(monkeypatch, [])["server"].api_key == "sk-env"
    # requests waiting before a 429 are the runtime's max_waiting: the server declares no limit of its own
    assert "max_waiting" in RUNTIME_FIELDS and not {"max_queue", "max_waiting"} & SERVER_NON_DEFAULT.keys()


def test_every_runtime_value_of_a_recipe_reaches_the_engine(tiny_model_dir):
    from accel.pipeline.evaluate import engine_kwargs

    from accel.kernels import cpu

    # fp16 weight panels need AVX-512: elsewhere the engine refuses them (tests/runtime/test_engine.py)
    values = NON_DEFAULT if cpu.has_avx512() else {**NON_DEFAULT, "weight_dtype": "auto"}
    recipe = parse_recipe({"name": "x", "model": {"path": str(tiny_model_dir), "dtype": "float32"},
                           "runtime": values})
    engine = Engine.from_pretrained(tiny_model_dir, **engine_kwargs(recipe))
    assert engine.config.runtime_fields() == values
    if cpu.has_avx512():
        assert engine.model.lm_head.packed.dtype == torch.float16
    # the scheduler and the runner read the engine's own RuntimeConfig, not copies of its fields
    assert engine.scheduler.config.runtime is engine.config and engine.runner.config.runtime is engine.config
    assert engine.scheduler.config.max_model_len == 100
    assert engine.kv.block_size == 8 and engine.kv.enable_prefix_caching is False
    assert engine.runner.config.runtime.kv_cache_dtype == "int8" and engine.runner.device.type == "cpu"
    from accel.runtime.model_runner import kv_bytes_per_block

    per_block = kv_bytes_per_block(engine.model, 8, "int8", torch.float32)
    assert engine.runner.config.num_blocks == int(0.001 * (1 << 30)) // per_block
    assert next(engine.model.parameters()).dtype == torch.float32


def test_every_speculation_value_of_a_recipe_reaches_the_engine_config():
    values = dict(num_speculative_tokens=7, ngram_min_n=1, ngram_max_n=3, draft_quantization="int4",
                  adaptive=False, disable_above_batch_size=9, max_step_rows=5, draft_min_path_confidence=0.3,
                  draft_min_first_confidence=0.2, draft_ngram_first=False)
    spec = SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled", **values), draft_dir="run/draft")
    assert spec == SpeculativeConfig(method="draft", draft_model="run/draft", **values)
    # the recipe's section is the engine's class: no field of its own but the method and the distillation
    own = {f.name for f in dataclasses.fields(SpeculationConfig)} - {f.name for f in dataclasses.fields(SpeculativeConfig)}
    assert own == {"distill"}


def test_draft_train_options_are_the_recipes_distill_fields(monkeypatch, tmp_path):
    import accel.draft_training
    import accel.hub

    got = {}
    monkeypatch.setattr(accel.hub, "resolve_model", lambda name, **kw: name)
    monkeypatch.setattr(accel.draft_training, "distill_draft",
                        lambda target, out, config, calibration_dir: got.update(config=config) or _Result())
    res = runner.invoke(app, ["draft", "train", "t", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert got["config"] == DistillConfig()
    res = runner.invoke(app, ["draft", "train", "t", "--out", str(tmp_path), "--time-budget-minutes", "5",
                              "--kind", "layers", "--no-train-head", "--layer-choice", "spread",
                              "--draft-vocab-size", "100"])
    assert res.exit_code == 0, res.output
    assert got["config"] == DistillConfig(time_budget_minutes=5, kind="layers", train_head=False,
                                          layer_choice="spread", draft_vocab_size=100)
    helptext = runner.invoke(app, ["draft", "train", "--help"], env={"COLUMNS": "300"}).output
    for name in DistillConfig.model_fields:
        assert "--" + name.replace("_", "-") in helptext, name


class _Result:
    out_dir = "d"
    draft_vocab_size = num_prompts = num_model_written_prompts = num_train_positions = num_steps = num_layers = 1
    vocab_coverage = heldout_top1 = heldout_second = 0.5
    layer_ids = [0]
    losses = [1.0]


@pytest.mark.parametrize("config", [RuntimeConfig, SpeculativeConfig])
def test_every_setting_has_a_description(config):
    from accel.cli.options import config_fields

    assert all(description for _, _, _, description in config_fields(config))


def test_three_lines_are_the_default_recipe():
    """The schema's defaults are the default recipe's measured choices: a recipe of a name and a model runs what
    recipes/default.yaml runs (its gates aside), so README's three lines are the fast, measured path."""
    from pathlib import Path

    from accel.recipe import load_recipe

    default = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "default.yaml")
    three = parse_recipe({"name": "default", "model": {"path": "smollm2-135m"}})
    for section in ("calibration", "speculation", "runtime", "eval", "export"):
        assert getattr(default, section) == getattr(three, section), section
    # the default recipe narrows the candidates to INT8 / 16-bit for its model; nothing else differs
    assert default.quantization.model_copy(update={"candidates": three.quantization.candidates}) == three.quantization
    q = three.quantization
    assert (q.method, q.sensitivity.metric, q.budget.max_mean_kl, three.speculation.method, three.eval.tasks) == (
        "gptq", "proxy", 0.005, "ngram", False)


def test_export_targets_are_the_recipes():
    """`accel export run|verify --target` and the recipe's export.target allow the same loaders."""
    import typing

    from accel.export.checkpoint import TARGETS
    from accel.recipe import ExportConfig

    assert typing.get_args(ExportConfig.model_fields["target"].annotation) == TARGETS
