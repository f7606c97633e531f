"""The runtime's models: one file per family over shared layers (as vLLM's `model_executor/models/` and gpt-fast's
`model.py`), so a family is a readable forward plus a conversion.

    layers   RoPE, RMSNorm, attention, MLP: what the families share
    llama    the Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM)
    gemma3   Gemma 3 (text)
    native   the decode step in one native call (CPU)
    loading  `family_of` (config -> family, or a refusal), `load_model` (folder -> model, quantized Linears as
             kernel modules), `fuse_projections`
"""

from accel.runtime.models.layers import (MLP, Attention, RMSNorm, apply_rope, apply_rope_rolled, longs,
                                         rope_cos_sin, signed_sin)
from accel.runtime.models.llama import SUPPORTED_MODEL_TYPES, CausalLM
from accel.runtime.models.loading import FAMILIES, family_of, fuse_projections, load_model
from accel.runtime.models.native import NativeDecode

__all__ = ["FAMILIES", "MLP", "Attention", "CausalLM", "NativeDecode", "family_of", "RMSNorm", "SUPPORTED_MODEL_TYPES", "apply_rope",
           "apply_rope_rolled", "fuse_projections", "load_model", "longs", "rope_cos_sin", "signed_sin"]
