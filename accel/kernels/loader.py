"""A checkpoint's tensors into a model, quantized Linears as accel's kernel modules: the one way from disk to kernels.

`load_weights(model, folder, dtype, device)` fills any module tree with Hugging Face names (the runtime's CausalLM,
or a transformers model for evaluation): plain tensors are loaded as they are; each compressed-tensors quantized
Linear (`weight_packed` int32 + scale [+ zero point], or an int8 `weight` with a scale) becomes an INT8 / INT4
kernel module built straight from the stored integers, so accel runs exactly what the checkpoint stores and what
transformers and vLLM load. A tied INT8 table is held once (`share_table`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

TABLE = "model.embed_tokens"  # the token table (tied to lm_head in small models)


def is_compressed(path: str | Path) -> bool:
    """True when `path/config.json` carries a compressed-tensors `quantization_config`."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    q = json.loads(cfg.read_text()).get("quantization_config") or {}
    return q.get("quant_method") == "compressed-tensors"


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's weight files: those its index names, else every *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def read_state(folder: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, on `device`."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in safetensors_files(Path(folder)):
        state.update(load_file(str(f), device=str(device)))
    return state


W8A8_ACTIVATIONS = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
"""The input activations accel runs (vLLM's dynamic per-token INT8, W8A8's): compressed-tensors' QuantizationArgs
fields that must hold; an export quantizing activations any other way is refused."""


def activation_mismatch(act: dict) -> dict:
    """The fields of an `input_activations` config where it differs from W8A8_ACTIVATIONS ({} where accel runs it)."""
    return {k: act.get(k) for k, v in W8A8_ACTIVATIONS.items() if act.get(k) != v}


def activation_quantized(config: dict) -> list[str]:
    """The targets of the config groups that quantize their Linears' input activations (W8A8: `W8A8_ACTIVATIONS`),
    from a config.json: module names, "re:" patterns or "Linear" (`targeted`). Raises ValueError naming the group
    for any other activation scheme."""
    qc = config.get("quantization_config") or {}
    out: list[str] = []
    for name, group in (qc.get("config_groups") or {}).items():
        act = group.get("input_activations")
        if not act:
            continue
        bad = activation_mismatch(act)
        if bad:
            raise ValueError(f"config group {name!r}: input activations {bad}; accel runs only dynamic "
                             f"per-token symmetric INT8 (W8A8: {W8A8_ACTIVATIONS})")
        out += group.get("targets") or []
    return out


def targeted(name: str, targets: list[str]) -> bool:
    """Whether quantized Linear `name` is one of compressed-tensors `targets`: its name, a "re:" pattern it matches,
    or the class name "Linear"."""
    import re

    return any(t == name or t == "Linear" or (t.startswith("re:") and re.match(t[3:], name)) for t in targets)


