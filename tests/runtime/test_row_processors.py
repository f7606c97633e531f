"""Each row processor of the runner's step on hand-made logits: what it writes, and that a request's failure stays
that request's."""

import pytest
import torch

from accel.runtime.outputs import ScheduledRequest
from accel.runtime.row_processors import (
    PROCESSORS, CaptureHidden, GrammarAccept, GrammarMask, PromptLogprobs, Sample, Step, StepContext, StepRows,
    Verify)
from accel.runtime.sampler import Sampler
from accel.runtime.sampling_params import SamplingParams
from accel.runtime.sequence import Sequence

V = 8


def _seq(rid: str, prompt: list[int], **params) -> Sequence:
    return Sequence(rid, prompt, SamplingParams(max_tokens=10, temperature=0, **params))


def _decode(seq: Sequence, drafts: list[int] = ()) -> ScheduledRequest:
    seq.num_computed_tokens = seq.num_tokens - 1
    return ScheduledRequest(seq, 1 + len(drafts), list(drafts))


def _step(scheduled, logits, matchers=None, sampler=None, hidden=None, **ctx) -> Step:
    sample_rows, row = [], 0
    for i, r in enumerate(scheduled):
        row += r.num_tokens
        if r.samples:
            sample_rows.append((i, row - 1))
    rows = StepRows.plan(scheduled, sample_rows)
    assert logits.shape[0] == len(rows.logit_rows)
    context = StepContext(sampler or Sampler(), {}, lambda s: None, matchers or {}, **ctx)
    hidden = torch.zeros(row, 4) if hidden is None else hidden
    return Step(scheduled, rows, hidden, logits, None, None, context)


def _peaked(*tokens: int) -> torch.Tensor:
    """One logits row per token, that token the argmax."""
    x = torch.zeros(len(tokens), V)
    for j, t in enumerate(tokens):
        x[j, t] = 5.0
    return x


class FakeMatcher:
    """A grammar that allows only `allowed` tokens; `broken`: every call raises."""

    def __init__(self, allowed, broken=False):
        self.allowed, self.broken, self.taken = set(allowed), broken, []

    def mask_(self, logits, row):
        if self.broken:
            raise ValueError("grammar state lost")
        for t in range(V):
            if t not in self.allowed:
                logits[row, t] = float("-inf")

    def mask_span(self, logits, start, drafts):
        for j in range(len(drafts) + 1):
            self.mask_(logits, start + j)

    def accept(self, tokens):
        for t in tokens:
            if t not in self.allowed:
                raise RuntimeError(f"token {t} breaks the structured output's grammar")
            self.taken.append(t)


def test_rows_are_planned_verify_spans_then_sampling_rows_then_prompt_rows():
    a = _decode(_seq("a", [1, 2, 3]), drafts=[4, 5])  # rows 0..2
    b = _seq("b", [1, 2, 3, 4], prompt_logprobs=0)  # a prefill chunk of 3: rows 3..5, does not sample
    chunk = ScheduledRequest(b, 3)
    c = _decode(_seq("c", [6, 7]))  # row 6
    rows = StepRows.plan([a, chunk, c], [(0, 2), (2, 6)])
    assert rows.verify == [(0, 2)] and rows.sample == [(2, 6)]
    assert rows.prompt == [(1, 3, 0, 3)]
    assert rows.logit_rows == [0, 1, 2, 6, 3, 4, 5]
    assert (rows.num_verify, rows.num_sampled) == (3, 4)


def test_capture_hidden_writes_the_feature_cache_by_slot_and_calls_the_hook():
    seen = []
    cache = torch.zeros(6, 4)
    step = _step([_decode(_seq("a", [1, 2]))], _peaked(3), hidden=torch.full((1, 4), 2.0), feature_cache=cache,
                 hidden_hook=lambda scheduled, hidden: seen.append((len(scheduled), hidden.sum().item())))
    step.slot_mapping = torch.tensor([4])
    CaptureHidden()(step)
    assert cache[4].tolist() == [2.0] * 4 and cache[:4].abs().sum() == 0
    assert seen == [(1, 8.0)]


