"""Proposers: n-gram wrapper, draft model with its own cache, reduced vocabulary, tokenizer check."""

from __future__ import annotations

import json

import pytest
import torch

from accel.speculative.proposer import (DRAFT_META_FILE, DraftModelProposer, NgramFirstProposer, NgramProposer,
                                  ProposalRequest, Proposals, Proposer)
from accel.speculative.tokenizer_check import TokenizerMismatchError, check_tokenizers_match, tokenizer_difference
from tests.conftest import make_tiny_llama


def reference_greedy(model, ids: list[int], k: int, vocab_ids: list[int] | None = None) -> list[int]:
    """k greedy tokens with full recomputation (no cache), optionally restricted to vocab_ids."""
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(k):
            logits = model(torch.tensor([ids])).logits[0, -1]
            if vocab_ids is not None:
                mask = torch.full_like(logits, float("-inf"))
                mask[vocab_ids] = 0
                logits = logits + mask
            tok = int(logits.argmax())
            out.append(tok)
            ids.append(tok)
    return out


def test_ngram_proposer_batch():
    prop = NgramProposer(min_n=2, max_n=3)
    out = prop.propose([ProposalRequest([1, 2, 3, 4, 1, 2], 2), ProposalRequest([5, 6, 7], 2),
                        ProposalRequest([1, 2, 3, 1, 2], 0)])
    assert out.token_ids == [[3, 4], [], []] and out.probs is None
    with pytest.raises(ValueError, match="min_n=3, max_n=2"):
        NgramProposer(3, 2)


def test_draft_proposer_matches_uncached_greedy_and_rolls_back():
    model = make_tiny_llama(seed=3)
    prop = DraftModelProposer(model)
    prompt = [1, 5, 9, 33, 71, 4]
    first = prop.propose([ProposalRequest(prompt, 4, "r")])
    assert first.token_ids == [reference_greedy(model, prompt, 4)]
    q = first.probs[0]
    assert q.shape == (4, 256) and torch.equal(q.argmax(-1), torch.tensor(first.token_ids[0]))
    # two drafts accepted + a different recovered token: the cache must be cropped to the verified prefix
    verified = prompt + first.token_ids[0][:2] + [17]
    second = prop.propose([ProposalRequest(verified, 3, "r")])
    assert second.token_ids == [reference_greedy(model, verified, 3)]
    assert prop.states["r"].token_ids == verified + second.token_ids[0][:2]
    # all accepted + bonus token: the cache extends without recomputation
    verified2 = verified + second.token_ids[0] + [8]
    assert prop.propose([ProposalRequest(verified2, 2, "r")]).token_ids == [reference_greedy(model, verified2, 2)]
    prop.finish("r")
    assert "r" not in prop.states


def test_draft_proposer_several_requests_and_k_zero():
    model = make_tiny_llama(seed=3)
    prop = DraftModelProposer(model)
    a, b = [1, 2, 3], [1, 7, 7, 7, 200]
    out = prop.propose([ProposalRequest(a, 2, "a"), ProposalRequest(b, 3, "b"), ProposalRequest(a, 0, "c")])
    assert out.token_ids == [reference_greedy(model, a, 2), reference_greedy(model, b, 3), []]
    assert out.probs[2].shape == (0, 256)


def test_draft_proposer_reduced_vocab():
    model = make_tiny_llama(seed=4)
    vocab_ids = list(range(0, 256, 3))
    prop = DraftModelProposer(model, vocab_ids=vocab_ids)
    prompt = [1, 10, 20, 30]
    out = prop.propose([ProposalRequest(prompt, 3, "r")])
    assert out.token_ids == [reference_greedy(model, prompt, 3, vocab_ids)]
    assert all(t % 3 == 0 for t in out.token_ids[0])


