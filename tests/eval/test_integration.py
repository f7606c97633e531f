"""The real SmolLM2-135M on a slice of the real eval data (tens of seconds)."""

import copy
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.mark.skipif(not (REPO / "eval/text").exists(), reason="needs eval/")
def test_smollm2_vs_int8_fake_quant_on_real_data(real_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.eval import from_hf, run_eval

    tok = AutoTokenizer.from_pretrained(real_model_path)
    base = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32)
    variant = copy.deepcopy(base)
    for name, mod in variant.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            scale = mod.weight.abs().amax(1, keepdim=True) / 127  # [out, 1] per output channel
            mod.weight.data = torch.round(mod.weight.data / scale) * scale
    r = run_eval(
        from_hf(variant, tok, name="int8"), from_hf(base, tok, name="fp32"),
        text_dir=REPO / "eval/text", tasks_dir=REPO / "eval/tasks", domains=["prose", "code"],
        window=128, max_windows_per_domain=1, tasks=["arithmetic"], max_examples_per_task=2, progress=False,
    )
    assert r.protocol.separator_id == 2  # <|im_end|>, from generation_config, not the tokenizer's eos
    assert r.overall.num_tokens_scored == 2 * 127
    # Per-channel INT8 weights barely move SmolLM2: llama.cpp's Q8_0 reference is KL 0.0044 / top-1 95.7%.
    assert 0 < r.overall.kl_mean < 0.02 and r.overall.top1_agreement > 0.9
    assert 1.5 < r.domains["prose"].ppl_baseline < 200  # 127 tokens of short context: ~67 measured
    assert r.tasks["arithmetic"].model.n == 2 and len(r.tasks["arithmetic"].records) == 2
