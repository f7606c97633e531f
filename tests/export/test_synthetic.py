"""A random checkpoint drawn straight in its stored form (`accel.export.synthetic`): it loads as an export (kernel
modules from the stored integers), holds what its headers predict, and decodes."""

from __future__ import annotations

import pytest
import torch

from accel.export import synthetic
from accel.kernels.linear import Float16Embedding, Int4WeightOnlyLinear, Int8WeightOnlyLinear
from accel.kernels.loader import is_compressed, planned_bytes
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams

TINY = dict(synthetic.SHAPES["qwen2.5-7b"], hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)


@pytest.mark.parametrize("scheme,kind", [("int4", Int4WeightOnlyLinear), ("int8", Int8WeightOnlyLinear)])
def test_drawn_checkpoint_loads_as_an_export_and_decodes(tmp_path, scheme, kind):
    out = synthetic.write(TINY, tmp_path / "m", scheme, group_size=32)
    assert is_compressed(out)
    engine = Engine.from_pretrained(out, num_kv_blocks=8, block_size=16)
    layer = engine.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, kind) and isinstance(engine.model.lm_head, kind)
    assert isinstance(engine.model.model.embed_tokens, Float16Embedding)
    predicted, _ = planned_bytes(out, torch.float32, False, None, 32, torch.float16)
    assert engine.memory()["weights"] <= predicted * 1.05
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    done = []
    while engine.has_unfinished():
        done += [o for o in engine.step() if o.finished]
    assert done[0].request_id == rid and len(done[0].token_ids) == 5


def test_unknown_shape_or_scheme_is_refused(tmp_path):
    with pytest.raises(ValueError, match="shape 'gpt-9' is unknown; allowed: qwen2.5-7b"):
        synthetic.write("gpt-9", tmp_path)
    with pytest.raises(ValueError, match="scheme 'int3' is invalid; allowed: int4, int8"):
        synthetic.write("qwen2.5-7b", tmp_path, "int3")
