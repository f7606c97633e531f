"""The engine's speculative-decoding loop: who drafts how much before each step, and what was accepted after.

    Engine.step():  drafts, q = spec.propose(running, generator_for, scheduler.draft_budget())
                    scheduler.update_draft_token_ids(drafts)  # 0..k draft tokens per decode request
                    sched  = scheduler.schedule()            # drafts ride in the same batch as everything else
                    out    = runner.execute(sched, q)        # verification: accepted drafts + 1 token
                    scheduler.update_from_output(...)        # rollback of rejected drafts' KV slots
                    spec.observe(sched, out, step_seconds)   # counters, adaptive lengths, the draft's cost

The draft length per request comes from `AdaptiveSpeculation` (Leviathan's formula on the request's recent
acceptance, off above `disable_above_batch_size` running requests) and is capped so that accepted drafts plus
the bonus token never pass max_tokens or the model length. The scheduler owns the step's row budget
(`draft_budget`); `SpecDecoder` decides who gets it: the requests with the best recent acceptance first. A drafted request's logprobs are the target's,
from each accepted position's own verify row.

`SpecDecoder` knows the running requests the engine hands it and the proposer it was built with; it never sees
the engine, the scheduler or the runner, and the proposer reports its own cost (forwards run, catch-up) in the
`Proposals` it returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from accel.runtime.outputs import ModelRunnerOutput, SchedulerOutput, SpecBurst, SpecPolicyState
from accel.runtime.sequence import Sequence
from accel.speculative.adaptive import (DECAY, AdaptiveSpeculation, CostMeter, RateGate, fit_draft_budget,
                                       speculation_enabled)
from accel.speculative.config import SpeculativeConfig
from accel.speculative.proposer import (NgramFirstProposer, NgramProposer, ProposalRequest, Proposals, Proposer,
                                        propose_contained)
from accel.speculative.stats import SpecTally

log = logging.getLogger("accel.engine")

# what one-token guesses are assumed to accept until they have been verified GUESS_PRIOR_WEIGHT times
GUESS_PRIOR_ACCEPTANCE, GUESS_PRIOR_WEIGHT = 0.2, 10.0
# a free row is taken where guesses accept this many times its measured cost, not just at break-even: INT8 without
# VNNI measured n-gram slower with guesses than without. fp32 on Zen 4 with a fast memory stream, paired: at 2
# some repeats hardly guessed, at 1.5 every repeat did, and 1 gained no more
GUESS_PAYBACK = 1.5
# where guesses do not pay, the free row still comes back once this many steps passed without a 2-row step (and
# until one runs): the measured cost stays current (a 2nd row that got cheaper would otherwise never be measured)
GUESS_REFRESH_STEPS = 128


def build_proposer(config: SpeculativeConfig, target_dir: str | None, num_blocks: int, block_size: int,
                   device, dtype, target_runner=None) -> Proposer:
    """The proposer a SpeculativeConfig names: n-gram lookup, or a draft model on its own paged KV cache (an EAGLE
    feature draft when the folder is one: it needs `target_runner`, whose features it reads)."""
    if config.method == "ngram":
        return NgramProposer(config.ngram_min_n, config.ngram_max_n)
    from accel.speculative.eagle import EagleProposer, is_eagle_draft
    from accel.speculative.paged_draft import PagedDraftProposer

    target = target_dir if target_dir and Path(target_dir).is_dir() else None
    if is_eagle_draft(config.draft_model):
        if target_runner is None:
            raise ValueError(f"draft {config.draft_model} is an EAGLE draft: it runs only inside an engine "
                             "(it reads the target's hidden states)")
        if config.draft_quantization not in (None, "int8"):
            raise ValueError(f"draft_quantization={config.draft_quantization!r} is not supported for an EAGLE "
                             "draft (allowed: None, int8)")
        proposer = EagleProposer.from_target(config.draft_model, target_runner.model, target_runner, num_blocks,
                                             block_size, target_dir=target, quant_scheme=config.draft_quantization)
    else:
        proposer = PagedDraftProposer.from_pretrained(config.draft_model, num_blocks, block_size, target_dir=target,
                                                      dtype=dtype, device=device,
                                                      quant_scheme=config.draft_quantization)
    proposer.min_path_confidence = config.draft_min_path_confidence
    proposer.min_first_confidence = config.draft_min_first_confidence
    if config.draft_ngram_first:
        return NgramFirstProposer(NgramProposer(config.ngram_min_n, config.ngram_max_n), proposer)
    return proposer


class SpecDecoder:
    """Speculation state of one engine: proposer, adaptive lengths, acceptance counters."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.clock = clock  # seconds, for the measured draft cost (tests inject a clock)
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.last: Proposals | None = None  # the last step's proposals (benchmarks and tests read their stats)
        self.adaptive = AdaptiveSpeculation(config.adaptive_config())
        self.cost = CostMeter()  # the draft's cost, measured on this engine
        # drafting at all, against plain decoding, on measured throughput (None: not adaptive, always drafting)
        self.gate = RateGate() if config.adaptive else None
        self._propose_s, self._draft_forwards = 0.0, 0
        self.tally = SpecTally()  # acceptance: all, guesses alone, per domain, per proposer (NgramFirstProposer)
        self._source: dict[str, str] = {}  # request id -> which proposer drafted it this step
        self._domain: dict[str, str | None] = {}
        self._drafted: set[str] = set()  # requests asked for drafts this step (k >= 0 decided)
        self._guessed: set[str] = set()  # requests whose draft this step is a guess (`Proposals.guesses`)
        self._undraftable: set[str] = set()  # requests whose proposal raised: decoded without drafts from then on

    def add(self, request_id: str, domain: str | None) -> None:
        self._domain[request_id] = domain

    def finish(self, request_id: str) -> None:
        self.proposer.finish(request_id)
        self.adaptive.forget(request_id)
        self._domain.pop(request_id, None)
        self._undraftable.discard(request_id)

    def propose(self, running: list[Sequence], generator_for: Callable[[Sequence], torch.Generator | None],
                budget: int | None = None) -> tuple[dict[str, list[int]], dict[str, Tensor | None]]:
        """Drafts for the running decode requests: (draft token ids, their distributions q) by request id, for
        `Scheduler.update_draft_token_ids` and the runner's verification. `generator_for`: a request's seeded
        generator (shared with the proposer, so draws stay per request). `budget`: draft tokens the step may
        carry (the scheduler's `draft_budget`; None: no cap)."""
        self._drafted = set()
        self._source = {}
        self._guessed = set()
        self._propose_s, self._draft_forwards = 0.0, 0
        batch = len(running)
        if self.gate is not None and not self.gate.drafting:
            return {}, {}
        reqs, seqs = [], []
        max_len = self.max_model_len
        # still prefilling: not drafted
        eligible = [s for s in running if s.num_tokens - s.num_computed_tokens == 1
                    and s.request_id not in self._undraftable]
        lengths = self.adaptive.lengths([s.request_id for s in eligible], batch)
        free_row = self._free_row(batch)
        for seq, k in zip(eligible, lengths):
            self._drafted.add(seq.request_id)
            if free_row:
                k = max(k, 1)
            # accepted drafts + the bonus token must fit in max_tokens and the model length
            k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1, max_len - seq.num_tokens - 1)
            if k <= 0:
                continue
            reqs.append(ProposalRequest(seq.token_ids, k, seq.request_id, seq.num_prompt_tokens, seq.params,
                                        generator_for(seq), seq.block_tables[0], guess=free_row))
            seqs.append(seq)
        if not reqs:
            return {}, {}
        if budget is not None:
            reqs, seqs = fit_draft_budget(reqs, seqs, budget, self.adaptive.alpha)
            if not reqs:
                return {}, {}
        t0 = self.clock()
        props, undraftable = propose_contained(self.proposer, reqs)
        self.last = props
        self._undraftable.update(undraftable)
        self._propose_s = self.clock() - t0
        # the cost per unit of k: a draft model runs up to max(k) batched forwards, fewer when confidence gates end
        # the chains early (`Proposals.num_forwards`). The adaptive rule charges k x c for a draft of length k, and with
        # gates the real cost is (forwards run) x (seconds per forward), so c per allowed token (proposing time /
        # max k) is the one that makes k x c right; the gates, not k, then decide the chain length. (Charging c
        # per forward run instead measured the same within noise at batch 1.)
        self._draft_forwards = max(r.k for r in reqs)
        if props.max_catchup > self.config.num_speculative_tokens + 1:
            # a request's first draft (or one after a pause) prefilled its context: a one-time cost per request,
            # not the per-forward cost c the adaptive rule weighs a longer draft against (measured: an EAGLE
            # draft's prompt catch-up put c at 0.61 of a step, its steady forwards cost ~0.1), so the cost
            # meter skips this step's proposing time
            self._draft_forwards = 0
        self._source = {} if props.sources is None else {s.request_id: src for s, src in zip(seqs, props.sources)
                                                           if src}
        self._guessed = set() if props.guesses is None else {s.request_id for s, g in zip(seqs, props.guesses) if g}
        drafts: dict[str, list[int]] = {}
        probs: dict[str, Tensor | None] = {}
        for i, seq in enumerate(seqs):
            if props.token_ids[i]:
                drafts[seq.request_id] = list(props.token_ids[i])
                probs[seq.request_id] = None if props.probs is None else props.probs[i]
        return drafts, probs

    def may_draft(self, batch: int) -> bool:
        """Whether any request of a batch of `batch` running requests may draft (or guess, or probe) this step: not
        above `disable_above_batch_size`, where the engine then bursts plain decode steps as without speculation."""
        cfg = self.adaptive.config
        return cfg.k_max > 0 and (self.gate is None or self.gate.drafting) and (
            batch == 1 or speculation_enabled(batch, cfg.disable_above_batch_size))

    def burst(self, running: list[Sequence], max_steps: int, budget_s: float, budget: int | None) -> SpecBurst | None:
        """Several verify steps of the one running request in one native call (the runner's `_spec_steps`), where
        they make the same choices as steps one at a time: n-gram lookup (no draft model), a greedy request (the
        caller checks it: `ModelRunner.max_decode_steps`) already drafted for, and the free row, which makes every
        step draft or guess. The draft lengths follow the request's acceptance estimate within the burst at the
        cost ratio measured before it; `observe_burst` then replays the steps. None: propose as usual."""
        if max_steps < 2 or len(running) != 1 or type(self.proposer) is not NgramProposer or not self.may_draft(1):
            return None
        seq = running[0]
        rid = seq.request_id
        est = self.adaptive.estimates.get(rid)
        cfg = self.adaptive.config
        if est is None or rid in self._undraftable or not self._free_row(1):
            return None
        k_max = cfg.k_max if budget is None else min(cfg.k_max, budget)
        if k_max < 1:
            return None
        fixed = -1
        if not speculation_enabled(1, cfg.disable_above_batch_size):
            fixed = 0
        elif not cfg.adaptive:
            fixed = k_max
        cost = cfg.cost_ratio if self.adaptive.measured_cost_ratio is None else self.adaptive.measured_cost_ratio
        self._drafted, self._guessed, self._source = set(), set(), {}  # this step proposes nothing of its own
        max_new = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
        return SpecBurst(rid, max_steps, max_new, min(max_new, max_steps * (k_max + 1)) + k_max, budget_s,
                         self.proposer.min_n, self.proposer.max_n, True,
                         SpecPolicyState(est.successes, est.failures, DECAY, cost, k_max, est.last_full, fixed))

    def observe_burst(self, seq: Sequence, steps: list[list[float]]) -> None:
        """`observe` for each verify step of a burst, in order: the counters, the request's acceptance estimate and
        the cost meter see what steps one at a time would have shown them."""
        rid = seq.request_id
        domain = self._domain.get(rid)
        for k, drafted, accepted, guessed, propose_s, step_s in steps:
            n, a = int(drafted), int(accepted)
            if self.cost is not None:
                self.cost.observe(propose_s, int(k), step_s, 1 + n, 1, True)
                self.adaptive.measured_cost_ratio = self.cost.cost_ratio(1, self.config.default_cost_ratio())
            self.adaptive.observe(rid, 0, 0) if guessed or n == 0 else self.adaptive.observe(rid, n, a)
            if n == 0:
                continue
            seq.spec.observe(n, a)
            self.tally.record(n, a, bool(guessed), domain)

    def _free_row(self, batch: int) -> bool:
        """Whether a free proposer drafts this step whatever the adaptive length, guessing one token where nothing
        better matches. At batch 1 a 2nd row can cost the target next to nothing (fp32: the row kernel streams
        each weight once for both rows), and then even a guess that is mostly wrong (n-gram, input-grounded prompts)
        pays (docs/DESIGN.md, Speculative decoding: free row). Decided on measurements of this engine: the 2nd row's
        cost (`CostMeter.second_row_cost`; INT8's and INT4's dearer 2-row steps without VNNI do not pay) against the
        guesses' acceptance."""
        if batch != 1 or not self.proposer.free or self.adaptive.config.k_max == 0:
            return False
        extra = None if self.cost is None else self.cost.second_row_cost()
        if extra is None or self.cost.steps_since_two_rows >= GUESS_REFRESH_STEPS:
            return True
        g = self.tally.guesses
        return GUESS_PAYBACK * extra < (g.num_accepted_tokens + GUESS_PRIOR_ACCEPTANCE * GUESS_PRIOR_WEIGHT) / (
            g.num_draft_tokens + GUESS_PRIOR_WEIGHT)

    def record_rate(self, batch: int, tokens: int, seconds: float, steps: int) -> None:
        """A decode-only engine call (proposing included in `seconds`) for the drafting-or-not gate (`RateGate`)."""
        if self.gate is not None:
            self.gate.observe(batch, tokens, seconds, steps)

    def observe(self, sched: SchedulerOutput, out: ModelRunnerOutput, step_seconds: float) -> None:
        """Count every verification of this step and feed the adaptive lengths and the cost meter
        (`step_seconds`: the target's step, scheduling to sampled tokens)."""
        if self.cost is not None:
            decode_only = all(r.num_tokens == 1 + len(r.spec_token_ids) for r in sched.scheduled)
            self.cost.observe(self._propose_s, self._draft_forwards, step_seconds,
                              sched.num_scheduled_tokens, len(sched.scheduled), decode_only)
            self.adaptive.measured_cost_ratio = self.cost.cost_ratio(len(sched.scheduled),
                                                                     self.config.default_cost_ratio())
        for req, sampled in zip(sched.scheduled, out.sampled_token_ids):
            rid = req.seq.request_id
            if not sampled or rid not in self._drafted:
                continue
            n = len(req.spec_token_ids)
            accepted = len(sampled) - 1
            # a guess says nothing of the request's acceptance on real drafts: a step without one, for the estimate
            # (counting guesses, mostly wrong, measured slower on input-grounded prompts: later real drafts
            # were cut short)
            self.adaptive.observe(rid, 0, 0) if rid in self._guessed else self.adaptive.observe(rid, n, accepted)
            if n == 0:
                continue
            self.tally.record(n, accepted, rid in self._guessed, self._domain.get(rid), self._source.get(rid))