def kernel_module(state: dict[str, torch.Tensor], prefix: str, group_size: int | None, bias,
                  a8: bool = False) -> nn.Module:
    """The kernel module of quantized Linear `prefix` from its stored tensors (compressed-tensors' forms); `a8`:
    its input activations are W8A8's 8-bit rows (per-channel INT8 weights only)."""
    from accel.kernels import linear as kernels

    if f"{prefix}.weight_packed" in state:
        if f"{prefix}.weight_g_idx" in state:
            raise ValueError(f"{prefix}: activation-ordered groups (weight_g_idx) are not supported by accel kernels")
        packed, shape = state[f"{prefix}.weight_packed"], state[f"{prefix}.weight_shape"]
        bits = packed.shape[1] * 32 // int(shape[1])  # dense packing: ceil(in * bits / 32) words a row
        if bits in (5, 8):  # int5 (5-bit codes, held as int8g) or int8 / int8g
            w = (kernels.int8_from_compressed_tensors(packed, shape) if bits == 8 else
                 kernels.int5_from_compressed_tensors(packed, shape))
            scale = kernels.per_block_scales(state[f"{prefix}.weight_scale"], int(shape[1]))
            return kernels.Int8WeightOnlyLinear.from_quantized(w, scale, bias=bias)
        if bits != 4:
            raise ValueError(f"{prefix}: {bits}-bit packed weights have no accel kernel; allowed: 4, 5, 8 bits")
        q, scales, zeros = kernels.int4_from_compressed_tensors(
            state[f"{prefix}.weight_packed"], state[f"{prefix}.weight_scale"], state[f"{prefix}.weight_shape"],
            state.get(f"{prefix}.weight_zero_point"))
        if group_size is None:
            group_size = q.shape[1] // scales.shape[1]
        return kernels.Int4WeightOnlyLinear.from_quantized(q, scales, zeros, group_size, bias=bias)
    w = state.get(f"{prefix}.weight")
    if w is None and prefix == "lm_head":  # a tied table: the lm_head's integers are the embedding's
        w = state[f"{TABLE}.weight"]
    if prefix == TABLE:
        return kernels.Int8Embedding(w, kernels.per_block_scales(state[f"{prefix}.weight_scale"], w.shape[1]))
    if w.dtype != torch.int8:
        raise ValueError(f"{prefix}.weight is {w.dtype}; expected int8 for an int-quantized layer")
    scale = state[f"{prefix}.weight_scale"]
    zp = state.get(f"{prefix}.weight_zero_point")
    if scale.dim() == 2 and scale.shape[1] > 1 and zp is not None:  # 4-bit values in an int8 container ("int4f")
        if int(w.min()) < -8 or int(w.max()) > 7:
            raise ValueError(f"{prefix}: group-wise int-quantized layer needs 4-bit values in [-8, 7] and a zero point")
        q = (w.to(torch.int16) + 8).to(torch.uint8)  # signed -> the kernels' [0, 15]
        zeros = zp.float().reshape(scale.shape) + 8.0
        zeros = zeros if zp.is_floating_point() else zeros.to(torch.uint8)
        return kernels.Int4WeightOnlyLinear.from_quantized(q, scale.float(), zeros,
                                                           group_size or w.shape[1] // scale.shape[1], bias=bias)
    scale = kernels.per_block_scales(scale, w.shape[1])
    if a8 and scale.dim() == 2 and scale.shape[1] > 1:
        raise ValueError(f"{prefix}: 8-bit activations (W8A8) need per-channel INT8 weights, not group-wise")
    return kernels.Int8WeightOnlyLinear.from_quantized(w, scale, bias=bias, a8=a8)  # per channel, or int8g


def share_table(model: nn.Module) -> None:
    """A tied INT8 table held once: the embedding gathers rows from the lm_head kernel's own int8 tensor."""
    from accel.kernels.linear import Int8Embedding, Int8WeightOnlyLinear

    table, head = model.get_submodule(TABLE), model.lm_head
    if isinstance(table, Int8Embedding) and isinstance(head, Int8WeightOnlyLinear) and \
            torch.equal(table.qweight, head.qweight):
        table.qweight = head.qweight


def load_weights(model: nn.Module, folder: str | Path, dtype: torch.dtype, device: torch.device,
                 tied: bool) -> nn.Module:
    """Fill `model` (HF module names; its float tensors already in `dtype` on `device`) from the folder: plain
    tensors loaded, quantized Linears swapped for kernel modules. `tied`: lm_head shares the token table. Raises
    ValueError naming what does not match."""
    folder = Path(folder)
    a8_targets = activation_quantized(json.loads((folder / "config.json").read_text())) \
        if (folder / "config.json").is_file() else []
    state = read_state(folder, device)
    if hasattr(model, "checkpoint_state"):  # a runtime family's own names (Phi-3's fused projections split)
        state = model.checkpoint_state(state)
    quant = {k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_scale")}
    plain = {k: v.to(dtype) if v.is_floating_point() else v
             for k, v in state.items() if k.rsplit(".", 1)[0] not in quant}
    if tied:
        plain.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(plain, strict=False)
    missing = [m for m in missing if m.rsplit(".", 1)[0] not in quant and not (tied and m == "lm_head.weight")
               and "rotary_emb" not in m]
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model's architecture: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for prefix in sorted(quant):
        bias = state.get(f"{prefix}.bias")
        module = kernel_module(state, prefix, None, None if bias is None else bias.to(dtype),
                               a8=targeted(prefix, a8_targets)).to(device)
        if prefix == TABLE:  # the INT8 table's lookups return the model's dtype, scaled as the module they replace
            module.dtype = dtype
            scale = getattr(model.get_submodule(TABLE), "embed_scale", None)
            module.embed_scale = None if scale is None else torch.as_tensor(scale).float()
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)
    share_table(model)
    return model


def load_hf_model(folder: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A transformers model of the folder (for evaluation next to transformers' own), its quantized Linears as
    kernel modules (weights stay quantized in memory), exactly as stored."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # random init, overwritten below
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return load_weights(model, folder, dtype, torch.device("cpu"), tied).eval()
