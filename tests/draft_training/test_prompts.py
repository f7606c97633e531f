"""Prompt building for distillation/evaluation, and reply stop tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from accel.draft_training.distill import stop_token_ids
from accel.draft_training.prompts import build_prompts, chat_prompts, input_grounded_prompts, parse_transcript

TRANSCRIPT = "System: Be brief.\nUser: Hi there\nAssistant: Hello!\nUser: 2+2?\nAssistant: 4"


def test_parse_transcript():
    assert parse_transcript(TRANSCRIPT) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]
    assert parse_transcript("no roles here") == []


def test_chat_prompts_end_at_each_user_turn():
    prompts = chat_prompts(TRANSCRIPT)
    assert [len(p) for p in prompts] == [2, 4]
    assert all(p[-1]["role"] == "user" for p in prompts)


def test_build_prompts_interleaves_two_chat_one_other():
    samples = [{"domain": "chat", "text": f"User: q{i}\nAssistant: a"} for i in range(5)] + \
              [{"domain": "code", "text": f"def f{i}(): pass"} for i in range(5)]
    out = build_prompts(samples, 6, seed=0)
    kinds = ["chat" if p[0]["content"].startswith("q") else "other" for p in out]
    assert kinds == ["chat", "chat", "other", "chat", "chat", "other"]
    assert build_prompts(samples, 6, seed=0) == out  # seeded
    assert len(build_prompts(samples, 100)) == 10  # everything available
    with pytest.raises(ValueError, match="num_prompts=0"):
        build_prompts(samples, 0)


def test_input_grounded_prompts_cycle_instructions():
    samples = [{"domain": "prose", "text": "Alpha."}, {"domain": "chat", "text": "x"},
               {"domain": "structured", "text": "id,name"}, {"domain": "prose", "text": "Gamma."}]
    out = input_grounded_prompts(samples, 10)
    assert len(out) == 3
    assert out[0][0]["content"].startswith("Summarize") and out[0][0]["content"].endswith("Alpha.")
    assert out[1][0]["content"].startswith("Extract") and out[2][0]["content"].startswith("Rewrite")


def test_stop_token_ids_merge_generation_config_and_tokenizer():
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7]))
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=1)) == {1, 2, 7}
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=2))
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=None)) == {2}


def test_chat_ids_use_the_template_or_the_plain_text_of_a_base_model():
    from tests.conftest import make_tiny_tokenizer

    from accel.draft_training.prompts import chat_ids

    tok = make_tiny_tokenizer()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    templated = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat_ids(tok, messages) == tok(templated, add_special_tokens=False)["input_ids"]
    tok.chat_template = None  # a base model: the turn's text as a plain prompt
    assert chat_ids(tok, messages) == tok("What is the capital of France?\n\n")["input_ids"]
