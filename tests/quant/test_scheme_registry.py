"""The scheme registry: a scheme registered in one place reaches the recipe, the allocator, llm-compressor's config
groups, the checkpoint and the loader, with nothing else edited."""

from __future__ import annotations

import pytest
import torch

from accel import schemes
from accel.schemes.int8g import Int8g
from tests.conftest import make_tiny_llama
from tests.quant.test_plan import _draw
from tests.quant.test_quantize import _tokenizer


class Int8g64(Int8g):
    """A toy scheme for this test: INT8 with one fp16 scale per 64 inputs (stored as compressed-tensors' 8-bit group
    strategy; the runtime holds it as int8g with each scale repeated)."""

    name = "int8g64"
    rank = 45.0
    summary = "INT8 per group of 64 inputs (a test's toy)"
    head = table = ties_table = on_load = False

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        return 8.0 + 16.0 / 64

    def group_of(self, name: str, int4_group: int, head_group: int) -> int | None:
        return 64


@pytest.fixture
def toy():
    scheme = schemes.register(Int8g64())
    try:
        yield scheme
    finally:
        schemes.unregister(scheme.name)
    assert "int8g64" not in schemes.names()


def test_a_registered_scheme_runs_plan_quantize_export_and_load(tmp_path, toy):
    from transformers import AutoModelForCausalLM

    from accel.export.compatibility import loader_support
    from accel.kernels.linear import Int8WeightOnlyLinear
    from accel.kernels.loader import load_hf_model
    from accel.quant.plan import build_plan, token_batches
    from accel.quant.quantize import oneshot_quantize, recipe_config, save_checkpoint
    from accel.quant.schemes import fake_quantized
    from accel.quant.sensitivity import measure_sensitivity
    from accel.recipe import parse_recipe

    src = tmp_path / "tiny"
    make_tiny_llama(initializer_range=0.1, hidden_size=128, intermediate_size=256).save_pretrained(src)  # 2+ groups
    _tokenizer().save_pretrained(src)
    recipe = parse_recipe({
        "name": "t", "model": {"path": str(src)}, "calibration": {"num_samples": 8, "max_seq_len": 16},
        "quantization": {"method": "rtn", "candidates": ["int8g64", "fp16"], "lm_head": "fp16",
                         "budget": {"target_avg_bits": 8.25}, "sensitivity": {"num_samples": 2, "max_seq_len": 16}},
    })
    q = recipe.quantization
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sens = measure_sensitivity(model, token_batches(_draw(0, 4), 16, 2), q.candidates, 32, "proxy", progress=False)
    plan = build_plan(model, sens, q)
    assert set(plan.schemes.values()) == {"int8g64"} and plan.avg_bits == pytest.approx(8.25)  # its own bits
    group = recipe_config(plan, "rtn")["config_groups"]["int8g64"]
    assert group["weights"]["group_size"] == 64 and group["weights"]["num_bits"] == 8
    x = torch.randint(3, 256, (1, 16))
    with torch.no_grad(), fake_quantized(model, plan.schemes, plan.sizes()):
        measured = model(x).logits  # what the sensitivity and the plan measured
    ck = save_checkpoint(oneshot_quantize(model, plan, token_batches(_draw(0, 8), 16, 8), "rtn").model, plan,
                         tmp_path / "ck")
    assert loader_support(__import__("json").loads((ck / "config.json").read_text()))["accel"].loads
    loaded = load_hf_model(ck)
    mods = [m for n, m in loaded.named_modules() if n in plan.schemes]
    assert mods and all(isinstance(m, Int8WeightOnlyLinear) and m.group_size for m in mods)
    with torch.no_grad():
        served = loaded(x).logits
    assert torch.allclose(served, measured, atol=2e-3, rtol=1e-3)  # served is what was measured


def test_the_recipe_cli_and_report_read_the_registry(toy):
    from accel.recipe import QuantizationConfig, RecipeError, parse_recipe
    from accel.report.schema import scheme_bits

    assert QuantizationConfig(candidates=["int8g64"]).candidates == ["int8g64"]
    schema = QuantizationConfig.model_json_schema()
    assert "int8g64" in str(schema["properties"]["candidates"]) and "int8g64" not in str(schema["properties"]["lm_head"])
    with pytest.raises(RecipeError, match="unknown scheme 'int8g64' as head; allowed: int4, w4a8, int4f, int8, int8g, fp16"):
        parse_recipe({"name": "t", "model": {"path": "x"}, "quantization": {"lm_head": "int8g64"}})
    with pytest.raises(RecipeError, match="unreachable with candidates .'int8g64'.: int8g64, the cheapest, costs 8.25"):
        parse_recipe({"name": "t", "model": {"path": "x"},
                      "quantization": {"candidates": ["int8g64"], "budget": {"target_avg_bits": 8.0}}})
    assert scheme_bits("int8g64") == 8 and scheme_bits("bf16") == 16 and scheme_bits("int3") is None


