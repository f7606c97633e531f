"""The runtime on the real SmolLM2-135M: greedy output token-identical to transformers."""

from __future__ import annotations

import pytest
import torch

from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a forest, there lived an old clockmaker who",
    "List three colors:",
    "Translate to French: good morning",
    "The capital of France is Paris. The capital of Germany is",  # shares a prefix with prompt 0
]


@pytest.mark.integration
def test_real_model_greedy_matches_transformers(real_model_path):
    from transformers import AutoModelForCausalLM

    # a small token budget (chunked prefill) and a small pool (preemption), prefix caching on
    engine = Engine.from_pretrained(real_model_path, block_size=4, num_kv_blocks=20, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    hf = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([engine.tokenizer.encode(prompt)])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                              eos_token_id=None)[0, ids.shape[1]:].tolist()
        assert out.token_ids == ref, prompt
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hit_rate > 0
    assert engine.kv.num_held_blocks() == 0
