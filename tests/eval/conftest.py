"""Fixtures: a tiny random Llama with a byte-level tokenizer, and tiny eval data folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS_ID = 256
VOCAB = 260  # 256 byte tokens + <eos> + unused ids


def make_byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (ids 0-255), <eos> = 256, and a one-line chat template."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<eos>"] = EOS_ID
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")
    tok.chat_template = (
        "{% for m in messages %}U:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    return tok


def make_tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def byte_tokenizer() -> PreTrainedTokenizerFast:
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    return make_tiny_llama(0)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def eval_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """eval/text with two domains and eval/tasks with two tasks, small enough for the tiny model."""
    text, tasks = tmp_path / "text", tmp_path / "tasks"
    write_jsonl(text / "prose.jsonl", [
        {"id": "p1", "domain": "prose", "text": "The cat sat on the mat.", "source": "test"},  # 23 bytes
        {"id": "p2", "domain": "prose", "text": "A dog ran.", "source": "test"},  # 10 bytes
    ])
    write_jsonl(text / "code.jsonl", [
        {"id": "c1", "domain": "code", "text": "def f(x):\n    return x + 1\n", "source": "test"},  # 27 bytes
    ])
    write_jsonl(tasks / "arithmetic.jsonl", [
        {"id": "a1", "task": "arithmetic", "prompt": "2+2?", "answer": "4", "match": "number"},
        {"id": "a2", "task": "arithmetic", "prompt": "3+4?", "answer": 7, "match": "number"},
    ])
    write_jsonl(tasks / "multiple_choice.jsonl", [
        {"id": "m1", "task": "multiple_choice", "prompt": "Pick one", "answer": "B", "choices": ["x", "y"],
         "match": "choice"},
    ])
    return text, tasks
