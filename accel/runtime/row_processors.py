"""The model runner's step after its forward: a fixed pipeline of row processors over the logit rows it planned.

    StepRows.plan -> forward -> CaptureHidden -> GrammarMask -> Verify -> Sample -> GrammarAccept -> PromptLogprobs

Each processor is a small object reading and writing one `Step`: the step's logits and what it has produced so far.
A processor that fails for a request marks it failed (`Step.fail`) and the later ones leave it alone, so one
request's failure never touches another. Logit bias, penalties, temperature, top-k/p and min-p are the sampler's
own processing (`Sampler._process`), applied alike where it samples and where it verifies; logprobs are computed
where the tokens are chosen, from the same rows (`token_choice`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from accel.runtime.outputs import ModelRunnerOutput, ScheduledRequest
from accel.runtime.sampler import Sampler, token_logprobs
from accel.runtime.sequence import Sequence
from accel.runtime.token_choice import sample, verify

log = logging.getLogger("accel.engine")


@dataclass
class StepRows:
    """Which flat rows of the forward need logits, in the order the logits come back: each verified request's
    draft rows and its sampling row, then the plain sampling rows, then the prompt rows scored for prompt
    logprobs."""

    verify: list[tuple[int, int]]  # (scheduled index, sampling row) of requests with draft tokens
    sample: list[tuple[int, int]]  # (scheduled index, sampling row) of the others that sample
    prompt: list[tuple[int, int, int, int]]  # (scheduled index, first row, its position, how many)
    logit_rows: list[int]
    num_verify: int  # logit rows of the verify spans
    num_sampled: int  # ... and of the sampling rows

    @classmethod
    def plan(cls, scheduled: list[ScheduledRequest], sample_rows: list[tuple[int, int]]) -> StepRows:
        """sample_rows: (scheduled index, flat row) of every request whose chunk samples (`prepare_inputs`)."""
        spec = [(i, row) for i, row in sample_rows if scheduled[i].spec_token_ids]
        if spec:
            sample_rows = [(i, row) for i, row in sample_rows if not scheduled[i].spec_token_ids]
        logit_rows: list[int] = []
        for i, last in spec:
            logit_rows.extend(range(last - len(scheduled[i].spec_token_ids), last + 1))
        num_verify = len(logit_rows)
        logit_rows.extend(row for _, row in sample_rows)
        num_sampled = len(logit_rows)
        prompt = prompt_rows(scheduled)
        for _, row, _, n in prompt:
            logit_rows.extend(range(row, row + n))
        return cls(spec, sample_rows, prompt, logit_rows, num_verify, num_sampled)


def prompt_rows(scheduled: list[ScheduledRequest]) -> list[tuple[int, int, int, int]]:
    """Requests asking for prompt logprobs whose chunk holds prompt positions that predict a prompt token:
    (scheduled index, flat row of the first, its position, how many). Rows are laid out request by request, each
    chunk's rows in order (`ModelRunner.prepare_inputs`, `native_inputs`)."""
    out, row = [], 0
    for i, r in enumerate(scheduled):
        seq = r.seq
        start = seq.num_computed_tokens
        n = min(start + r.num_tokens, seq.num_prompt_tokens - 1) - start
        if seq.params.prompt_logprobs is not None and n > 0:
            out.append((i, row, start, n))
        row += r.num_tokens
    return out


@dataclass
class StepContext:
    """What the processors read from the runner: its sampler, the per-request generators and grammars, where the
    hidden states go."""

    sampler: Sampler
    generators: dict[str, torch.Generator]
    generator_of: Callable[[Sequence], torch.Generator | None]
    matchers: dict
    feature_cache: Tensor | None = None
    hidden_hook: Callable | None = None


