"""Which loader accepts which layer, read from config.json with the loaders' own rules (vLLM's parser among them)."""

from __future__ import annotations

import json

import pytest

from accel.export.checkpoint import verify_export, write_export
from accel.export.compatibility import VllmCheckUnavailable, loader_support


def _group(bits, fmt, targets, **w):
    weights = {"num_bits": bits, "type": "int", "symmetric": bits == 8, "strategy": "channel" if bits == 8 else "group",
               "group_size": None if bits == 8 else 64, **w}
    return {"targets": targets, "format": fmt, "weights": weights, "input_activations": None}


def _config(*groups, ignore=()):
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": "mixed-precision",
                                    "config_groups": {f"group_{i}": g for i, g in enumerate(groups)},
                                    "ignore": list(ignore)}}


L0 = "model.layers.0.self_attn."
QKV = [L0 + "q_proj", L0 + "k_proj", L0 + "v_proj"]


def test_pack_quantized_int4_and_int8_load_everywhere_but_int8_weight_only_on_vllms_cpu_kernels():
    s = loader_support(_config(_group(8, "pack-quantized", QKV + ["lm_head"]),
                               _group(4, "pack-quantized", [L0 + "o_proj"])))
    assert all(s[n].loads for n in ("accel", "transformers", "vllm")) and not s["vllm"].refused
    assert set(s["vllm-cpu"].refused) == set(QKV + ["lm_head"])  # W8A16: its CPU WNA16 kernel takes 4 bits
    assert "uint4" in s["vllm-cpu"].refused[L0 + "q_proj"]
    assert all(v.loads for v in loader_support({}).values())  # an unquantized folder


def test_vllms_cpu_kernels_take_int4_at_widths_of_32_and_w8a8():
    shape = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}
    s = loader_support({**shape, **_config(_group(4, "pack-quantized", QKV + [L0 + "o_proj"]))})
    assert s["vllm-cpu"].loads
    # its AVX2 build has no WNA16 kernel (run here: "no attribute 'cpu_gemm_wna16'" on an AVX2-only EPYC)
    assert not s["vllm-cpu-avx2"].loads and "AVX2 build" in s["vllm-cpu-avx2"].refused[L0 + "q_proj"]
    odd = {**shape, "hidden_size": 600, "num_attention_heads": 10, "num_key_value_heads": 2}
    s = loader_support({**odd, **_config(_group(4, "pack-quantized", QKV))})
    assert not s["vllm-cpu"].loads and "multiples of 32" in s["vllm-cpu"].refused[L0 + "q_proj"] and s["vllm"].loads
    w8a8 = _group(8, "int-quantized", QKV)
    w8a8["input_activations"] = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                 "dynamic": True}
    assert loader_support({**shape, **_config(w8a8)})["vllm-cpu"].loads
    assert loader_support({**shape, **_config(w8a8)})["vllm-cpu-avx2"].loads


def test_vllm_refuses_int_quantized_weight_only_and_float_zero_points():
    s = loader_support(_config(_group(8, "int-quantized", QKV)))
    assert not s["vllm"].loads and "'pack-quantized' only" in s["vllm"].refused[L0 + "q_proj"]
    assert s["accel"].loads and s["transformers"].loads
    s = loader_support(_config(_group(4, "int-quantized", QKV, symmetric=False, zp_dtype="torch.float16")))
    assert not s["vllm"].loads and "float zero points" in s["vllm"].refused[L0 + "k_proj"]


def test_vllm_refuses_a_fused_module_split_across_schemes():
    s = loader_support(_config(_group(4, "pack-quantized", QKV[:1]), _group(8, "pack-quantized", QKV[1:])))
    assert list(s["vllm"].refused) == [L0 + "qkv_proj"] and "one Linear with one scheme" in s["vllm"].refused[
        L0 + "qkv_proj"]
    s = loader_support(_config(_group(8, "pack-quantized", QKV[1:]), ignore=QKV[:1]))  # q left 16-bit
    assert list(s["vllm"].refused) == [L0 + "qkv_proj"]
    assert s["accel"].loads and s["transformers"].loads


def test_the_manifest_and_verify_say_which_loaders_accept_which_layers(tmp_path, tiny_model_dir, monkeypatch):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(_config(_group(8, "int-quantized", QKV)))
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    out = write_export(tmp_path / "export", tiny_model_dir)
    loaders = json.loads((out / "accel.json").read_text())["loaders"]
    assert loaders["accel"] == {"loads": True, "refused": {}} and not loaders["vllm"]["loads"]
    res = verify_export(out, load=False, target="transformers")
    assert res.ok and res.details["loaders"]["vllm"]["refused"]
    res = verify_export(out, load=False, target="accel")
    assert res.ok
    monkeypatch.setenv("ACCEL_VLLM_PYTHON", str(tmp_path / "no-venv" / "python"))
    with pytest.raises(VllmCheckUnavailable, match="setup_vllm_check.sh"):
        verify_export(out, load=False, target="vllm")
    with pytest.raises(ValueError, match="target='tgi' is invalid"):
        verify_export(out, load=False, target="tgi")


def test_cli_verify_prints_each_loader_and_fails_a_refused_target(tmp_path, tiny_model_dir, monkeypatch):
    from typer.testing import CliRunner

    from accel.cli import app

    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(_config(_group(4, "int-quantized", QKV, symmetric=False, zp_dtype="torch.float16")))
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    out = write_export(tmp_path / "export", tiny_model_dir)
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load"])
    assert res.exit_code == 0 and "accel: loads every layer" in res.output and "vllm: refuses 3 layers" in res.output
    monkeypatch.setenv("ACCEL_VLLM_PYTHON", str(tmp_path / "no-venv" / "python"))
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load", "--target", "vllm"])
    assert res.exit_code == 2 and "setup_vllm_check.sh" in res.output
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load", "--target", "tgi"])
    assert res.exit_code == 2 and "allowed: accel, transformers, vllm" in res.output


def test_the_vllm_speculative_config_of_each_pairing(tmp_path):
    from accel.export.compatibility import vllm_speculative_config

    ngram = {"method": "ngram", "num_speculative_tokens": 4, "ngram": {"min_n": 2, "max_n": 4}}
    assert vllm_speculative_config(ngram, None) == {"method": "ngram", "num_speculative_tokens": 4,
                                                   "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    layers, eagle = tmp_path / "layers", tmp_path / "eagle"
    for d, method in ((layers, "distilled"), (eagle, "eagle")):
        d.mkdir()
        (d / "accel_draft.json").write_text(json.dumps({"method": method}))
    pairing = {"method": "distilled", "num_speculative_tokens": 3}
    assert vllm_speculative_config(pairing, layers) == {"method": "draft_model", "model": "draft",
                                                         "num_speculative_tokens": 3}
    assert vllm_speculative_config(pairing, eagle) is None  # reads the target's features: accel's runtime only
    assert vllm_speculative_config({"method": "none"}, None) is None and vllm_speculative_config(None, None) is None
