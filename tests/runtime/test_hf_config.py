"""The runtime's light config reader (`hf_config.load_config`) against transformers' AutoConfig: equal on every
field the runtime reads, for every family it runs, and AutoConfig itself wherever the file leaves a default out."""

from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

from accel.runtime.models.hf_config import REQUIRED, RUNTIME_FIELDS, load_config

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=100)
CLASSES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
           "phi3": Phi3Config}


def _same(light, auto):
    for f in RUNTIME_FIELDS:
        assert getattr(light, f, None) == getattr(auto, f, None), f


@pytest.mark.parametrize("family", sorted(CLASSES))
@pytest.mark.parametrize("extra", [{}, {"tie_word_embeddings": True, "rope_theta": 5e5}])
def test_a_saved_config_reads_light_and_equal(tmp_path, family, extra):
    from transformers import AutoConfig, PreTrainedConfig

    CLASSES[family](**SMALL, **extra).save_pretrained(tmp_path)
    light, auto = load_config(tmp_path), AutoConfig.from_pretrained(tmp_path)
    assert type(light) is PreTrainedConfig and light.model_type == family
    _same(light, auto)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_file_without_a_default_goes_through_autoconfig(tmp_path, family):
    CLASSES[family](**SMALL).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    del d[REQUIRED[family][-1]]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert type(load_config(tmp_path)) is CLASSES[family]


def test_old_rope_fields_become_rope_parameters(tmp_path):
    from transformers import AutoConfig

    LlamaConfig(**SMALL).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d.pop("rope_parameters")
    d["rope_theta"] = 1e6
    d["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(d))
    light = load_config(tmp_path)
    assert light.rope_parameters == {"type": "linear", "rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    _same(light, AutoConfig.from_pretrained(tmp_path))


@pytest.mark.integration
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"])
def test_real_folders_read_light(name):
    from transformers import AutoConfig, PreTrainedConfig

    from accel.hub import ModelNotFoundError, resolve_model

    try:
        path = resolve_model(name)
    except ModelNotFoundError:
        pytest.skip(f"{name} is not pulled")
    light = load_config(path)
    assert type(light) is PreTrainedConfig
    _same(light, AutoConfig.from_pretrained(path))