def test_draft_proposer_sampling_is_seeded_and_consistent():
    from accel.runtime.sampling_params import SamplingParams

    model = make_tiny_llama(seed=5)
    prop = DraftModelProposer(model, vocab_ids=list(range(128)))
    params = SamplingParams(temperature=0.7, top_k=20, seed=1)

    def run(seed):
        return prop.propose([ProposalRequest([1, 2, 3], 4, f"s{seed}", params=params,
                                             generator=torch.Generator().manual_seed(seed))])

    a, b, c = run(0), run(0), run(1)
    assert a.token_ids == b.token_ids and torch.allclose(a.probs[0], b.probs[0], atol=1e-6)
    q = a.probs[0]
    assert torch.allclose(q.sum(-1), torch.ones(4))
    assert ((q > 0).sum(-1) <= 20).all()  # top-k applied
    assert (q[:, 128:] == 0).all()  # nothing outside the draft vocabulary
    assert all(q[i, t] > 0 for i, t in enumerate(a.token_ids[0]))  # each token was drawn from its q
    assert a.token_ids != c.token_ids or not torch.equal(a.probs[0], c.probs[0])


# ---- tokenizer check -------------------------------------------------------------------------------------
def write_tokenizer(folder, vocab=None, merges=None, added=None, vocab_size=4):
    folder.mkdir(parents=True, exist_ok=True)
    tok = {"model": {"type": "BPE", "vocab": vocab or {"a": 0, "b": 1, "ab": 2, "<eos>": 3},
                     "merges": merges or ["a b"]},
           "added_tokens": added or [{"id": 3, "content": "<eos>", "special": True}]}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return folder


@pytest.mark.parametrize("draft_kwargs, msg", [
    (dict(vocab_size=5), "vocab_size is 4 in the target and 5 in the draft"),
    (dict(vocab={"a": 0, "b": 1, "ba": 2, "<eos>": 3}), "token 'ab' \\(id 2\\) is missing from the draft"),
    (dict(vocab={"a": 1, "b": 0, "ab": 2, "<eos>": 3}), "token 'a' has id 0 in the target and 1 in the draft"),
    (dict(merges=["b a"]), "merges\\[0\\] is 'a b' in the target and 'b a' in the draft"),
    (dict(added=[{"id": 3, "content": "<eos>", "special": False}]), "added_tokens\\[0\\]"),
])
def test_tokenizer_mismatch_is_named(tmp_path, draft_kwargs, msg):
    target = write_tokenizer(tmp_path / "target")
    draft = write_tokenizer(tmp_path / "draft", **draft_kwargs)
    with pytest.raises(TokenizerMismatchError, match=msg) as err:
        check_tokenizers_match(target, draft)
    assert str(target) in str(err.value) and str(draft) in str(err.value)


def test_identical_tokenizers_pass(tmp_path):
    assert tokenizer_difference(write_tokenizer(tmp_path / "t"), write_tokenizer(tmp_path / "d")) is None


def test_draft_folder_loads_with_vocab_map_and_refuses_foreign_tokenizer(tmp_path):
    model = make_tiny_llama(seed=6)
    draft = tmp_path / "draft"
    model.save_pretrained(draft)
    write_tokenizer(tmp_path / "target", vocab_size=256)
    tok = json.loads((tmp_path / "target" / "tokenizer.json").read_text())
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    (draft / DRAFT_META_FILE).write_text(json.dumps({"vocab_ids": [0, 1, 2, 40, 41]}))
    prop = DraftModelProposer(draft, target_dir=tmp_path / "target")
    assert prop.vocab_ids.tolist() == [0, 1, 2, 40, 41]
    assert set(prop.propose([ProposalRequest([1, 2], 3, "r")]).token_ids[0]) <= {0, 1, 2, 40, 41}
    tok["model"]["merges"] = ["b a"]
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(TokenizerMismatchError, match="merges"):
        DraftModelProposer(draft, target_dir=tmp_path / "target")


class _RecordingDraft(Proposer):
    """A draft model stand-in: proposes [7] * k with a uniform q over 10 ids and records who asked."""

    model = "draft-model"

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.finished: list[str] = []

    def propose(self, requests):
        self.asked += [r.request_id for r in requests]
        return Proposals([[7] * r.k for r in requests], [torch.full((r.k, 10), 0.1) for r in requests],
                         num_forwards=max(r.k for r in requests))

    def finish(self, request_id):
        self.finished.append(request_id)