@dataclass
class Step:
    """One step's logits and what the processors made of them, per scheduled request."""

    scheduled: list[ScheduledRequest]
    rows: StepRows
    hidden: Tensor  # [T, H], every computed position
    logits: Tensor  # [len(rows.logit_rows), V]
    argmax: Tensor | None  # the forward's argmax of each logit row (the native step), unconstrained
    slot_mapping: Tensor | None
    ctx: StepContext
    draft_probs: dict[str, Tensor | None] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.scheduled)
        self.request_ids = [r.seq.request_id for r in self.scheduled]
        self.sampled: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float] | None] = [None] * n
        self.top: list = [None] * n
        self.scored: list = [None] * n
        rows = self.rows
        # the verify and sampling blocks of the logits; no slice op where a block is all of them (the common decode
        # step: each op costs microseconds cold)
        whole_verify = not rows.sample and not rows.prompt
        whole_sample = not rows.num_verify and not rows.prompt
        self.verify_logits = self.logits if whole_verify else self.logits[:rows.num_verify]
        self.sample_logits = self.logits if whole_sample else self.logits[rows.num_verify:rows.num_sampled]
        a = self.argmax
        self.verify_argmax = a if whole_verify or a is None else a[:rows.num_verify]
        self.sample_argmax = a if whole_sample or a is None else a[rows.num_verify:rows.num_sampled]

    def fail(self, i: int, error: str) -> None:
        """Request `i` (scheduled index) failed in this step: it produces nothing."""
        self.failed[self.request_ids[i]] = error
        self.sampled[i] = []

    def ok(self, i: int) -> bool:
        return self.request_ids[i] not in self.failed

    def verify_starts(self) -> list[int]:
        """Offsets of each verified request's span in `verify_logits`, and its end."""
        starts = [0]
        for i, _ in self.rows.verify:
            starts.append(starts[-1] + len(self.scheduled[i].spec_token_ids) + 1)
        return starts

    def output(self) -> ModelRunnerOutput:
        return ModelRunnerOutput(self.request_ids, self.sampled, self.logprobs, self.top, self.failed,
                                 prompt_logprobs=self.scored)


class CaptureHidden:
    """The step's hidden states for drafts: into the feature cache (one row per KV slot, read by an EAGLE draft)
    and to the hidden hook (teacher data for draft training)."""

    def __call__(self, step: Step) -> None:
        cache = step.ctx.feature_cache
        if cache is not None:
            cache.index_copy_(0, step.slot_mapping, step.hidden.to(cache.dtype))
        if step.ctx.hidden_hook is not None:
            step.ctx.hidden_hook(step.scheduled, step.hidden)


class GrammarMask:
    """Sets the logits a request's grammar forbids to -inf, in place: each verify row by the grammar after the drafts
    before it, each sampling row by the grammar as it stands. The forward's argmax is then stale for that block."""

    def __call__(self, step: Step) -> None:
        matchers = step.ctx.matchers
        if not matchers:
            return
        starts = step.verify_starts()
        for j, (i, _) in enumerate(step.rows.verify):
            m = matchers.get(step.request_ids[i])
            if m is not None:
                try:
                    m.mask_span(step.verify_logits, starts[j], step.scheduled[i].spec_token_ids)
                except Exception as e:  # noqa: BLE001 - this request only
                    step.fail(i, _describe(e))
                step.verify_argmax = None
        for j, (i, _) in enumerate(step.rows.sample):
            m = matchers.get(step.request_ids[i])
            if m is not None:
                try:
                    m.mask_(step.sample_logits, j)
                except Exception as e:  # noqa: BLE001 - this request only
                    step.fail(i, _describe(e))
                step.sample_argmax = None


class Verify:
    """Verifies the draft tokens of the requests scheduled with them (`token_choice.verify`): accepted drafts and
    one more token each, with their logprobs."""

    def __call__(self, step: Step) -> None:
        if not step.rows.verify:
            return
        spec = [(step.scheduled[i], row) for i, row in step.rows.verify]
        starts = step.verify_starts()
        logits, argmax, ctx = step.verify_logits, step.verify_argmax, step.ctx

        def run(js: list[int]) -> list:
            if len(js) == len(spec):
                return verify(ctx.sampler, logits, spec, step.draft_probs, ctx.generator_of, argmax)
            rows = torch.cat([logits[starts[j]:starts[j + 1]] for j in js])
            return verify(ctx.sampler, rows, [spec[j] for j in js], step.draft_probs, ctx.generator_of)

        _store(step, step.rows.verify, *per_request([r.seq for r, _ in spec], run, ctx.generators))