def test_grammar_mask_masks_each_constrained_row_and_fails_only_a_broken_grammar():
    scheduled = [_decode(_seq(r, [1, 2])) for r in "abc"]
    step = _step(scheduled, _peaked(3, 3, 3), {"a": FakeMatcher({5}), "c": FakeMatcher({}, broken=True)})
    step.sample_argmax = torch.tensor([3, 3, 3])
    GrammarMask()(step)
    assert torch.isinf(step.logits[0]).sum() == V - 1 and step.logits[0, 5] == 0
    assert not torch.isinf(step.logits[1]).any()  # unconstrained
    assert step.sample_argmax is None  # the forward's argmax no longer holds
    assert list(step.failed) == ["c"] and "grammar state lost" in step.failed["c"]


def test_verify_accepts_the_drafts_the_target_agrees_with_and_one_more():
    a = _decode(_seq("a", [1, 2]), drafts=[4, 6])
    step = _step([a], _peaked(4, 5, 7))  # target: 4 (= draft), 5 (!= draft 6): accept 4, then correct to 5
    Verify()(step)
    assert step.sampled == [[4, 5]] and not step.failed


def test_sample_takes_each_row_and_a_failing_row_fails_its_request_alone():
    class FailsOnTemperature(Sampler):
        def __call__(self, logits, params, *args):
            if any(p.temperature == 0.5 for p in params):
                raise RuntimeError("bad row")
            return super().__call__(logits, params, *args)

    a, b = _decode(_seq("a", [1, 2])), _decode(_seq("b", [1, 2]))
    b.seq.params.temperature = 0.5
    step = _step([a, b], _peaked(6, 2), sampler=FailsOnTemperature())
    Sample()(step)
    assert step.sampled == [[6], []]
    assert list(step.failed) == ["b"] and "bad row" in step.failed["b"]


def test_grammar_accept_advances_the_grammar_and_fails_a_refused_token():
    scheduled = [_decode(_seq(r, [1, 2])) for r in "ab"]
    ok, refuses = FakeMatcher({6}), FakeMatcher({1})
    step = _step(scheduled, _peaked(6, 6), {"a": ok, "b": refuses})
    step.sampled = [[6], [6]]
    GrammarAccept()(step)
    assert ok.taken == [6] and step.sampled == [[6], []]
    assert "breaks the structured output's grammar" in step.failed["b"]


def test_prompt_logprobs_score_each_prompt_token_under_the_row_before_it():
    seq = _seq("a", [1, 2, 3], prompt_logprobs=1)
    chunk = ScheduledRequest(seq, 3)  # the whole prompt: rows 0, 1 predict tokens 2, 3; row 2 samples
    logits = torch.randn(3, V)  # [sampling row, prompt rows 0..1]
    step = _step([chunk], logits)
    PromptLogprobs()(step)
    first, chosen, top = step.scored[0]
    expected = logits[1:].log_softmax(-1)
    assert first == 1
    assert chosen == pytest.approx([expected[0, 2].item(), expected[1, 3].item()], abs=1e-6)
    assert [len(t) for t in top] == [1, 1]


def test_the_pipeline_runs_masks_before_choices_and_choices_before_accepts():
    names = [type(p).__name__ for p in PROCESSORS]
    assert names == ["CaptureHidden", "GrammarMask", "Verify", "Sample", "GrammarAccept", "PromptLogprobs"]
    scheduled = [_decode(_seq("a", [1, 2])), _decode(_seq("b", [1, 2]), drafts=[3])]
    m = FakeMatcher({2, 3})
    step = _step(scheduled, _peaked(3, 7, 6), {"b": m})  # rows: b's span [3, 7], then a's sampling row
    for p in PROCESSORS:
        p(step)
    # b: draft 3 allowed and agreed; its next row's argmax 7 is masked away, so the grammar's best (2 or 3) follows
    assert step.sampled[0] == [6] and step.sampled[1][0] == 3 and step.sampled[1][1] in (2, 3)
    assert m.taken == step.sampled[1] and not step.failed
