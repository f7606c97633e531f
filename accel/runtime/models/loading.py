"""A model folder to a runtime model: pick the family by `model_type` (refusing, before any weight is read, what
no family runs), build its module tree, load its weights (`accel.kernels.loader`), then fuse the q/k/v and
gate/up projections for the fused kernels."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from accel.runtime.models import gemma3, llama
from accel.runtime.models.llama import CausalLM

FAMILIES: dict[str, type[CausalLM]] = {
    **{t: llama.CausalLM for t in llama.SUPPORTED_MODEL_TYPES},
    **{t: gemma3.CausalLM for t in gemma3.SUPPORTED_MODEL_TYPES},
}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # position-independent: one cos/sin table


def family_of(config) -> type[CausalLM]:
    """The runtime class that runs `config`, or NotImplementedError naming what accel does not run and what it
    does; checked from the config alone, before any weight is read."""
    if config.model_type not in FAMILIES:
        raise NotImplementedError(f"model_type={config.model_type!r} is not supported; supported: "
                                  f"{', '.join(FAMILIES)}")
    params = getattr(config, "rope_parameters", None) or {}
    for p in (params.values() if all(isinstance(v, dict) for v in params.values()) and params else [params]):
        rope_type = p.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise NotImplementedError(f"rope_type={rope_type!r} (position-dependent rescaling) is not supported; "
                                      f"supported: {', '.join(ROPE_TYPES)}")
        if p.get("partial_rotary_factor", 1.0) != 1.0:
            raise NotImplementedError(f"partial_rotary_factor={p['partial_rotary_factor']} is not supported; "
                                      "supported: 1.0 (RoPE over the whole head)")
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    from accel.runtime.models.layers import ACTIVATIONS

    if act not in ACTIVATIONS:
        raise NotImplementedError(f"hidden activation {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return FAMILIES[config.model_type]


def _fuse(parent: nn.Module, names: tuple[str, ...], fused_name: str) -> bool:
    """Replace plain nn.Linear siblings `names` by one nn.Linear `fused_name` (outputs concatenated in order).

    Only when all are exactly nn.Linear with the same dtype/device (i.e. not swapped for quantized kernels):
    one GEMM instead of several reads the input once and launches fewer ops, which matters at batch 1.
    """
    if hasattr(parent, fused_name):  # fused in the checkpoint (a quantized Phi-3 qkv_proj)
        return True
    mods = [getattr(parent, n) for n in names]
    if any(type(m) is not nn.Linear for m in mods):
        return _fuse_quantized(parent, names, fused_name, mods)
    if len({(m.weight.dtype, m.weight.device) for m in mods}) != 1:
        return False
    w = torch.cat([m.weight for m in mods])
    biases = [m.bias for m in mods if m.bias is not None]
    fused = nn.Linear(w.shape[1], w.shape[0], bias=bool(biases), device=w.device, dtype=w.dtype)
    fused.weight.data.copy_(w)
    if biases:  # in the biases' own dtype (fp32 beside fp16 weights, `weight_dtype`)
        fused.bias = nn.Parameter(torch.cat([m.bias if m.bias is not None else torch.zeros(
            m.out_features, device=w.device, dtype=biases[0].dtype) for m in mods]))
    for n in names:
        delattr(parent, n)
    setattr(parent, fused_name, fused.requires_grad_(False))
    return True


def _fuse_quantized(parent: nn.Module, names: tuple[str, ...], fused_name: str, mods: list[nn.Module]) -> bool:
    """Siblings quantized with one scheme (and group size) become one quantized Linear (`concat_quantized`)."""
    from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear, concat_quantized

    kinds = {(type(m), getattr(m, "group_size", None)) for m in mods}
    if len(kinds) != 1 or not isinstance(mods[0], (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
        return False
    fused = concat_quantized(mods)
    for n in names:
        delattr(parent, n)
    setattr(parent, fused_name, fused)
    return True


def fuse_projections(model: CausalLM) -> list[str]:
    """Fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj` where they share one scheme (fp, int8, or int4
    with one group size); mixed-precision siblings stay separate.

    Run after a quantization plan was applied (plans name the HF modules); returns the fused module names.
    """
    fused = []
    for i, layer in enumerate(model.model.layers):
        if _fuse(layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj"):
            fused.append(f"model.layers.{i}.self_attn.qkv_proj")
        if _fuse(layer.mlp, ("gate_proj", "up_proj"), "gate_up_proj"):
            fused.append(f"model.layers.{i}.mlp.gate_up_proj")
    return fused


@contextlib.contextmanager
def _no_init():
    """Modules built without initializing their (meta) weights, which the checkpoint replaces: torch's init
    functions on the meta device import torch._dynamo (2 s, and sympy with it) for nothing."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "trunc_normal_")
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(nn.init, n, f)


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device, plan: dict[str, str] | None = None,
               group_size: int = 64, linear_dtype: torch.dtype | None = None) -> CausalLM:
    """Build the model from `path`/config.json on the meta device and load its weights (HF names) module by module
    (`accel.kernels.loader.load_weights`, the one way from disk to kernels): plain tensors as stored, an export's
    quantized Linears as kernel modules, the Linears `plan` names quantized as they are read (`--quant`). A model
    served quantized on a CPU keeps a 16-bit token table at 16 bits (`Float16Embedding`), as its export stores it;
    so does one whose unquantized Linears are held in `linear_dtype` (fp16, `RuntimeConfig.weight_dtype`)."""
    from accel.schemes import quantized as quantizes
    from accel.kernels.loader import is_compressed, load_weights, table_dtype_for
    from accel.runtime.models.hf_config import load_config

    path = Path(path)
    config = load_config(path)
    if hasattr(config, "quantization_config"):  # the plan is in the weights
        del config.quantization_config
    family = family_of(config)
    with torch.device("meta"), _no_init():
        model = family(config)
    quantized = is_compressed(path) or any(quantizes(s) for s in (plan or {}).values())
    table_dtype = table_dtype_for(quantized or linear_dtype is not None, dtype, device)
    load_weights(model, path, dtype, device, model.tie_word_embeddings, plan, group_size, table_dtype, linear_dtype)
    model.post_load()
    model.init_rope(device, dtype)
    return model.eval().requires_grad_(False)
