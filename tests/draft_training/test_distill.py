"""Distillation pieces on tiny random Llamas: layer choice, vocabulary, draft construction, loss, save/load."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import torch

from accel.draft_training.distill import (
    TeacherSample,
    build_draft,
    distill_loss,
    pick_layers,
    save_draft,
    select_draft_vocab,
    train_on_samples,
)
from accel.speculative.proposer import DRAFT_META_FILE, DraftModelProposer, ProposalRequest
from tests.conftest import make_tiny_llama


@pytest.mark.parametrize("total, n, expected", [(30, 2, [0, 29]), (30, 1, [0]), (30, 3, [0, 14, 29]),
                                                (30, 4, [0, 10, 19, 29]), (2, 2, [0, 1])])
def test_pick_layers_spread(total, n, expected):
    assert pick_layers(total, n, "spread") == expected


def test_pick_layers_first_is_default():
    assert pick_layers(30, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="'middle'"):
        pick_layers(30, 2, "middle")


@pytest.mark.parametrize("n", [0, 31])
def test_pick_layers_bad(n):
    with pytest.raises(ValueError, match=f"num_layers={n}"):
        pick_layers(30, n)


def test_select_draft_vocab():
    counts = Counter({7: 10, 3: 10, 9: 5, 11: 1})
    assert select_draft_vocab(counts, 3, always=[2], vocab_size=20) == [2, 3, 7]  # tie 3/7 both in; special kept
    assert select_draft_vocab(counts, 6, always=[2], vocab_size=20) == [0, 2, 3, 7, 9, 11]  # filled by id order
    assert select_draft_vocab(counts, 50, always=[], vocab_size=12) == list(range(12))
    with pytest.raises(ValueError, match="size=0"):
        select_draft_vocab(counts, 0, [], 20)


def test_build_draft_with_all_layers_reproduces_target():
    target = make_tiny_llama(seed=0, num_hidden_layers=3)
    full = build_draft(target, [0, 1, 2])
    ids = torch.tensor([[1, 5, 9, 100]])
    with torch.no_grad():
        assert torch.allclose(full(ids).logits, target(ids).logits, atol=1e-5)
        partial = build_draft(target, [0, 2])
        assert partial.config.num_hidden_layers == 2
        assert torch.equal(partial.model.layers[1].mlp.up_proj.weight, target.model.layers[2].mlp.up_proj.weight)
        assert not torch.allclose(partial(ids).logits, target(ids).logits, atol=1e-3)


def _teacher_samples(target, n=6, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for _ in range(n):
            ids = torch.randint(3, 256, (length,), generator=g).tolist()
            lp = target(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)  # [T-1, V]
            top_lp, top_ids = lp.topk(16, dim=-1)
            out.append(TeacherSample(ids, 0, top_ids, top_lp))
    return out


def test_distill_loss_is_soft_cross_entropy_over_reduced_vocab():
    target = make_tiny_llama(seed=0)
    draft = build_draft(target, [0])
    samples = _teacher_samples(target, n=1, length=5)
    vocab_ids = list(range(256))
    lookup = torch.arange(256)
    head = draft.lm_head.weight.detach()
    loss = distill_loss(draft, head, lookup, samples)
    # by hand: cross-entropy of the draft's full distribution to the renormalised top-16 target mass
    with torch.no_grad():
        logq = draft(torch.tensor([samples[0].token_ids])).logits[0, :-1].log_softmax(-1)
    p = samples[0].top_logprobs.exp()
    p = p / p.sum(-1, keepdim=True)
    expected = -(p * logq.gather(1, samples[0].top_ids)).sum(-1).mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4)
    assert len(vocab_ids) == 256


def test_training_lowers_the_loss_and_saved_draft_proposes_in_vocab(tmp_path):
    target = make_tiny_llama(seed=0)
    samples = _teacher_samples(target)
    vocab_ids = sorted(set(range(0, 256, 2)) | {int(s.top_ids[0, 0]) for s in samples})
    draft = build_draft(target, [1])
    lookup = torch.full((256,), -1)
    lookup[torch.tensor(vocab_ids)] = torch.arange(len(vocab_ids))
    head = draft.lm_head.weight.detach()[torch.tensor(vocab_ids)]
    with torch.no_grad():
        before = float(distill_loss(draft, head, lookup, samples))
    losses = train_on_samples(draft, samples, vocab_ids, deadline=time.monotonic() + 600, learning_rate=3e-3,
                              seed=0, max_steps=40)
    assert len(losses) == 40
    with torch.no_grad():
        after = float(distill_loss(draft, head, lookup, samples))
    assert after < before - 0.2  # the floor is ~ln(16): near-uniform tiny teacher
    assert not any(p.requires_grad for p in draft.parameters())
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)  # frozen

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}}}))
    out = save_draft(draft, tmp_path / "draft", tmp_path / "target", {"vocab_ids": vocab_ids})
    assert (out / "tokenizer.json").exists()
    assert json.loads((out / DRAFT_META_FILE).read_text())["vocab_ids"] == vocab_ids
    prop = DraftModelProposer(out, target_dir=tmp_path / "target")
    drafts = prop.propose([ProposalRequest([1, 2, 3], 4, "r")]).token_ids[0]
    assert len(drafts) == 4 and set(drafts) <= set(vocab_ids)


def test_train_on_no_samples_is_a_clear_error():
    with pytest.raises(ValueError, match="no training samples"):
        train_on_samples(build_draft(make_tiny_llama(), [0]), [], [0, 1], time.monotonic() + 1, 1e-3, 0)


def test_engine_teacher_samples_are_the_targets_greedy_replies(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.draft_training.distill import engine_teacher_samples

    target = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompts = [[{"role": "user", "content": "What is the capital of France?"}],
               [{"role": "user", "content": "def add(a, b):"}]]
    samples = engine_teacher_samples(target, tiny_model_dir, tok, prompts, max_new_tokens=6,
                                     deadline=time.monotonic() + 600, top_m=4)
    assert len(samples) == 2
    for s in samples:
        reply = s.token_ids[s.loss_start + 1:]
        assert 1 <= len(reply) <= 6 and s.top_ids.shape == (len(reply), 4)
        assert s.top_ids[:, 0].tolist() == reply  # the reply is the target's argmax at every position
        assert torch.all(s.top_logprobs[:, :-1] >= s.top_logprobs[:, 1:])
        # the engine's log-probs are the teacher-forced distributions of the target
        with torch.inference_mode():
            lp = target(torch.tensor([s.token_ids])).logits[0, s.loss_start: s.loss_start + len(reply)].log_softmax(-1)
        torch.testing.assert_close(lp.gather(1, s.top_ids), s.top_logprobs, atol=1e-4, rtol=1e-4)


def test_trained_head_rows_untie_the_draft_and_survive_save_and_load(tmp_path):
    from transformers import AutoModelForCausalLM

    target = make_tiny_llama(seed=0)
    samples = _teacher_samples(target)
    vocab_ids = sorted(set(range(0, 256, 2)) | {int(s.top_ids[0, 0]) for s in samples})
    draft = build_draft(target, [1])
    emb_before = draft.model.embed_tokens.weight.detach().clone()
    losses = train_on_samples(draft, samples, vocab_ids, deadline=time.monotonic() + 600, learning_rate=3e-3,
                              seed=0, max_steps=30, train_head=True)
    assert losses[-1] < losses[0]
    head = draft.get_output_embeddings().weight
    assert head.data_ptr() != draft.model.embed_tokens.weight.data_ptr() and not draft.config.tie_word_embeddings
    assert torch.equal(draft.model.embed_tokens.weight, emb_before)  # the input embedding is the target's
    outside = torch.tensor(sorted(set(range(256)) - set(vocab_ids)))
    assert torch.equal(head[outside], emb_before[outside])  # rows outside the draft vocabulary are untouched
    assert not torch.equal(head[torch.tensor(vocab_ids)], emb_before[torch.tensor(vocab_ids)])
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}}}))
    out = save_draft(draft, tmp_path / "draft", tmp_path / "target", {"vocab_ids": vocab_ids})
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(loaded.get_output_embeddings().weight, head)
    assert torch.equal(loaded.model.embed_tokens.weight, emb_before)
    prop = DraftModelProposer(out, target_dir=tmp_path / "target")
    assert torch.equal(prop.head, head[torch.tensor(vocab_ids)])


def test_distill_loss_mixes_sources_with_different_top_m():
    # engine replies keep the runtime's top-20 and teacher-forced text may keep more: one batch holds both
    target = make_tiny_llama(seed=0)
    draft = build_draft(target, [0])
    a, b = _teacher_samples(target, n=2, length=5)
    wide = TeacherSample(b.token_ids, b.loss_start, torch.cat([b.top_ids, b.top_ids[:, :3]], 1),
                         torch.cat([b.top_logprobs, b.top_logprobs[:, :3] - 50], 1))
    head, lookup = draft.lm_head.weight.detach(), torch.arange(256)
    mixed = float(distill_loss(draft, head, lookup, [a, wide]).detach())
    same = float(distill_loss(draft, head, lookup, [a, b]).detach())
    assert mixed == pytest.approx(same, rel=1e-6)
