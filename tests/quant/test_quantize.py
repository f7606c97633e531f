"""Plan -> llm-compressor recipe (exact), and oneshot RTN / GPTQ end to end on a tiny Llama -> kernels."""

from __future__ import annotations

import copy

import pytest
import torch

from accel.quant.allocate import Plan
from accel.kernels.loader import load_hf_model
from accel.quant.quantize import build_modifiers, oneshot_quantize, recipe_config, save_checkpoint
from accel.quant.schemes import fake_quant, fake_quantized, quantizable_linears
from tests.conftest import make_tiny_llama

PLAN = Plan(schemes={"model.layers.0.self_attn.q_proj": "int4", "model.layers.0.mlp.up_proj": "int8",
                     "model.layers.0.mlp.down_proj": "fp16"}, group_size=32, avg_bits=0.0, estimated_kl=0.0,
            lm_head="int8")

# the runtime's native INT8 / INT4 kernels round activations to 16 bits per block of 32 (~1e-5 relative per layer)
KERNEL_TOL = {"atol": 1e-3, "rtol": 1e-3}


def test_recipe_config_exact():
    cfg = recipe_config(PLAN)
    assert cfg == {
        "config_groups": {
            "int8": {"targets": ["model.layers.0.mlp.up_proj", "lm_head"], "format": "pack-quantized",
                     "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                                 "scale_dtype": "float16"}},
            "int4": {"targets": ["model.layers.0.self_attn.q_proj"], "format": "pack-quantized",
                     "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                 "group_size": 32, "scale_dtype": "float16"}},
        },
        "ignore": ["model.layers.0.mlp.down_proj"],
    }
    plan16 = Plan(**{**PLAN.__dict__, "lm_head": "fp16"})
    assert recipe_config(plan16)["ignore"] == ["model.layers.0.mlp.down_proj", "lm_head"]
    # GPTQ searches INT4 ranges with the imatrix-weighted MSE observer; INT8 and RTN keep min-max
    gptq = recipe_config(PLAN, "gptq")["config_groups"]
    assert gptq["int4"]["weights"]["observer"] == "imatrix_mse" and "observer" not in gptq["int8"]["weights"]


def test_build_modifiers_per_method():
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    (rtn,) = build_modifiers(PLAN, "rtn")
    assert type(rtn) is QuantizationModifier
    assert set(rtn.config_groups) == {"int8", "int4"}
    assert rtn.ignore == ["model.layers.0.mlp.down_proj"]
    (gptq,) = build_modifiers(PLAN, "gptq", dampening=0.05)
    assert type(gptq) is GPTQModifier and gptq.dampening_frac == 0.05
    assert gptq.config_groups["int4"].weights.observer == "imatrix_mse"
    assert [type(m).__name__ for m in build_modifiers(PLAN, "smoothquant+gptq")] == [
        "SmoothQuantModifier", "GPTQModifier"]
    with pytest.raises(ValueError, match="unknown quantization method 'hqq'"):
        build_modifiers(PLAN, "hqq")


def _tokenizer():
    """A throwaway word-level tokenizer: llm-compressor insists on a processor even for pre-tokenized data."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0")


def _saved_tiny(tmp_path, fp16_values: bool = False, **kw):
    """A tiny Llama saved and loaded back; `fp16_values`: every weight on the fp16 grid, so the checkpoint's 16-bit
    storage of unquantized matrices is exact."""
    from transformers import AutoModelForCausalLM

    src = tmp_path / "tiny"
    model = make_tiny_llama(initializer_range=0.1, **kw)
    if fp16_values:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.half().float())
    model.save_pretrained(src)
    return AutoModelForCausalLM.from_pretrained(src).eval()


def _mixed_plan(model, lm_head="fp16"):
    names = quantizable_linears(model)
    schemes = {n: ("int4", "int8", "fp16")[i % 3] for i, n in enumerate(names)}
    return Plan(schemes=schemes, group_size=32, avg_bits=0.0, estimated_kl=0.0, lm_head=lm_head)


CAL = [torch.randint(3, 256, (4, 32), generator=torch.Generator().manual_seed(0))]
# 8 x 16 = 128 rows: a prefill-sized call
X = torch.randint(3, 256, (8, 16), generator=torch.Generator().manual_seed(5))


@torch.no_grad()
def test_rtn_oneshot_matches_our_fake_quant_and_loads_into_kernels(tmp_path):
    from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear

    model = _saved_tiny(tmp_path, tie_word_embeddings=True)
    plan = _mixed_plan(model, lm_head="int8")
    embed = model.model.embed_tokens.weight.clone()
    with fake_quantized(model, {**plan.schemes, "lm_head": "int8"}, 32):
        ours = model(X).logits  # our RTN fake-quant, the lm_head included
    stored = copy.deepcopy(model)  # what the checkpoint holds: the unquantized matrices rounded to fp16
    stored.lm_head.weight = torch.nn.Parameter(stored.lm_head.weight.clone())  # untied, as the library leaves it
    for name, module in stored.named_modules():
        if isinstance(module, torch.nn.Embedding) or plan.schemes.get(name) == "fp16":
            module.weight.copy_(module.weight.half().float())
    with fake_quantized(stored, {**plan.schemes, "lm_head": "int8"}, 32):
        ours_stored = stored(X).logits
    res = oneshot_quantize(model, plan, CAL, "rtn", processor=_tokenizer())
    lib = res.model(X).logits
    # our fake quantization reproduces compressed-tensors' RTN numerics
    torch.testing.assert_close(lib, ours, atol=1e-4, rtol=1e-4)
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    import json

    config = json.loads((ck / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # the quantized lm_head is its own tensor in the checkpoint
    from safetensors import safe_open

    with safe_open(str(ck / "model.safetensors"), "pt") as f:  # the unquantized matrices at 16 bits, norms as they were
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["model.embed_tokens.weight"] == "F16" and dtypes["model.norm.weight"] == "F32"
    assert dtypes["model.layers.0.self_attn.v_proj.weight"] == "F16"  # a 16-bit fallback Linear
    # scales in fp16 (int4: 4 + 20/g bits per weight), zero points packed at 4 bits
    assert dtypes["model.layers.0.self_attn.q_proj.weight_scale"] == "F16" == dtypes["lm_head.weight_scale"]
    assert dtypes["model.layers.0.self_attn.q_proj.weight_zero_point"] == "I32"
    loaded = load_hf_model(ck)
    assert isinstance(loaded.model.layers[0].self_attn.q_proj, Int4WeightOnlyLinear)
    assert isinstance(loaded.model.layers[0].self_attn.k_proj, Int8WeightOnlyLinear)
    assert isinstance(loaded.model.layers[0].self_attn.v_proj, torch.nn.Linear)
    assert isinstance(loaded.lm_head, Int8WeightOnlyLinear)  # read from the checkpoint, not applied on load
    assert torch.equal(loaded.model.embed_tokens.weight, embed.half().float())  # stored at 16 bits
    torch.testing.assert_close(loaded(X).logits, ours_stored, **KERNEL_TOL)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ck).eval()  # transformers runs the same weights
    torch.testing.assert_close(hf(X).logits, ours_stored, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_gptq_oneshot_checkpoint_matches_fake_quant_model(tmp_path):
    model = _saved_tiny(tmp_path, fp16_values=True)
    ref = model(X).logits
    plan = _mixed_plan(model)
    res = oneshot_quantize(model, plan, CAL, "gptq", processor=_tokenizer())
    fq = res.model(X).logits
    assert (fq - ref).abs().max() > 1e-3  # it did quantize
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    import json

    qc = json.loads((ck / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["num_bits"]: g for g in qc["config_groups"].values()}  # the library renames groups
    assert set(groups) == {4, 8}
    assert (groups[4]["format"], groups[8]["format"]) == ("pack-quantized", "pack-quantized")
    assert groups[4]["targets"] == [n for n, s in plan.schemes.items() if s == "int4"]
    assert "lm_head" in qc["ignore"]
    loaded = load_hf_model(ck)
    torch.testing.assert_close(loaded(X).logits, fq, **KERNEL_TOL)


@torch.no_grad()
def test_awq_oneshot_runs_on_a_machine_without_an_accelerator(tmp_path):
    """AWQ pins its cached activations for host-to-device copies, which torch refuses without an accelerator."""
    model = _saved_tiny(tmp_path, fp16_values=True)
    ref = model(X).logits
    # one scheme per fusion group (q/k/v, gate/up): AWQ fuses their observers
    schemes = {n: "int8" if "mlp" in n else "int4" for n in quantizable_linears(model)}
    plan = Plan(schemes=schemes, group_size=32, avg_bits=0.0, estimated_kl=0.0, lm_head="fp16")
    norms = {n: p.clone() for n, p in model.named_parameters() if "layernorm" in n}
    res = oneshot_quantize(model, plan, CAL, "awq", processor=_tokenizer())
    assert any(not torch.equal(p, norms[n]) for n, p in res.model.named_parameters() if n in norms)  # it smoothed
    assert (res.model(X).logits - ref).abs().max() > 1e-3  # and quantized
    loaded = load_hf_model(save_checkpoint(res.model, plan, tmp_path / "ck"))
    torch.testing.assert_close(loaded(X).logits, res.model(X).logits, **KERNEL_TOL)


def _q4_1_grid(model, group_size=32):
    """Move every quantizable weight onto a GGUF Q4_1 grid (fp16 d and min per group of 32), as SmolLM2's are."""
    mods = dict(model.named_modules())
    with torch.no_grad():
        for n in quantizable_linears(model):
            w = mods[n].weight
            o, i = w.shape
            g = w.reshape(o, i // group_size, group_size)
            lo = g.amin(2, keepdim=True).half().float()
            d = ((g.amax(2, keepdim=True) - lo) / 15).half().float()
            w.copy_((torch.round((g - lo) / d).clamp(0, 15) * d + lo).reshape(o, i))


@torch.no_grad()
def test_int4f_float_zero_point_is_lossless_on_q4_1_weights_and_loads_in_runtime_and_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from accel.kernels.linear import Int4WeightOnlyLinear
    from accel.schemes import scheme_of as linear_scheme

    src = tmp_path / "q41"
    tiny = make_tiny_llama(initializer_range=0.1, tie_word_embeddings=True)
    tiny.model.embed_tokens.weight.copy_(tiny.model.embed_tokens.weight.half().float())  # stored at 16 bits
    _q4_1_grid(tiny)
    tiny.save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    ref = model(X).logits
    names = quantizable_linears(model)
    with fake_quantized(model, {n: "int4" for n in names}, 32):
        int_zp = model(X).logits
    with fake_quantized(model, {n: "int4f" for n in names}, 32):
        ours = model(X).logits
    err_int, err_float = (int_zp - ref).abs().max(), (ours - ref).abs().max()
    assert err_float < err_int / 20, (err_float, err_int)  # the float zero point hits the grid
    plan = Plan(schemes={n: ("int4f" if i % 4 else "int8") for i, n in enumerate(names)}, group_size=32,
                avg_bits=0.0, estimated_kl=0.0, lm_head="fp16")
    with fake_quantized(model, plan.schemes, 32):
        ours = model(X).logits
    res = oneshot_quantize(model, plan, CAL, "rtn", processor=_tokenizer())
    torch.testing.assert_close(res.model(X).logits, ours, atol=1e-4, rtol=1e-4)  # = compressed-tensors numerics
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    import json

    qc = json.loads((ck / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["num_bits"]: g for g in qc["config_groups"].values()}
    w4 = groups[4]["weights"]  # packed to 4 bits, fp16 zero points left as they are (a block strategy)
    assert groups[4]["format"] == "pack-quantized" and w4["zp_dtype"] == "torch.float16"
    assert (w4["strategy"], w4["block_structure"], w4["group_size"]) == ("block", [1, 32], None)
    from safetensors import safe_open

    with safe_open(str(next(ck.glob("*.safetensors"))), "pt") as f:
        packed = f.get_tensor("model.layers.0.self_attn.k_proj.weight_packed")
        zp = f.get_tensor("model.layers.0.self_attn.k_proj.weight_zero_point")
    k = model.model.layers[0].self_attn.k_proj
    assert packed.dtype == torch.int32 and packed.numel() * 8 == k.weight.numel()  # 4 bits a weight
    assert zp.dtype == torch.float16 and zp.shape == (k.out_features, k.in_features // 32)
    loaded = load_hf_model(ck)
    q = loaded.model.layers[0].self_attn.k_proj
    assert isinstance(q, Int4WeightOnlyLinear) and q.float_zero and linear_scheme(q) == "int4f"
    torch.testing.assert_close(loaded(X).logits, ours, **KERNEL_TOL)
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()  # compressed-tensors decompresses the float zero points
    torch.testing.assert_close(hf(X).logits, ours, atol=1e-4, rtol=1e-4)


def test_int4f_kernel_module_matches_its_dequantized_weight_on_every_cpu_path():
    from accel.kernels.linear import Int4WeightOnlyLinear, quantize_int4_groupwise
    from accel.schemes import apply_plan

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=False)
    q, s, z = quantize_int4_groupwise(lin.weight, 32, float_zero=True, float_dtype=torch.float32)  # as on load
    assert z.dtype == torch.float32 and not torch.equal(z, z.round())
    ref_w = (q.float().reshape(48, 2, 32) - z[..., None]) * s[..., None]
    m = Int4WeightOnlyLinear.from_linear(lin, group_size=32, float_zero=True)
    torch.testing.assert_close(m.dequantized(), ref_w.reshape(48, 64))
    for rows in (1, 4, 200):  # avx2 / int4pack (bf16) / dequant GEMM
        x = torch.randn(rows, 64)
        torch.testing.assert_close(m(x), x @ ref_w.reshape(48, 64).T, atol=3e-2, rtol=3e-2)
    seq = torch.nn.Sequential(torch.nn.Linear(64, 48))
    apply_plan(seq, {"0": "int4f"}, group_size=32)
    assert isinstance(seq[0], Int4WeightOnlyLinear) and seq[0].float_zero


@pytest.mark.parametrize("head", ["int8", "int8g"])
@torch.no_grad()
def test_tied_int8_table_is_stored_once_and_every_loader_runs_what_the_plan_measured(tmp_path, head):
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from accel.runtime.models import load_model
    from accel.export.compatibility import loader_support
    from accel.kernels.linear import Int8Embedding, Int8WeightOnlyLinear

    model = _saved_tiny(tmp_path, tie_word_embeddings=True)
    names = quantizable_linears(model)  # no 16-bit Linear: the checkpoint then stores no rounded float matrix
    plan = Plan(schemes={n: ("int4", "int8")[i % 2] for i, n in enumerate(names)}, group_size=32, avg_bits=0.0,
                estimated_kl=0.0, lm_head=head, table=head, tied=True)
    assert plan.measured_schemes()["model.embed_tokens"] == head
    with fake_quantized(model, plan.measured_schemes(), 32):
        measured = model(X).logits  # what the held-out check measures: the table's rows at 8 bits in and out
    res = oneshot_quantize(model, plan, CAL, "rtn", processor=_tokenizer())
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    config = json.loads((ck / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    groups = config["quantization_config"]["config_groups"]
    assert groups["table"]["targets"] == ["model.embed_tokens", "lm_head"]
    assert groups["table"]["format"] == "int-quantized" and groups["table"]["weights"]["num_bits"] == 8
    assert groups["table"]["weights"]["strategy"] == ("group" if head == "int8g" else "channel")
    assert all("lm_head" not in g["targets"] for n, g in groups.items() if n != "table")
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["model.embed_tokens.weight"] == "I8" and not any(k.startswith("lm_head.weight_") and k !=
                                                                  "lm_head.weight_scale" for k in dtypes)
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()  # transformers ties the int8 table and decompresses it
    torch.testing.assert_close(hf(X).logits, measured, atol=1e-4, rtol=1e-4)
    loaded = load_hf_model(ck)
    assert isinstance(loaded.model.embed_tokens, Int8Embedding) and isinstance(loaded.lm_head, Int8WeightOnlyLinear)
    torch.testing.assert_close(loaded(X).logits, measured, **KERNEL_TOL)
    runtime = load_model(ck, torch.float32, torch.device("cpu"))
    assert runtime.model.embed_tokens.qweight.data_ptr() == runtime.lm_head.qweight.data_ptr()  # held once
    assert runtime.lm_head.group_size == (32 if head == "int8g" else None)
    if head == "int8g":  # one fp16 scale per 32 values of a row, as the GGUF Q8_0 grid
        assert tuple(runtime.lm_head.scales.shape) == (runtime.lm_head.out_features, runtime.lm_head.in_features // 32)
    ids = X[0]
    torch.testing.assert_close(runtime.model.embed_tokens(ids), hf.model.embed_tokens(ids), atol=0, rtol=0)
    support = loader_support(config)
    assert support["accel"].loads and support["transformers"].loads
    assert "vLLM ties only an unquantized table" in support["vllm"].refused["model.embed_tokens"]


def test_the_tables_scheme_follows_an_int8_lm_head_and_is_refused_where_no_loader_takes_it():
    from accel.quant.plan import table_scheme
    from accel.recipe import QuantizationConfig

    tied, untied = True, False

    def q(**kw):
        return QuantizationConfig(**kw)

    assert table_scheme(tied, q(lm_head="int8"), "transformers") == "int8"
    assert table_scheme(tied, q(lm_head="int8"), None) == "int8"
    assert table_scheme(tied, q(lm_head="int8g"), None) == "int8g" == table_scheme(untied, q(lm_head="int8g"), None)
    assert table_scheme(tied, q(lm_head="int8"), "vllm") == "fp16"  # vLLM ties only an unquantized table
    assert table_scheme(untied, q(lm_head="int8"), "vllm-cpu") == "fp16"  # and quantizes no embedding
    assert table_scheme(tied, q(lm_head="fp16"), None) == "fp16" == table_scheme(untied, q(lm_head="int4"), None)
    assert table_scheme(untied, q(lm_head="int8", table="int4"), None) == "int4"
    assert table_scheme(tied, q(lm_head="int8", table="fp16"), None) == "fp16"
    with pytest.raises(ValueError, match="ties its table to its lm_head .'int8'.*allowed: fp16, int8"):
        table_scheme(tied, q(lm_head="int8", table="int4"), None)
    with pytest.raises(ValueError, match="ties its table to its lm_head .'int4'.*allowed: fp16$"):
        table_scheme(tied, q(lm_head="int4", table="int4"), None)
    with pytest.raises(ValueError, match="table 'int8' with export.target 'vllm': vLLM quantizes no embedding"):
        table_scheme(untied, q(table="int8"), "vllm")
    with pytest.raises(ValueError, match="table 'int4' with export.target 'transformers': transformers loads no"):
        table_scheme(untied, q(table="int4"), "transformers")


@pytest.mark.parametrize("table", ["int8", "int8g", "int4"])
@torch.no_grad()
def test_untied_table_is_rounded_on_its_own_and_every_loader_runs_what_the_plan_measured(tmp_path, table):
    """An untied model's table at 8 or 4 bits (RTN, per token, or per group of its values), and transformers,
    accel's loader and its runtime all compute what the held-out check measured; vLLM, which quantizes no
    embedding, is refused by name."""
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from accel.export.compatibility import loader_support
    from accel.kernels.linear import (Int4Embedding, Int8Embedding, dequantize_int4_groupwise,
                                      int4_from_compressed_tensors)
    from accel.runtime.models import load_model

    model = _saved_tiny(tmp_path, tie_word_embeddings=False)
    names = quantizable_linears(model)
    head = "int8g" if table == "int8g" else "int8"
    plan = Plan(schemes={n: "int4" if ".layers.0." in n else "int8" for n in names}, group_size=32, avg_bits=0.0,
                estimated_kl=0.0, lm_head=head, table=table)
    with fake_quantized(model, plan.measured_schemes(), plan.sizes()):
        measured = model(X).logits
    with fake_quantized(model, plan.all_schemes(), plan.sizes()):
        table_16bit = model(X).logits
    assert not torch.allclose(measured, table_16bit, atol=1e-5)  # the table's rounding is measured
    weight = model.model.embed_tokens.weight.detach().clone()
    res = oneshot_quantize(model, plan, CAL, "rtn", processor=_tokenizer())
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    config = json.loads((ck / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    groups = config["quantization_config"]["config_groups"]
    assert groups["table"]["targets"] == ["model.embed_tokens"]
    assert groups["table"]["format"] == ("pack-quantized" if table == "int4" else "int-quantized")
    assert groups["table"]["weights"]["strategy"] == ("channel" if table == "int8" else "group")
    assert any("lm_head" in g["targets"] for g in groups.values())  # the head keeps its own group and integers
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys() if k.startswith("model.embed_tokens.")}
    if table == "int4":
        q, scale, zeros = int4_from_compressed_tensors(*(stored[f"model.embed_tokens.weight_{k}"]
                                                         for k in ("packed", "scale", "shape", "zero_point")))
        rows = dequantize_int4_groupwise(q, scale, zeros, 32)
        assert stored["model.embed_tokens.weight_packed"].numel() * 4 == weight.numel() // 2  # 4 bits a value
    else:
        q, scale = stored["model.embed_tokens.weight"], stored["model.embed_tokens.weight_scale"]
        assert q.dtype == torch.int8 and scale.dtype == torch.float16
        assert tuple(scale.shape) == (weight.shape[0], weight.shape[1] // 32 if table == "int8g" else 1)
        rows = (q.float().reshape(q.shape[0], scale.shape[1], -1) * scale.float()[:, :, None]).reshape(weight.shape)
    torch.testing.assert_close(rows, fake_quant(weight, table, 32), atol=0, rtol=0)
    support = loader_support(config)
    assert support["accel"].loads and support["transformers"].loads == (table != "int4")
    assert "vLLM quantizes no embedding" in support["vllm"].refused["model.embed_tokens"]
    if table != "int4":
        hf = AutoModelForCausalLM.from_pretrained(ck).eval()
        torch.testing.assert_close(hf(X).logits, measured, atol=1e-4, rtol=1e-4)
    loaded = load_hf_model(ck)
    assert isinstance(loaded.model.embed_tokens, Int4Embedding if table == "int4" else Int8Embedding)
    torch.testing.assert_close(loaded(X).logits, measured, **KERNEL_TOL)
    runtime = load_model(ck, torch.float32, torch.device("cpu"))
    torch.testing.assert_close(runtime.model.embed_tokens(X[0]), rows[X[0]], atol=0, rtol=0)
    torch.testing.assert_close(runtime.model.embed_tokens(X), rows[X], atol=0, rtol=0)
    from accel.kernels import cpu

    if cpu.available():  # the native decode step takes an INT8 table's rows itself, an INT4 table's gathered
        from accel.runtime.engine import Engine
        from accel.runtime.sampling_params import SamplingParams

        engine = Engine.from_pretrained(ck, num_kv_blocks=64, block_size=8, enable_prefix_caching=False)
        native, greedy = engine.model.native_decode, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        assert native is not None and native.has_tables == (table != "int4")
        outs = []
        for mode in (native, None):
            engine.model.native_decode = mode
            outs.append([o.token_ids for o in engine.generate([[5, 9, 13], [7] * 11], greedy)])
        assert outs[0] == outs[1]


@torch.no_grad()
def test_layerwise_gptq_gives_each_linears_int4_weight_with_less_output_error_than_rtn(tmp_path, monkeypatch):
    """What the sensitivity measures for a GPTQ recipe: every Linear at INT4 as GPTQ makes it on the unquantized
    model's inputs, on the INT4 grid, with less error on those inputs than RTN's; held at 4 bits; passes of fewer
    layers (Hessians within GPTQ_HESSIAN_BYTES) give the same weights."""
    from accel.quant import quantize
    from accel.quant.quantize import layerwise_gptq
    from accel.quant.schemes import fake_quant_int4

    model = _saved_tiny(tmp_path, fp16_values=True)
    names = quantizable_linears(model)
    ref = copy.deepcopy(model)
    inputs = {}
    hooks = [ref.get_submodule(n).register_forward_hook(
        lambda mod, args, out, n=n: inputs.update({n: args[0].reshape(-1, args[0].shape[-1])})) for n in names]
    ref(CAL[0])
    for h in hooks:
        h.remove()
    weights = layerwise_gptq(lambda: copy.deepcopy(model), names, 32, CAL, processor=_tokenizer())
    assert set(weights) == set(names)
    monkeypatch.setattr(quantize, "GPTQ_HESSIAN_BYTES", 1)  # a pass per layer: the same weights, Hessians apart
    passes = []
    real = quantize.oneshot_quantize
    monkeypatch.setattr(quantize, "oneshot_quantize",
                        lambda m, plan, *a, **k: passes.append(plan) or real(m, plan, *a, **k))
    apart = layerwise_gptq(lambda: copy.deepcopy(model), names, 32, CAL, processor=_tokenizer())
    assert [sorted(p.schemes) for p in passes] == [sorted(n for n in names if f".layers.{i}." in n) for i in range(2)]
    gptq_err = rtn_err = 0.0
    for n in names:
        w, x = ref.get_submodule(n).weight, inputs[n]
        assert weights[n].q.numel() == w.numel() // 2  # held at 4 bits
        q = weights[n].dequantize()
        torch.testing.assert_close(apart[n].dequantize(), q, atol=1e-6, rtol=0)
        assert q.shape == w.shape and not torch.equal(q, w)
        groups = q.reshape(q.shape[0], -1, 32)
        assert max(len(torch.unique(groups[r, g])) for r in range(q.shape[0]) for g in range(groups.shape[1])) <= 16
        gptq_err += float((x @ (q - w).T).pow(2).sum())
        rtn_err += float((x @ (fake_quant_int4(w, 32) - w).T).pow(2).sum())
    assert gptq_err < 0.8 * rtn_err


@torch.no_grad()
def test_int4_at_two_group_sizes_gets_one_config_group_each_and_loads_at_each(tmp_path):
    """A plan whose units chose different INT4 group sizes: one compressed-tensors config group per size (vLLM loads
    each layer by its group), each layer quantized and loaded into a kernel at its unit's size."""
    from accel.kernels.linear import Int4WeightOnlyLinear

    model = _saved_tiny(tmp_path, fp16_values=True, tie_word_embeddings=True)
    names = quantizable_linears(model)
    at64 = [n for n in names if ".mlp." in n and ".layers.1." in n]
    plan = Plan(schemes=dict.fromkeys(names, "int4"), group_size=32, avg_bits=0.0, estimated_kl=0.0,
                lm_head="int8", group_sizes=dict.fromkeys(at64, 64))
    cfg = recipe_config(plan)
    assert set(cfg["config_groups"]) == {"int4", "int4_g64", "int8"}
    assert cfg["config_groups"]["int4_g64"]["targets"] == at64
    assert cfg["config_groups"]["int4_g64"]["weights"]["group_size"] == 64
    assert cfg["config_groups"]["int4"]["targets"] == [n for n in names if n not in at64]
    res = oneshot_quantize(model, plan, CAL, "rtn", processor=_tokenizer())
    for n in names:
        assert res.model.get_submodule(n).quantization_scheme.weights.group_size == plan.sizes()[n]
    loaded = load_hf_model(save_checkpoint(res.model, plan, tmp_path / "ck"))
    for n in names:
        m = loaded.get_submodule(n)
        assert isinstance(m, Int4WeightOnlyLinear) and m.group_size == plan.sizes()[n]
    torch.testing.assert_close(loaded(X).logits, res.model(X).logits, **KERNEL_TOL)


def test_tuning_rows_mix_domains_by_share_and_stay_distinct_while_a_domain_has_enough():
    from types import SimpleNamespace

    from accel.quant.tune import tuning_rows

    def units(domain, count, start):
        return [SimpleNamespace(domain=domain, token_ids=list(range(start + 64 * i, start + 64 * (i + 1))))
                for i in range(count)]

    samples = units("a", 10, 0) + units("b", 2, 10_000)  # a: 20 rows of 32 tokens, b: 4
    rows = tuning_rows(samples, 8, {"a": 0.5, "b": 0.5}, seq_len=32)
    assert rows.shape == (8, 32) and int((rows >= 10_000).all(1).sum()) == 4
    assert rows.unique(dim=0).shape[0] == 8
    cycled = tuning_rows(samples, 12, {"a": 0.5, "b": 0.5}, seq_len=32)
    assert cycled[(cycled >= 10_000).all(1)].unique(dim=0).shape[0] == 4  # b's 4 rows, read again
    by_tokens = tuning_rows(samples, 12, None, seq_len=32)  # 640 : 128 tokens
    assert int((by_tokens >= 10_000).all(1).sum()) == 2
    with pytest.raises(ValueError, match="row of 1024 tokens"):
        tuning_rows(samples, 4, None, seq_len=1024)
    with pytest.raises(ValueError, match="n=0 is invalid"):
        tuning_rows(samples, 0)


def test_scale_tuning_lowers_the_kl_to_the_unquantized_model_and_keeps_every_code(tmp_path):
    """End-to-end scale tuning after quantization: the KL to the unquantized model falls on the rows it tunes on,
    every INT4 / INT8 code stays as the quantizer chose it, scales end on the fp16 grid, and the checkpoint the
    library writes from the tuned model loads into our kernels with the same output."""
    from accel.quant.tune import tunable_linears, tune_scales

    model = _saved_tiny(tmp_path, fp16_values=True)
    teacher = copy.deepcopy(model)
    plan = _mixed_plan(model)
    rows = torch.randint(3, 256, (16, 32), generator=torch.Generator().manual_seed(1))
    res = oneshot_quantize(model, plan, [rows], "rtn", processor=_tokenizer())
    codes = tunable_linears(res.model)
    assert set(codes) == {n for n, s in plan.schemes.items() if s in ("int4", "int8")}

    def kl():
        with torch.no_grad():
            p = teacher(rows).logits.log_softmax(-1)
            q = res.model(rows).logits.log_softmax(-1)
        return float((p.exp() * (p - q)).sum(-1).mean())

    before = kl()
    scales = {n: res.model.get_submodule(n).weight_scale.detach().clone() for n in codes}
    summary = tune_scales(res.model, teacher, rows.reshape(-1, 16), steps=60, lr=1e-2, batch_size=8)
    assert summary["linears"] == len(codes) and summary["steps"] == 60
    after = kl()
    assert after < 0.9 * before, (before, after)
    for n, c in codes.items():
        mod = res.model.get_submodule(n)
        s = mod.weight_scale.detach()
        assert torch.equal(s, s.half().to(s.dtype))
        torch.testing.assert_close(tunable_linears(res.model)[n], c, atol=0, rtol=0)
    assert sum(not torch.equal(res.model.get_submodule(n).weight_scale, scales[n]) for n in codes) == len(codes)
    fq = res.model(X).logits
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    torch.testing.assert_close(load_hf_model(ck)(X).logits, fq, **KERNEL_TOL)
    with pytest.raises(ValueError, match="steps=0 is invalid"):
        tune_scales(res.model, teacher, rows, steps=0)


def _on_release_grids(model) -> None:
    """Every weight as a GGUF release dequantizes it: q/k/v/gate/up on Q5_0 blocks, o/down on Q4_K sub-blocks with
    unused extreme codes, the (tied) table on Q8_0 blocks (Gemma 3 270M's Q4_K_M file, in miniature)."""
    from tests.kernels.test_grid import q4_k_like, q5_0, q8_0

    mods = dict(model.named_modules())
    with torch.no_grad():
        for i, n in enumerate(quantizable_linears(model)):
            w = mods[n].weight
            grid = q4_k_like(*w.shape, seed=i, exact_zero=True) if n.endswith(("o_proj", "down_proj")) else q5_0(*w.shape, seed=i)[0]
            w.copy_(grid * 2.0 ** -3)
        model.model.embed_tokens.weight.copy_(q8_0(*model.model.embed_tokens.weight.shape)[0])


@pytest.mark.parametrize("method,head_group", [("rtn", 64), ("gptq", 32)])
@torch.no_grad()
def test_a_gguf_releases_grids_export_bit_for_bit_at_int5_int4f_int8g_and_load_everywhere(tmp_path, method,
                                                                                         head_group):
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from accel.export.compatibility import loader_support
    from accel.kernels.linear import Int8WeightOnlyLinear
    from accel.runtime.models import load_model

    src = tmp_path / "release"
    tiny = make_tiny_llama(tie_word_embeddings=True)
    _on_release_grids(tiny)
    tiny.save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    ref = model(X).logits
    names = quantizable_linears(model)
    plan = Plan(schemes={n: "int4f" if n.endswith(("o_proj", "down_proj")) else "int5" for n in names},
                group_size=32, avg_bits=0.0, estimated_kl=0.0, lm_head="int8g", table="int8g", tied=True,
                lm_head_group_size=head_group)
    with fake_quantized(model, plan.schemes, plan.sizes()):
        torch.testing.assert_close(model(X).logits, ref, atol=1e-5, rtol=0)  # the Linears come back exactly
    with fake_quantized(model, plan.measured_schemes(), plan.sizes()):
        measured = model(X).logits
    if head_group == 32:  # a Q8_0 table too
        torch.testing.assert_close(measured, ref, atol=1e-5, rtol=0)
    res = oneshot_quantize(model, plan, CAL, method, processor=_tokenizer())
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    config = json.loads((ck / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    int5 = [g for g in groups.values() if g["weights"]["num_bits"] == 5]
    assert len(int5) == 1 and int5[0]["format"] == "pack-quantized" and int5[0]["weights"]["symmetric"]
    assert groups["table"]["weights"]["group_size"] == head_group
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        packed = f.get_tensor("model.layers.0.mlp.up_proj.weight_packed")
    up = model.model.layers[0].mlp.up_proj
    assert packed.dtype == torch.int32 and packed.numel() * 32 == up.in_features * up.out_features * 5  # 5 bits a weight
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()
    torch.testing.assert_close(hf(X).logits, measured, atol=1e-4, rtol=1e-4)
    loaded = load_hf_model(ck)
    assert isinstance(loaded.model.layers[0].mlp.up_proj, Int8WeightOnlyLinear)  # int5 codes held as int8g
    torch.testing.assert_close(loaded(X).logits, measured, **KERNEL_TOL)
    runtime = load_model(ck, torch.float32, torch.device("cpu"))
    torch.testing.assert_close(runtime.lm_head.dequantized(), hf.lm_head.weight.float(), atol=0, rtol=0)
    torch.testing.assert_close(runtime.model.embed_tokens(X[0]), hf.model.embed_tokens(X[0]), atol=0, rtol=0)
    support = loader_support(config)
    assert support["accel"].loads and support["transformers"].loads
    assert "5-bit" in support["vllm"].refused["model.layers.0.mlp.up_proj"]


@pytest.mark.parametrize("method", ["rtn", "smoothquant+gptq"])
def test_w8a8_exports_vllms_w8a8_and_accel_transformers_run_the_same_integer_activations(tmp_path, method):
    """w8a8: int-quantized per-channel INT8 weights with dynamic per-token INT8 input activations (vLLM's W8A8);
    accel's loader gives its INT8 modules 8-bit activation rows, and transformers reads the activation scheme too."""
    from transformers import AutoModelForCausalLM

    from accel.export.compatibility import loader_support
    from accel.kernels.linear import Int8WeightOnlyLinear
    from accel.schemes import scheme_of as linear_scheme
    from accel.schemes.w8a8 import W8A8_ACTIVATIONS

    model = _saved_tiny(tmp_path, fp16_values=True)
    names = quantizable_linears(model)
    plan = Plan(schemes=dict.fromkeys(names, "w8a8"), group_size=32, avg_bits=8.0, estimated_kl=0.0, lm_head="fp16")
    cfg = recipe_config(plan, method)
    assert list(cfg["config_groups"]) == ["w8a8"] and cfg["ignore"] == ["lm_head"]
    assert cfg["config_groups"]["w8a8"]["format"] == "int-quantized"
    assert cfg["config_groups"]["w8a8"]["input_activations"] == W8A8_ACTIVATIONS
    res = oneshot_quantize(model, plan, CAL, method, processor=_tokenizer())
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    import json

    config = json.loads((ck / "config.json").read_text())
    support = loader_support(config)
    assert all(support[n].loads for n in ("accel", "transformers", "vllm", "vllm-cpu", "vllm-cpu-avx2"))
    loaded = load_hf_model(ck)
    mods = [m for m in loaded.modules() if isinstance(m, Int8WeightOnlyLinear)]
    assert len(mods) == len(names) and all(linear_scheme(m) == "w8a8" for m in mods)
    ours = loaded(X).logits
    plain = load_hf_model(ck)  # the same weights with float activations
    for m in plain.modules():
        if isinstance(m, Int8WeightOnlyLinear):
            m.a8 = False
    plain = plain(X).logits
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()(X).logits
    # both round the activations (transformers by compressed-tensors' max |x| / 127.5, accel as vLLM-CPU serves it,
    # max |x| / 127: quantize_int8_per_token), so both part from the float activations' logits
    assert (ours - plain).abs().max() > 1e-3 and (hf - plain).abs().max() > 1e-3


def test_the_loader_refuses_activation_schemes_accel_does_not_run(tmp_path):
    from accel.export.compatibility import loader_support
    from accel.kernels.loader import stored_schemes

    static = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False, "strategy": "tensor"}
    config = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "format": "int-quantized", "input_activations": static,
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}}}}
    with pytest.raises(ValueError, match="'g'.*dynamic.*False.*quantized activations only as w4a8 .* w8a8 "):
        stored_schemes(config)
    why = loader_support(config)["accel"].refused["Linear"]
    assert "only as w4a8" in why and "'strategy': 'token'" in why


def test_w8a8_for_vllm_cpu_is_quantized_within_7_bits_and_written_as_8_bit_weights(tmp_path):
    """vLLM-CPU's INT8 GEMM without VNNI saturates 16-bit pair sums of full-range weights; the vllm-cpu target's
    w8a8 weights stay in [-64, 63] and are declared 8-bit, which vLLM's W8A8 requires."""
    import json

    from safetensors import safe_open

    from accel.kernels.linear import Int8WeightOnlyLinear
    from accel.quant.plan import w8a8_weight_bits

    assert w8a8_weight_bits("vllm-cpu") == 7 and w8a8_weight_bits("vllm") == w8a8_weight_bits(None) == 8
    model = _saved_tiny(tmp_path)
    names = quantizable_linears(model)
    plan = Plan(schemes=dict.fromkeys(names, "w8a8"), group_size=32, avg_bits=8.0, estimated_kl=0.0, lm_head="fp16",
                w8a8_weight_bits=7)
    assert recipe_config(plan, "gptq")["config_groups"]["w8a8"]["weights"]["num_bits"] == 7
    res = oneshot_quantize(model, plan, CAL, "gptq", processor=_tokenizer())
    ck = save_checkpoint(res.model, plan, tmp_path / "ck")
    (group,) = json.loads((ck / "config.json").read_text())["quantization_config"]["config_groups"].values()
    assert group["weights"]["num_bits"] == 8 and group["input_activations"]["num_bits"] == 8
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        ints = [f.get_tensor(f"{n}.weight") for n in names]
    assert all(w.dtype == torch.int8 and int(w.min()) >= -64 and int(w.max()) <= 63 for w in ints)
    assert max(int(w.abs().max()) for w in ints) >= 60  # the range is used, not just clipped
    loaded = load_hf_model(ck)
    assert all(m.a8 for m in loaded.modules() if isinstance(m, Int8WeightOnlyLinear))


def test_a_model_quantized_by_oneshot_is_freed_with_its_last_reference(tmp_path):
    """llm-compressor keeps the model in its global session and, through torch.fx.wrap's registry, in the namespace
    its sequential tracing ran the forward in: on a 1.5B model 7.1 GB stayed into the evaluation. Released here."""
    import gc
    import weakref

    model = _saved_tiny(tmp_path)
    plan = Plan(schemes=dict.fromkeys(quantizable_linears(model), "int8"), group_size=32, avg_bits=8.0,
                estimated_kl=0.0, lm_head="int8")
    res = oneshot_quantize(model, plan, CAL, "gptq", processor=_tokenizer())
    save_checkpoint(res.model, plan, tmp_path / "ck")
    ref = weakref.ref(model)
    del model, res
    gc.collect()
    assert ref() is None


@torch.no_grad()
def test_gptq_in_row_blocks_gives_the_whole_weights_result(tmp_path, monkeypatch):
    """A weight larger than GPTQ_CHUNK_BYTES is quantized a block of rows at a time (lm_head: 152k rows at real
    size); GPTQ's rows are independent, so every Linear and the lm_head come out as from one call."""
    import accel.quant.quantize as qz

    plan = _mixed_plan(_saved_tiny(tmp_path), lm_head="int8")
    whole = oneshot_quantize(_saved_tiny(tmp_path), plan, CAL, "gptq", processor=_tokenizer()).model
    calls = []
    monkeypatch.setattr(qz, "GPTQ_CHUNK_BYTES", 4 * 64 * 7)  # 7 rows of a 64-column weight: blocks, one short
    import llmcompressor.modifiers.gptq.base as gptq_base

    original = gptq_base.quantize_weight
    monkeypatch.setattr(gptq_base, "quantize_weight", lambda *a, **k: calls.append(a[0].shape) or original(*a, **k))
    blocks = oneshot_quantize(_saved_tiny(tmp_path), plan, CAL, "gptq", processor=_tokenizer()).model
    assert calls and all(s[1] <= 7 for s in calls)  # every call saw a block of rows
    for (name, a), (_, b) in zip(whole.named_parameters(), blocks.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["group", "channel"])
def test_the_imatrix_range_search_in_row_blocks_finds_each_groups_range(monkeypatch, strategy):
    """A weight larger than GPTQ_CHUNK_BYTES has its INT4 ranges searched a block of rows at a time (an INT4 lm_head:
    each of the search's temporaries is the head's size); without the early stop every group's range is the whole
    weight's."""
    import accel.quant.quantize as qz
    from compressed_tensors.quantization import QuantizationArgs
    from llmcompressor.observers.imatrix import IMatrixMSEObserver

    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy=strategy,
                            group_size=64 if strategy == "group" else None, observer="imatrix_mse",
                            observer_kwargs={"patience": 0})
    weight, importance = torch.randn(300, 256, generator=torch.Generator().manual_seed(0)), torch.rand(256) + 0.1

    def qparams(chunk_bytes):
        monkeypatch.setattr(qz, "GPTQ_CHUNK_BYTES", chunk_bytes)
        obs = IMatrixMSEObserver(base_name="weight", args=args)
        obs._imatrix_sum, obs._imatrix_count = importance.clone(), torch.tensor(1)
        with qz._gptq_rows_at_a_time():
            obs(weight)
        return obs.get_qparams()

    seen = []
    whole = qparams(1 << 30)
    monkeypatch.setattr(IMatrixMSEObserver, "update_statistics_from_observed",
                        lambda self, o, f=IMatrixMSEObserver.update_statistics_from_observed: seen.append(o.shape[1])
                        or f(self, o))
    blocks = qparams(4 * 256 * 7)  # 7 rows a block, the last one short
    assert seen == [7] * 42 + [6]  # the library's search saw blocks only
    torch.testing.assert_close(whole["scale"], blocks["scale"], rtol=0, atol=0)
    torch.testing.assert_close(whole["zero_point"], blocks["zero_point"], rtol=0, atol=0)
