"""Helpers for runtime tests: a tiny random Llama config, prompts of mixed lengths, the HF greedy oracle."""

from __future__ import annotations

import random

import torch
import transformers


def tiny_config(**overrides) -> transformers.LlamaConfig:
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
              # large init: peaked logits, so greedy argmax is far from ties and fp32 reorderings cannot flip it
              initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)


def make_hf_model(config, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def mixed_prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 60, vocab: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by transformers (the oracle), eos ignored."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()
