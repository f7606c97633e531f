"""Real-model checks (SmolLM2-135M): a short distillation run produces a loadable, compatible draft."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.integration


def test_train_draft_tiny_budget_then_speculate_greedy_identical(real_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from accel.draft_training.distill import train_draft
    from accel.speculative.proposer import DRAFT_META_FILE, DraftModelProposer
    from accel.speculative.reference import speculative_generate

    prompts = [[{"role": "user", "content": "Name three colours."}], [{"role": "user", "content": "Say hi."}]]
    res = train_draft(real_model_path, tmp_path / "draft", num_layers=1, time_budget_minutes=1.5, prompts=prompts,
                      max_new_tokens=8, draft_vocab_size=512, teacher_forced_fraction=0.05, progress=False)
    assert res.num_steps >= 1 and res.layer_ids == [0] and res.draft_vocab_size == 512
    meta = json.loads((tmp_path / "draft" / DRAFT_META_FILE).read_text())
    assert len(meta["vocab_ids"]) == 512 and 2 in meta["vocab_ids"]  # <|im_end|> always kept
    draft = DraftModelProposer(tmp_path / "draft", target_dir=real_model_path)
    assert draft.head.shape == (512, 576)
    target = AutoModelForCausalLM.from_pretrained(str(real_model_path), dtype=torch.float32).eval()
    prompt = [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]
    plain = speculative_generate(target, None, prompt, 12, 0).token_ids
    assert speculative_generate(target, draft, prompt, 12, 3).token_ids == plain