def test_registry_order_roles_and_refusals():
    assert schemes.names() == ("int4", "w4a8", "int4f", "int5", "int8", "w8a8", "int8g", "fp16")
    assert schemes.names("on_load") == ("int4", "w4a8", "int4f", "int8", "w8a8", "int8g")
    assert [s for s in schemes.names() if "vllm-cpu" in schemes.get(s).loaders] == ["int4", "w8a8", "fp16"]
    with pytest.raises(ValueError, match="scheme name 'int8g' is empty or taken"):
        schemes.register(Int8g64.__base__())  # int8g's name: one object per name
    with pytest.raises(ValueError, match="unknown scheme 'int3'; allowed: int4, w4a8, int4f"):
        schemes.get("int3")
    with pytest.raises(ValueError, match="unknown scheme role 'tail'"):
        schemes.names("tail")


@pytest.mark.parametrize("name", [s for s in schemes.names() if schemes.get(s).quantized])
def test_each_scheme_reads_its_own_config_group_and_its_loaders_are_the_loader_tables(name):
    """The registry's `loaders` against the rules read from the loaders' code (`accel.export.compatibility`), on the
    config group the scheme writes for a decoder Linear."""
    from accel.export.compatibility import loader_support

    s = schemes.get(name)
    weights = s.weights_args(s.group_of("model.layers.0.mlp.up_proj", 64, 32))
    assert schemes.identify(weights, s.format, s.input_activations) is s
    group = {"targets": ["model.layers.0.mlp.up_proj"], "weights": weights, "format": s.format,
             **({"input_activations": s.input_activations} if s.input_activations else {})}
    config = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
              "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {name: group}}}
    assert {loader for loader, sup in loader_support(config).items() if sup.loads} == set(s.loaders)


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_w4a8_runs_plan_quantize_export_and_load(tmp_path, method):
    """w4a8 (int4's weights, 8-bit activation blocks) through llm-compressor: the checkpoint declares its activations,
    only accel loads it, and accel serves the stored integers with the activations rounded."""
    import json

    from transformers import AutoModelForCausalLM

    from accel.export.compatibility import loader_support
    from accel.kernels.loader import load_hf_model
    from accel.quant.plan import build_plan, token_batches
    from accel.quant.quantize import oneshot_quantize, recipe_config, save_checkpoint
    from accel.quant.sensitivity import measure_sensitivity
    from accel.recipe import parse_recipe
    from accel.schemes.w4a8 import W4A8_ACTIVATIONS

    src = tmp_path / "tiny"
    make_tiny_llama(initializer_range=0.1, hidden_size=128, intermediate_size=256).save_pretrained(src)
    _tokenizer().save_pretrained(src)
    recipe = parse_recipe({
        "name": "t", "model": {"path": str(src)}, "calibration": {"num_samples": 8, "max_seq_len": 16},
        "quantization": {"method": method, "candidates": ["w4a8"], "lm_head": "fp16", "int4_group_size": 32,
                         "budget": {"target_avg_bits": 8.0}, "sensitivity": {"num_samples": 2, "max_seq_len": 16}},
    })
    q = recipe.quantization
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sens = measure_sensitivity(model, token_batches(_draw(0, 4), 16, 2), q.candidates, 32, "proxy", progress=False)
    plan = build_plan(model, sens, q)
    assert set(plan.schemes.values()) == {"w4a8"}
    group = recipe_config(plan, method)["config_groups"]["w4a8"]
    assert group["input_activations"] == W4A8_ACTIVATIONS and group["weights"]["num_bits"] == 4
    ck = save_checkpoint(oneshot_quantize(model, plan, token_batches(_draw(0, 8), 16, 8), method).model, plan,
                         tmp_path / "ck")
    config = json.loads((ck / "config.json").read_text())
    (stored,) = [g for g in config["quantization_config"]["config_groups"].values() if g.get("input_activations")]
    assert {k: stored["input_activations"].get(k) for k in W4A8_ACTIVATIONS} == W4A8_ACTIVATIONS
    assert {name for name, s in loader_support(config).items() if s.loads} == {"accel"}
    loaded = load_hf_model(ck)
    mods = {n: m for n, m in loaded.named_modules() if n in plan.schemes}
    assert mods and {schemes.scheme_of(m) for m in mods.values()} == {"w4a8"}
    x = torch.randint(3, 256, (1, 16))
    seen = []  # each served module's input and output, against its torch reference on the same input
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], out))) for m in mods.values()]
    int4 = load_hf_model(ck)
    for n, m in int4.named_modules():
        if n in plan.schemes:
            m.a8 = False  # the same stored integers at 16-bit activations (before its kernel layout is built)
    with torch.no_grad():
        served, int4 = loaded(x).logits, int4(x).logits
        assert len(seen) == len(mods)
        for mod, xin, out in seen:
            ref = mod._a8_reference(xin.reshape(-1, mod.in_features)).reshape(out.shape)
            assert torch.allclose(out, ref, atol=1e-5 * ref.abs().max().item())
    for h in hooks:
        h.remove()
    assert (served - int4).abs().max() > 1e-2  # the activations' rounding shows in the logits
