"""Load an export (or any compressed-tensors checkpoint written by accel) into accel's runtime.

`accel.runtime.model.load_model` reads plain 16/32-bit safetensors. An export's quantized Linears are stored in
compressed-tensors form (`weight_packed` int32 + scale [+ zero point], or an int8 `weight` for int4f), so this
loader builds the runtime's CausalLM, loads the plain tensors, and swaps each quantized Linear for accel's INT8 /
INT4 kernel module straight from the stored integers (no dequantize/requantize round trip). It runs exactly what the
checkpoint stores (the lm_head included), so accel, transformers and vLLM run the same weights.
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

    from accel.quant.quantize import TABLE, _kernel_module, _read_state, share_table
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
        if prefix == TABLE:  # the INT8 table's lookups return the model's dtype
            module.dtype = dtype
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)
    share_table(model)
    model.init_rope(device, dtype)
    return model.eval().requires_grad_(False)


class ModelLoadError(ValueError):
    """A model folder that cannot be loaded: the message names the file and what is wrong with it."""


def check_model_files(path: str | Path) -> None:
    """Raise ModelLoadError naming the file when config.json or a safetensors header is unreadable (cheap: reads
    the headers only), so a damaged folder is one clear line, not a loader's traceback."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not a readable JSON file: {e}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path / 'config.json'} is not a JSON object")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    for f in files:
        problem = _safetensors_header_problem(f)
        if problem:
            raise ModelLoadError(f"{f} is not a valid safetensors file: {problem}")


def _safetensors_header_problem(f: Path) -> str | None:
    """What is wrong with a safetensors file's header (8-byte little-endian length + JSON), or None."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"the header claims {n} bytes but the file has {size - 8} after the length (truncated or damaged)"
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"the header is not valid JSON ({e})"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1] <= data_len):
            return f"tensor {name!r} has data offsets {offsets} outside the file's {data_len} data bytes"
    return None


def load_engine(path: str | Path, **engine_kwargs):
    """An `accel.runtime.engine.Engine` over an export or a plain HF folder; kwargs are EngineConfig fields
    (quant_plan is not allowed for a compressed checkpoint: its plan is in the weights). Raises ModelLoadError
    naming the file when the folder is damaged."""
    from accel.runtime.engine import Engine, EngineConfig
    from accel.runtime.model import fuse_projections

    path = Path(path)
    check_model_files(path)
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
    from accel.quant.kernels import pack_float_linears

    pack_float_linears(model)  # as Engine.from_pretrained does (oneDNN-packed float Linears)
    tokenizer = None
    if (path / "tokenizer_config.json").exists() or (path / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return Engine(model, config, tokenizer)
