"""Shared fixtures: tiny random Llama models for unit tests, the real model for integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_model_path():
    """The real SmolLM2-135M-Instruct as a local HF folder (pulled into $ACCEL_HOME on first use)."""
    from accel.models import resolve_model

    return resolve_model("smollm2-135m", pull_if_missing=True)


def make_tiny_llama(seed: int = 0, **overrides):
    """A tiny random LlamaForCausalLM (fp32, eval mode) for unit tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


@pytest.fixture
def tiny_llama():
    return make_tiny_llama()