def test_ngram_first_serves_lookup_matches_and_sends_the_rest_to_the_draft():
    draft = _RecordingDraft()
    hybrid = NgramFirstProposer(NgramProposer(2, 3), draft)
    reqs = [ProposalRequest([1, 2, 3, 4, 1, 2], 2, "copy"),  # suffix [1, 2] occurred before: lookup -> [3, 4]
            ProposalRequest([5, 6, 7, 8], 3, "open"),  # nothing to copy: the draft model
            ProposalRequest([5, 6, 5, 6], 0, "zero")]  # k = 0: nobody
    props = hybrid.propose(reqs)
    assert props.token_ids == [[3, 4], [7, 7, 7], []]
    assert draft.asked == ["open"]  # the draft model never sees lookup-served or k = 0 requests
    assert props.probs[0] is None and props.probs[2] is None  # lookup drafts: one-hot q for the verifier
    assert props.probs[1].shape == (3, 10)
    assert props.sources == ["ngram", "draft", None]
    assert props.num_forwards == 3 and hybrid.model == "draft-model"
    # all served by lookup: the draft model does not run, no q at all
    props = hybrid.propose([reqs[0]])
    assert props.probs is None and draft.asked == ["open"] and props.num_forwards == 0
    hybrid.finish("open")
    assert draft.finished == ["open"]


def test_ngram_first_is_refused_without_a_draft_model():
    from accel.speculative.config import SpeculativeConfig

    with pytest.raises(ValueError, match="draft_ngram_first=True needs a draft model"):
        SpeculativeConfig(method="ngram", draft_ngram_first=True)


def test_spec_decoder_drafts_from_the_running_requests_it_is_handed_and_writes_nothing():
    from accel.runtime.sampling_params import SamplingParams
    from accel.runtime.sequence import Sequence
    from accel.speculative.config import SpeculativeConfig
    from accel.speculative.decoder import SpecDecoder

    cfg = SpeculativeConfig(method="ngram", adaptive=False, num_speculative_tokens=3, ngram_min_n=1, ngram_max_n=2,
                            disable_above_batch_size=None, max_step_rows=None)
    dec = SpecDecoder(cfg, NgramProposer(1, 2), max_model_len=64)  # no engine, scheduler or runner
    seq = Sequence("a", [1, 2, 3, 4, 1, 2], SamplingParams(max_tokens=10, temperature=0))
    seq.num_computed_tokens = seq.num_tokens - 1  # decoding: one new token per step
    drafts, q = dec.propose([seq], lambda s: None)
    assert drafts == {"a": [3, 4, 1]} and q == {"a": None}
    assert seq.spec_token_ids == [] and dec.last.token_ids == [[3, 4, 1]]  # the scheduler applies drafts


def test_spec_decoder_drafts_a_free_proposer_every_step_at_batch_1_and_keeps_guesses_out_of_the_estimate():
    from accel.runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
    from accel.runtime.sampling_params import SamplingParams
    from accel.runtime.sequence import Sequence
    from accel.speculative.config import SpeculativeConfig
    from accel.speculative.decoder import SpecDecoder

    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=4, disable_above_batch_size=None,
                            max_step_rows=None)
    dec = SpecDecoder(cfg, NgramProposer(2, 3), max_model_len=64)

    def decoding(rid, tokens):
        seq = Sequence(rid, tokens, SamplingParams(max_tokens=20, temperature=0))
        seq.num_computed_tokens = seq.num_tokens - 1
        return seq

    dec.adaptive.estimates["a"] = est = dec.adaptive._prior()
    est.successes, est.failures = 0.0, 10.0  # the adaptive rule alone says k = 0 ...
    assert dec.adaptive.lengths(["a"], 1)[0] == 0
    weak = decoding("a", [4, 9, 3, 4])
    drafts, _ = dec.propose([weak], lambda s: None)
    assert drafts == {"a": [9]} and dec.last.guesses == [True]  # ... but a free row at batch 1 carries a guess
    sched = SchedulerOutput([ScheduledRequest(weak, 2, [9])], 2)
    dec.observe(sched, ModelRunnerOutput(["a"], [[9, 5]]), 0.01)
    assert (est.successes, est.failures, est.steps_without_draft) == (0.0, 10.0, 1)  # not evidence
    assert dec.tally.total.num_draft_tokens == 1 and dec.tally.total.num_accepted_tokens == 1  # still counted as verified
    strong = decoding("a", [1, 2, 3, 1, 2])
    assert dec.propose([strong], lambda s: None)[0] == {"a": [3]}  # a real match: one draft token
    # at batch 2 the extra row is not free: no floor, no guesses
    drafts, _ = dec.propose([decoding("a", [4, 9, 3, 4]), decoding("b", [7, 8])], lambda s: None)
    assert drafts == {}


