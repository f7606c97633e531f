"""A model folder's config.json for the runtime, without transformers' model registry where the file says enough.

Why: transformers 5 builds a family's config class only after importing its auto machinery (`@auto_docstring`
pulls in generation utilities, and with them scikit-learn, SciPy and torch._dynamo): ~2,100 modules, 3 s and
0.3 GB of RSS on top of torch, before a weight is read. That is a quarter of what serving Qwen2.5-1.5B at INT4
holds. The runtime reads a few dozen fields; where config.json states every field the family's config class would
otherwise default (`REQUIRED`, what transformers' `save_pretrained` writes), they are read from the file into a
plain `PreTrainedConfig` (its rope settings in transformers 5's `rope_parameters` form). A file that leaves one
out goes through `AutoConfig`, whose class knows the default. tests/runtime/test_hf_config.py holds the two equal
on every field the runtime reads, for every family.
"""

from __future__ import annotations

import json
from pathlib import Path

COMMON = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings")
# per family: the fields its config class defaults that the runtime reads (beyond COMMON and the rope settings)
REQUIRED = {
    "llama": ("hidden_act", "attention_bias", "mlp_bias"),
    "mistral": ("hidden_act", "sliding_window"),
    "qwen2": ("hidden_act", "sliding_window", "use_sliding_window", "layer_types"),
    "qwen3": ("hidden_act", "attention_bias", "sliding_window", "use_sliding_window", "layer_types", "head_dim"),
    "phi3": ("hidden_act", "sliding_window"),
}
RUNTIME_FIELDS = COMMON + ("hidden_act", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
                           "layer_types", "head_dim", "rope_parameters", "bos_token_id", "eos_token_id",
                           "pad_token_id")
"""Every config field the runtime's families read (the test compares these)."""


def _rope(d: dict) -> dict | None:
    """transformers 5's `rope_parameters` of a config dict (a file may still hold rope_theta / rope_scaling)."""
    if isinstance(d.get("rope_parameters"), dict):
        return d["rope_parameters"]
    if "rope_theta" not in d:
        return None
    scaling = d.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return {**scaling, "rope_type": rope_type,
            "rope_theta": d["rope_theta"]}


def load_config(path: str | Path):
    """The config of the model folder `path` (see the module doc: light where the file is complete)."""
    path = Path(path)
    d = json.loads((path / "config.json").read_text())
    family = d.get("model_type")
    rope = _rope(d)
    if family in REQUIRED and rope is not None and all(k in d for k in COMMON + REQUIRED[family]):
        from transformers.configuration_utils import PreTrainedConfig

        config = PreTrainedConfig(**{k: v for k, v in d.items() if k not in ("rope_theta", "rope_scaling",
                                                                         "rope_parameters")},
                                  rope_parameters=rope)
        config.model_type = family
        config.name_or_path = str(path)
        return config
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)