class Sample:
    """Samples one token for each request whose chunk ends its sequence and has no drafts (`token_choice.sample`),
    with its logprobs."""

    def __call__(self, step: Step) -> None:
        if not step.rows.sample:
            return
        seqs = [step.scheduled[i].seq for i, _ in step.rows.sample]
        logits, argmax, ctx = step.sample_logits, step.sample_argmax, step.ctx

        def run(js: list[int]) -> list:
            if len(js) == len(seqs):
                return sample(ctx.sampler, logits, seqs, ctx.generator_of, argmax)
            return sample(ctx.sampler, logits[js], [seqs[j] for j in js], ctx.generator_of)

        _store(step, step.rows.sample, *per_request(seqs, run, ctx.generators))


class GrammarAccept:
    """Advances each constrained request's grammar by the tokens it produced; a token the grammar refuses fails
    that request."""

    def __call__(self, step: Step) -> None:
        matchers = step.ctx.matchers
        if not matchers:
            return
        for i, rid in enumerate(step.request_ids):
            m = matchers.get(rid)
            if m is not None and step.sampled[i] and step.ok(i):
                try:
                    m.accept(step.sampled[i])
                except RuntimeError as e:  # this request only
                    step.fail(i, str(e))


class PromptLogprobs:
    """Scores the prompt tokens of requests asking for prompt logprobs: (first scored position, logprobs, top)."""

    def __call__(self, step: Step) -> None:
        start = step.rows.num_sampled
        for i, _, pos, n in step.rows.prompt:
            seq = step.scheduled[i].seq
            targets = seq.prompt_token_ids[pos + 1:pos + 1 + n]
            step.scored[i] = (pos + 1, *token_logprobs(step.logits[start:start + n], targets,
                                                        seq.params.prompt_logprobs))
            start += n


# the order is fixed: grammars mask before anything reads the rows; tokens exist before the grammar accepts them
PROCESSORS = (CaptureHidden(), GrammarMask(), Verify(), Sample(), GrammarAccept(), PromptLogprobs())


def _store(step: Step, rows: list[tuple[int, int]], results: list, failed: dict[str, str]) -> None:
    step.failed.update(failed)
    for (i, _), result in zip(rows, results):
        if result is not None and step.ok(i):
            step.sampled[i], step.logprobs[i], step.top[i] = result


def per_request(seqs: list[Sequence], fn: Callable[[list[int]], list], generators: dict[str, torch.Generator]
                ) -> tuple[list, dict[str, str]]:
    """fn(positions) -> one result per position, for the whole batch at once; when that raises, fn([j]) for each
    request alone, so that only a request whose own inputs fail is failed (its result None, its error in the
    returned dict). Seeded generators are rewound first, so the others draw exactly what they would have."""
    saved = [(g, g.get_state()) for g in (generators.get(s.request_id) for s in seqs) if g is not None]
    try:
        return fn(list(range(len(seqs)))), {}
    except Exception:  # noqa: BLE001 - isolated below; a request's failure must not end the others
        if len(seqs) == 1:
            log.exception("request %s failed in this step", seqs[0].request_id)
            return [None], {seqs[0].request_id: _describe(sys.exc_info()[1])}
    for g, state in saved:
        g.set_state(state)
    results: list = [None] * len(seqs)
    failed: dict[str, str] = {}
    for j, seq in enumerate(seqs):
        try:
            results[j] = fn([j])[0]
        except Exception as e:  # noqa: BLE001
            log.exception("request %s failed in this step", seq.request_id)
            failed[seq.request_id] = _describe(e)
    return results, failed


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
