"""Real SmolLM2-135M: suffix-cached sensitivity on the last layer, tied lm_head left intact by fake quant."""

from __future__ import annotations

import pytest
import torch

from accel.quant.schemes import fake_quant, fake_quantized, quantizable_linears
from accel.quant.sensitivity import measure_sensitivity

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def real(real_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(real_model_path)


def test_real_names_and_last_layer_sensitivity(real):
    model, tok = real
    names = quantizable_linears(model)
    assert len(names) == 210
    ids = torch.tensor([tok("The capital of France is Paris. The capital of Italy is Rome.")["input_ids"]])
    last = [n for n in names if ".layers.29." in n]
    res = measure_sensitivity(model, [ids], ["int4", "int8"], group_size=64, progress=False, modules=last)
    assert list(res.damage) == [f"model.layers.29.{u}" for u in ("self_attn.qkv_proj", "self_attn.o_proj",
                                                                  "mlp.gate_up_proj", "mlp.down_proj")]
    for u in res.damage:
        assert res.damage[u]["int4"] > res.damage[u]["int8"] > 0, u


def test_real_tied_head_fake_quant_keeps_embeddings(real):
    model, _ = real
    emb = model.model.embed_tokens.weight
    before = emb[:4].clone()
    x = torch.randn(3, emb.shape[1])
    with torch.no_grad(), fake_quantized(model, {"lm_head": "int8"}, 64):
        out = model.lm_head(x)  # the head computes with its rounded copy while it runs ...
        assert model.lm_head.weight is emb and torch.equal(emb[:4], before)  # ... the table is never touched
    assert torch.allclose(out, x @ fake_quant(emb.detach(), "int8", 64).T, atol=1e-5)
    assert not torch.allclose(out, x @ emb.detach().T, atol=1e-5)
    assert model.lm_head.weight is emb and torch.equal(emb[:4], before)
