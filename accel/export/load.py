"""Load an export (or any compressed-tensors checkpoint written by accel) into accel's runtime.

`accel.runtime.model.load_model` reads plain 16/32-bit safetensors. An export's quantized Linears are stored in
compressed-tensors form (`weight` int8 + `weight_scale`, or `weight_packed` int32 + scale + zero point), so this
loader builds the runtime's CausalLM, loads the plain tensors, and swaps each quantized Linear for accel's INT8 /
INT4 kernel module straight from the stored integers (no dequantize/requantize round trip). The lm_head scheme of
the plan (`accel_plan.json`) is applied on load when llm-compressor left it out (a tied lm_head).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def is_compressed(path: str | Path) -> bool:
    """True when `path/config.json` carries a compressed-tensors `quantization_config`."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    q = json.loads(cfg.read_text()).get("quantization_config") or {}
    return q.get("quant_method") == "compressed-tensors"


def load_runtime_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The runtime's CausalLM for an HF folder, quantized (compressed-tensors) or not."""
    from transformers import AutoConfig

    from accel.quant import kernels
    from accel.quant.allocate import Plan
    from accel.quant.quantize import PLAN_FILE, _kernel_module, _read_state
    from accel.runtime.model import CausalLM, load_model

    path, device = Path(path), torch.device(device)
    if not is_compressed(path):
        return load_model(path, dtype, device)
    config = AutoConfig.from_pretrained(path)
    del config.quantization_config
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    if model.tie_word_embeddings:  # to_empty breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    state = _read_state(path)
    quant = {k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_scale")}
    plain = {k: v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)
             for k, v in state.items() if k.rsplit(".", 1)[0] not in quant}
    if model.tie_word_embeddings:
        plain.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(plain, strict=False)
    missing = [m for m in missing if m.rsplit(".", 1)[0] not in quant
               and not (model.tie_word_embeddings and m == "lm_head.weight")]
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the {config.model_type} architecture: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    for prefix in sorted(quant):
        bias = state.get(f"{prefix}.bias")
        module = _kernel_module(state, prefix, None, None if bias is None else bias.to(dtype)).to(device)
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)
    plan_file = path / PLAN_FILE
    if plan_file.is_file():
        plan = Plan.from_json(plan_file)
        if plan.lm_head != "fp16" and "lm_head" not in quant:
            kernels.apply_plan(model, {"lm_head": plan.lm_head}, plan.group_size)
    model.init_rope(device, dtype)
    return model.eval().requires_grad_(False)


def load_engine(path: str | Path, **engine_kwargs):
    """An `accel.runtime.engine.Engine` over an export or a plain HF folder; kwargs are EngineConfig fields
    (quant_plan is not allowed for a compressed checkpoint: its plan is in the weights)."""
    from accel.runtime.engine import Engine, EngineConfig
    from accel.runtime.model import fuse_projections

    path = Path(path)
    if not is_compressed(path):
        return Engine.from_pretrained(path, **engine_kwargs)
    config = EngineConfig(model=str(path), **engine_kwargs)
    if config.quant_plan:
        raise ValueError(f"{path} is already quantized (compressed-tensors); do not pass quant_plan")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = config.resolve_device()
    model = load_runtime_model(path, config.resolve_dtype(device), device)
    if config.fuse_projections:
        fuse_projections(model)
    if getattr(config, "pack_linears", False):  # as Engine.from_pretrained does (oneDNN-packed float Linears)
        from accel.quant.kernels import pack_float_linears

        pack_float_linears(model)
    tokenizer = None
    if (path / "tokenizer_config.json").exists() or (path / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return Engine(model, config, tokenizer)