def test_guesses_stop_where_the_measured_second_row_costs_more_than_they_accept():
    from accel.speculative.config import SpeculativeConfig
    from accel.speculative.decoder import SpecDecoder

    dec = SpecDecoder(SpeculativeConfig(method="ngram"), NgramProposer(2, 3), max_model_len=64)
    assert dec._free_row(1) and not dec._free_row(2)  # nothing measured yet: a guess is tried
    for _ in range(5):  # one request, decode-only steps of 1 and 2 rows (an INT4 target: 1.6x)
        dec.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
        dec.cost.observe(0.0, 0, 0.016, rows=2, decode_rows=1, decode_only=True)
    assert abs(dec.cost.second_row_cost() - 0.6) < 1e-9 and not dec._free_row(1)
    for _ in range(100):  # an fp32 target: the 2nd row is free, and guesses pay once they are right 18% of the time
        dec.cost.observe(0.0, 0, 0.010, rows=2, decode_rows=1, decode_only=True)
    dec.tally.guesses.observe(100, 18)
    assert dec._free_row(1)
    dec.tally.guesses.observe(20000, 0)  # guesses that (almost) never hit do not pay even a 5% row
    for _ in range(5):
        dec.cost.observe(0.0, 0, 0.0105, rows=2, decode_rows=1, decode_only=True)
    assert not dec._free_row(1)
    assert not SpecDecoder(SpeculativeConfig(method="ngram"), _NotFree(), 64)._free_row(1)
    int8 = SpecDecoder(SpeculativeConfig(method="ngram"), NgramProposer(2, 3), max_model_len=64)
    for _ in range(5):
        int8.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
        int8.cost.observe(0.0, 0, 0.012, rows=2, decode_rows=1, decode_only=True)
    int8.tally.guesses.observe(100, 25)
    assert not int8._free_row(1)  # a 0.2 row for guesses right 25% of the time: a guess must return 1.5x its cost
    fast = SpecDecoder(SpeculativeConfig(method="ngram"), NgramProposer(2, 3), max_model_len=64)
    for _ in range(5):  # fp32 under a fast memory stream: the 2nd row costs 0.12 of a step
        fast.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
        fast.cost.observe(0.0, 0, 0.0112, rows=2, decode_rows=1, decode_only=True)
    fast.tally.guesses.observe(100, 23)
    assert fast._free_row(1)  # (23 + 2) / 110 = 0.227 > 1.5 x 0.12 (not 2 x 0.12)


def test_slow_first_two_row_steps_do_not_stop_guesses_for_good():
    from accel.speculative.config import SpeculativeConfig
    from accel.speculative.decoder import GUESS_REFRESH_STEPS, SpecDecoder

    dec = SpecDecoder(SpeculativeConfig(method="ngram"), NgramProposer(2, 3), max_model_len=64)
    for _ in range(5):
        dec.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
    for t in (0.0103, 0.016, 0.021):  # an engine's first 2-row steps (first-call costs: 0.6 and 1.1 extra)
        dec.cost.observe(0.0, 0, t, rows=2, decode_rows=1, decode_only=True)
    assert dec.cost.second_row_cost() is None and dec._free_row(1)  # too few to decide: guesses go on
    for _ in range(2):
        dec.cost.observe(0.0, 0, 0.0107, rows=2, decode_rows=1, decode_only=True)
    assert abs(dec.cost.second_row_cost() - 0.07) < 1e-9 and dec._free_row(1)  # the median, not the outliers
    for _ in range(5):  # the 2nd row turns expensive: guesses stop ...
        dec.cost.observe(0.0, 0, 0.016, rows=2, decode_rows=1, decode_only=True)
    assert not dec._free_row(1)
    for _ in range(GUESS_REFRESH_STEPS - 1):
        dec.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
    assert not dec._free_row(1)
    dec.cost.observe(0.0, 0, 0.010, rows=1, decode_rows=1, decode_only=True)
    assert dec._free_row(1) and dec._free_row(1)  # ... until GUESS_REFRESH_STEPS without a 2-row step, and then
    dec.cost.observe(0.0, 0, 0.016, rows=2, decode_rows=1, decode_only=True)  # until one runs
    assert not dec._free_row(1)


class _NotFree(NgramProposer):
    free = False
