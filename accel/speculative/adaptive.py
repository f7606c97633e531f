"""Adaptive speculation: how many draft tokens each request gets this step (0 = none).

Two decisions, both pure:
  * per request: estimate its acceptance rate alpha from its recent verification steps and pick the k in
    [0, k_max] that maximises Leviathan's expected tokens per unit cost (`stats.leviathan_speedup`); k = 0
    when even one draft token would not pay for itself. A request at k = 0 drafts one token every
    PROBE_INTERVAL steps so that a change in its text (e.g. it starts quoting its prompt) is noticed.
  * per batch: no speculation at all once `disable_above_batch_size` requests run together; a large batch
    already fills the hardware and verification of draft tokens would only cost throughput.

Estimating alpha: with i.i.d. acceptance, a step that drafted k and accepted a tokens contributes a
successes and one failure if a < k (a truncated geometric draw), so the maximum-likelihood estimate is
successes / (successes + failures). Both are exponentially decayed (DECAY per step) to follow recent text,
and start from a prior worth PRIOR_WEIGHT steps at PRIOR_ALPHA — or, once the proposer has been verified
PRIOR_WEIGHT times in this engine, at the acceptance it has shown so far (`global_estimate`): a draft that
has proven weak on this traffic does not get a fresh 0.5 for every new request (measured: at batch 8-15 a
distilled draft of low acceptance cost throughput while each new request learned it again).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from accel.speculative.stats import leviathan_speedup


# The policy's fixed internals (not configuration: no recipe, flag or request sets them; tests vary them here).
DECAY = 0.9
"""Per-step decay of a request's acceptance evidence (it follows the recent text)."""
PRIOR_ALPHA, PRIOR_WEIGHT = 0.5, 2.0
"""A request's acceptance before its own evidence, worth PRIOR_WEIGHT steps (or the engine's measured acceptance
once it outweighs that)."""
PROBE_INTERVAL = 8
"""A request whose length fell to 0 still drafts one token every PROBE_INTERVAL steps (times its backoff)."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """What the engine's `SpeculativeConfig` decides about adaptive speculation (`SpeculativeConfig.adaptive_config`).

    k_max                  upper bound on draft tokens per step (SpeculativeConfig.num_speculative_tokens).
    cost_ratio             cost of one draft token relative to one target decode step, verification of the
                           extra token included, until the engine's CostMeter has measured it.
    disable_above_batch_size  switch speculation off when this many requests run at once (None: never).
    adaptive               False: always k_max (below the batch cutoff).
    """

    k_max: int
    cost_ratio: float
    disable_above_batch_size: int | None
    adaptive: bool = True

    def __post_init__(self) -> None:
        checks = [
            ("k_max", self.k_max >= 0, "an integer >= 0"),
            ("cost_ratio", self.cost_ratio >= 0, ">= 0"),
            ("disable_above_batch_size", self.disable_above_batch_size is None or self.disable_above_batch_size >= 1,
             "None or an integer >= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"adaptive speculation {name}={getattr(self, name)!r} is invalid; allowed: {allowed}")


def best_speculation_length(alpha: float, cost_ratio: float, k_max: int) -> int:
    """The k in [0, k_max] with the highest predicted speedup; 0 unless some k beats no speculation (1.0)."""
    best_k, best = 0, 1.0
    for k in range(1, k_max + 1):
        s = leviathan_speedup(alpha, k, cost_ratio)
        if s > best + 1e-12:
            best_k, best = k, s
    return best_k


def fit_draft_budget(reqs: list, seqs: list, budget: int, alpha_of) -> tuple[list, list]:
    """Spend a step's draft budget (tokens) on the requests with the best acceptance estimate (`alpha_of(request
    id)`) first, each `ProposalRequest.k` cut to what is left; requests left with 0 draft nothing this step.
    Returns the kept requests and their sequences, in their scheduled order."""
    order = sorted(range(len(reqs)), key=lambda i: -alpha_of(reqs[i].request_id))
    keep = []
    for i in order:
        k = min(reqs[i].k, budget)
        if k > 0:
            reqs[i].k = k
            keep.append(i)
            budget -= k
    keep.sort()
    return [reqs[i] for i in keep], [seqs[i] for i in keep]


def speculation_enabled(batch_size: int, disable_above_batch_size: int | None) -> bool:
    """False once `batch_size` running requests reach the cutoff (None: always enabled)."""
    return disable_above_batch_size is None or batch_size < disable_above_batch_size


MAX_PROBE_BACKOFF = 16
"""A probe that accepts nothing doubles the wait before the next (up to 16 x PROBE_INTERVAL); one that accepts
halves it. Probing a draft model is not free (it catches up on every token since its last draft, and the target
verifies an extra row): at batch 8-15 with a draft of low acceptance, fixed 8-step probes cost throughput."""


EXPLORERS_PER_STEP = 1
"""Requests allowed to explore in one step: draft while the proposer has no verified evidence in this engine yet,
or probe at k = 0."""

NEW_REQUEST_PROBE_BACKOFF = 4
"""Initial probe backoff of a request whose prior (the engine's measured acceptance) already says k = 0."""


@dataclass
class AcceptanceEstimate:
    """Decayed acceptance evidence of one request; see the module docstring."""

    successes: float
    failures: float
    steps_without_draft: int = 0
    probe_backoff: int = 1  # probes wait PROBE_INTERVAL * this; doubles when a draft step accepts nothing
    last_full: int = 0  # draft tokens of the last step if all of them were accepted, else 0

    @classmethod
    def prior(cls) -> AcceptanceEstimate:
        return cls(successes=PRIOR_ALPHA * PRIOR_WEIGHT, failures=(1.0 - PRIOR_ALPHA) * PRIOR_WEIGHT)

    @property
    def alpha(self) -> float:
        total = self.successes + self.failures
        return self.successes / total if total > 0 else 0.0

    def update(self, num_draft_tokens: int, num_accepted_tokens: int, decay: float) -> None:
        if num_draft_tokens == 0:
            self.steps_without_draft += 1
            return
        self.steps_without_draft = 0
        self.last_full = num_draft_tokens if num_accepted_tokens == num_draft_tokens else 0
        if num_accepted_tokens == 0:
            self.probe_backoff = min(self.probe_backoff * 2, MAX_PROBE_BACKOFF)
        else:
            self.probe_backoff = max(1, self.probe_backoff // 2)
        self.successes = decay * self.successes + num_accepted_tokens
        self.failures = decay * self.failures + (1.0 if num_accepted_tokens < num_draft_tokens else 0.0)


@dataclass
class AdaptiveSpeculation:
    """Per-request speculation lengths for a running batch (state: one `AcceptanceEstimate` per request)."""

    config: AdaptiveConfig
    estimates: dict[str, AcceptanceEstimate] = field(default_factory=dict)
    # all requests' verification evidence, undecayed: the prior of new requests once it outweighs the default
    global_successes: float = 0.0
    global_failures: float = 0.0
    # set by the engine from `CostMeter` when the cost ratio is measured, not configured (None: config's)
    measured_cost_ratio: float | None = None
    def has_global_evidence(self) -> bool:
        return self.global_successes + self.global_failures >= PRIOR_WEIGHT

    def global_alpha(self) -> float:
        """The proposer's acceptance on this engine's traffic, shrunk towards PRIOR_ALPHA by PRIOR_WEIGHT pseudo-
        steps: four unlucky first drafts must not read as "never accepts" (measured: an EAGLE draft at 0.44
        first-token acceptance was switched off for good after the first request's 4 probes on a degenerate
        reply all missed, when the raw ratio 0/4 became every new request's prior)."""
        n = self.global_successes + self.global_failures
        return (self.global_successes + PRIOR_ALPHA * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT)

    def _prior(self) -> AcceptanceEstimate:
        if not self.has_global_evidence():
            return AcceptanceEstimate.prior()
        alpha = self.global_alpha()
        return AcceptanceEstimate(successes=alpha * PRIOR_WEIGHT, failures=(1.0 - alpha) * PRIOR_WEIGHT)

    def lengths(self, request_ids: list[str], batch_size: int) -> list[int]:
        """Draft tokens for each request of one engine step, with `batch_size` requests running. Exploration
        (drafting on the default prior, probing at k = 0) is rationed to EXPLORERS_PER_STEP requests per call."""
        budget = [EXPLORERS_PER_STEP]
        return [self._length(r, batch_size, budget) for r in request_ids]

    def _length(self, request_id: str, batch_size: int, explore_budget: list[int]) -> int:
        cfg = self.config
        if not speculation_enabled(batch_size, cfg.disable_above_batch_size):
            return 0
        if not cfg.adaptive:
            return cfg.k_max
        est = self.estimates.get(request_id)
        cost = cfg.cost_ratio if self.measured_cost_ratio is None else self.measured_cost_ratio
        if est is None:
            est = self.estimates[request_id] = self._prior()
            if self.has_global_evidence() and best_speculation_length(est.alpha, cost, cfg.k_max) == 0:
                # the proposer has shown on this traffic that it does not pay: the first probe waits longer too
                # (a draft model's first draft prefills the whole prompt into its own KV)
                est.probe_backoff = NEW_REQUEST_PROBE_BACKOFF
        k = best_speculation_length(est.alpha, cost, cfg.k_max)
        if est.last_full and k > 0:
            # A fully accepted draft predicts a long one: acceptance is bursty (a copied span is accepted to its
            # end), not the i.i.d. draws the formula assumes. Measured with n-gram lookup on input-grounded
            # prompts: conditional acceptance 0.66 at the first position but 0.94-0.96 from the fourth on.
            k = max(k, min(cfg.k_max, 2 * est.last_full))
        if k > 0 and not self.has_global_evidence():
            # Nothing is known about this proposer on this traffic yet: one request at a time explores it on the
            # default prior. Without this, a batch that drops below the cutoff has every request draft at once,
            # and a draft model's first draft catches up on the request's whole prompt (measured at batch 15: a
            # sizeable share of the run went to draft prefill for a draft whose acceptance then turned out low).
            if explore_budget[0] <= 0:
                return 0
            explore_budget[0] -= 1
        if k == 0 and cfg.k_max > 0 and est.steps_without_draft + 1 >= PROBE_INTERVAL * est.probe_backoff \
                and self._probe_can_pay(est, cost):
            # probe: keep measuring a request whose drafts stopped paying off. Probes are exploration too, so at
            # most EXPLORERS_PER_STEP per step: requests that started together would otherwise all probe in the same
            # step, and a draft model then prefills every one of their prompts at once (measured at batch 15: slower
            # than no speculation for a draft that never drafted more than its probes)
            if explore_budget[0] <= 0:
                return 0
            explore_budget[0] -= 1
            return 1
        return k

    def _probe_can_pay(self, est: AcceptanceEstimate, cost: float) -> bool:
        """A probe looks for a request whose text changed (e.g. it started quoting its prompt). It is worth its
        cost only if an acceptance the request could plausibly reach - twice the best of its own and the
        engine's - would make drafting pay at the measured cost. A draft model at acceptance 0.2 whose draft
        forward costs 0.6 of a step is then not probed at all (measured: its probes, each a catch-up prefill of
        the request's context, cost 8% at batch 16 while it never drafted more than them)."""
        best = max(est.alpha, self.global_alpha())
        return best_speculation_length(min(1.0, 2.0 * best), cost, self.config.k_max) > 0

    def observe(self, request_id: str, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Feed back one step of `request_id` (num_draft_tokens = 0 for a step it did not speculate)."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(f"num_accepted_tokens={num_accepted_tokens} is invalid for num_draft_tokens="
                             f"{num_draft_tokens}; allowed: 0 <= accepted <= drafted")
        est = self.estimates.get(request_id)
        if est is None:
            est = self.estimates[request_id] = self._prior()
        est.update(num_draft_tokens, num_accepted_tokens, DECAY)
        if num_draft_tokens:
            self.global_successes += num_accepted_tokens
            self.global_failures += 1.0 if num_accepted_tokens < num_draft_tokens else 0.0

    def alpha(self, request_id: str) -> float:
        """The request's current acceptance estimate (the prior for one not seen yet)."""
        est = self.estimates.get(request_id)
        return (est if est is not None else self._prior()).alpha

    def forget(self, request_id: str) -> None:
        """Drop a finished request's state."""
        self.estimates.pop(request_id, None)


FALLBACK_VERIFY = 0.05
"""`CostMeter`: the verification cost of a row, in steps, until the rows have varied enough to fit it."""
COST_DECAY = 0.95
"""`CostMeter`: per-step decay of both terms (a change in batch size is followed)."""
ROW_COST_WINDOW, ROW_COST_MIN_SAMPLES = 9, 5
"""`CostMeter.second_row_cost`: 1- and 2-row steps kept, and needed before it answers."""


@dataclass
class CostMeter:
    """The draft/target cost ratio c of Leviathan's formula, measured on the running engine.

    c = (seconds proposing per sequential draft forward) / (seconds of the target step)      [the draft]
      + B x (extra target seconds per verified row) / (seconds of a decode step of B rows)     [verification]

    Why both: a draft model's forwards are the familiar cost, but on a CPU each verified row also costs the
    target ~5% of a decode step at batch 1 (the forward is no longer purely weight-streaming), which the
    formula's "verifying k + 1 tokens costs one step" hides; n-gram lookup is almost free to propose, and the
    verification term is all of its cost. The verification term is the slope of an exponentially weighted
    least-squares fit of decode-only step seconds on the number of rows (steps that mix in a prefill chunk are
    left out); until the rows have varied enough to fit a slope, FALLBACK_VERIFY stands in for it.
    Both terms are exponentially averaged (COST_DECAY per observed step) so a change in batch size is followed.
    """

    propose_ratio: float | None = None
    _s: list[float] = field(default_factory=lambda: [0.0] * 5)  # sum w, w x, w x^2, w y, w x y
    # decode-only steps of one request with 1 and 2 rows: their last seconds. The 2nd row is where the linear fit is
    # furthest off (fp32 row kernels stream each weight once for both rows, so there it is nearly free; INT8's and
    # INT4's cost more on AVX2), and what a one-token guess costs
    _one_request: dict[int, deque] = field(default_factory=lambda: {1: deque(maxlen=ROW_COST_WINDOW),
                                                                    2: deque(maxlen=ROW_COST_WINDOW)})
    steps_since_two_rows: int = 0  # decode-only steps of one request since the last one with 2 rows

    def observe(self, propose_seconds: float, draft_forwards: int, step_seconds: float, rows: int,
                decode_rows: int, decode_only: bool) -> None:
        """One engine step: time spent proposing (and how many sequential draft forwards it ran), the target
        step's seconds and rows (`decode_rows` of them without drafts), whether only decode rows ran."""
        if step_seconds <= 0:
            return
        if draft_forwards > 0:
            r = propose_seconds / draft_forwards / step_seconds
            self.propose_ratio = r if self.propose_ratio is None else COST_DECAY * self.propose_ratio + (
                1 - COST_DECAY) * r
        if decode_only and decode_rows == 1 and rows in (1, 2):
            self._one_request[rows].append(step_seconds)
        if decode_only and decode_rows == 1:
            self.steps_since_two_rows = 0 if rows == 2 else self.steps_since_two_rows + 1
        if decode_only and rows > 0:
            x, y = float(rows), step_seconds
            for i, v in enumerate((1.0, x, x * x, y, x * y)):
                self._s[i] = COST_DECAY * self._s[i] + v

    def second_row_cost(self) -> float | None:
        """Extra cost of a request's 2nd row at batch 1, in 1-row steps: the median 2-row step over the median 1-row
        step of the last ROW_COST_WINDOW each (None until ROW_COST_MIN_SAMPLES of each ran). Why medians: the
        guesses this decides stop once it reads high, and with them the 2-row samples that would correct it; an
        exponential average seeded by an engine's first 2-row steps (first-call costs, far above the 1-row steps')
        read the 2nd row at many times its cost (fp32, Zen 4), and n-gram ran without guesses."""
        t1, t2 = self._one_request[1], self._one_request[2]
        if len(t1) < ROW_COST_MIN_SAMPLES or len(t2) < ROW_COST_MIN_SAMPLES:
            return None
        return statistics.median(t2) / statistics.median(t1) - 1.0

    def slope(self) -> float | None:
        """Extra seconds per row from the fit; None while the rows have not varied enough (variance < 1 row^2)."""
        s0, s1, s2, sy, sxy = self._s
        if s0 <= 0:
            return None
        var = s2 / s0 - (s1 / s0) ** 2
        if var < 1.0:
            return None
        return max(0.0, (sxy / s0 - (s1 / s0) * (sy / s0)) / var)

    def verify_ratio(self, decode_rows: int) -> float:
        """Verification cost of one draft token for a request in a batch of `decode_rows`, in that request's share
        of the step: B * b / (a + b * B), with T(B) = a + b * B the fitted decode step.

        Why B: the batch's throughput is sum(tokens) / T. One more verified row adds b seconds for *every* request
        of the batch, so it pays off only if its expected extra tokens exceed b * sum(tokens) / T ~ b * B / T(B)
        (at batch 1 the familiar b / T). On a CPU a step's time grows slowly with its rows, so a draft row at batch
        15 costs a large part of a request's share of the step: only very likely drafts pay, where b / T alone would
        let every request draft up to the max_step_rows cap."""
        rows = max(1, decode_rows)
        b = self.slope()
        if b is None:
            r = FALLBACK_VERIFY / (1.0 - FALLBACK_VERIFY)  # b / a
            return rows * r / (1.0 + rows * r)
        s0, s1, _, sy, sxy = self._s
        a = sy / s0 - b * s1 / s0  # intercept
        base = a + b * rows
        return rows * b / base if base > 0 else FALLBACK_VERIFY

    def cost_ratio(self, decode_rows: int, fallback_propose: float) -> float:
        """c for a batch of `decode_rows` requests (fallback_propose until a draft forward was timed)."""
        p = fallback_propose if self.propose_ratio is None else self.propose_ratio
        return p + self.verify_ratio(decode_rows)


GATE_PHASE_STEPS = 16
"""`RateGate`: decode steps per measured phase (a burst of plain steps counts each of its steps)."""
GATE_MAX_BACKOFF = 16
"""`RateGate`: a phase of the side that keeps winning grows to this many times GATE_PHASE_STEPS."""
GATE_LOSS_BUDGET = 0.03
"""`RateGate`: the share of time re-measuring the losing side may cost: its winner's phase is made long enough (up
to GATE_MAX_STEPS), however much it lost by (a draft model's first drafts prefill every new request's prompt)."""
GATE_MAX_STEPS = 4096
GATE_MARGIN = 1.05
"""`RateGate`: drafting wins only this much faster than plain decoding. A tie goes to plain decoding: drafting has
costs a phase may not show (a request's first draft prefills its whole context into a draft model, and a draft
model catches up on the tokens of every plain phase), and a draft at k = 0 still gives up the decode bursts."""


def _bucket(batch: int) -> int:
    """The batch sizes a phase's rate is compared at: exact up to 4 requests, then powers of two."""
    return batch if batch <= 4 else 1 << (batch - 1).bit_length()


@dataclass
class RateGate:
    """Whether the engine drafts at all, decided on measured throughput: an online A/B of speculation against plain
    decoding on this engine, this model and this traffic.

    Why: the adaptive lengths maximise Leviathan's predicted speedup from the measured acceptance and cost ratio, but
    that model misses costs (a draft model catching up on accepted tokens, speculative steps leaving the multi-step
    decode bursts, proposing in Python), and predicted a win for the 1.5B's 0.5B draft where it measured a loss
    (ledger `spec-qwen2.5-coder-1.5b-input-grounded-b1-int4`).
    So phases alternate: drafting (the adaptive lengths decide k) and plain (no drafts; decode bursts as without
    speculation), each GATE_PHASE_STEPS decode steps; a phase's rate is output tokens per second of its decode-only
    steps (proposing included) per batch-size bucket, and the two last phases are compared at the buckets both saw.
    The winner then runs GATE_PHASE_STEPS x backoff steps, or more where the loser lost by so much that measuring it
    again would cost over GATE_LOSS_BUDGET, before the loser is measured again for GATE_PHASE_STEPS; backoff doubles
    while the same side wins (to GATE_MAX_BACKOFF) and restarts at 1 when the other does. A draft losing by a little
    so runs about 1 step in 17 once the backoff is full; a winning one gives up the same share to plain steps.
    """

    phase_steps: int = GATE_PHASE_STEPS
    max_backoff: int = GATE_MAX_BACKOFF
    drafting: bool = True  # the current phase
    steps_left: int = GATE_PHASE_STEPS
    backoff: int = 1
    winner: bool | None = None  # the side that won the last comparison (None: not compared yet)
    # this phase's and each side's last phase's {bucket: [tokens, seconds, steps]}
    current: dict[int, list[float]] = field(default_factory=dict)
    last: dict[bool, dict[int, list[float]]] = field(default_factory=dict)

    def observe(self, batch: int, tokens: int, seconds: float, steps: int) -> None:
        """A decode-only engine call of `batch` requests that emitted `tokens` in `seconds` over `steps` steps (a
        burst of plain steps is one call)."""
        if batch <= 0 or steps <= 0 or seconds <= 0:
            return
        acc = self.current.setdefault(_bucket(batch), [0.0, 0.0, 0.0])
        acc[0] += tokens
        acc[1] += seconds
        acc[2] += steps
        self.steps_left -= steps
        if self.steps_left <= 0:
            self._end_phase()

    def speedup(self) -> float | None:
        """Drafting's measured rate over plain decoding's, step-weighted over the buckets both last phases saw
        (None until both have)."""
        spec, plain = self.last.get(True), self.last.get(False)
        if not spec or not plain:
            return None
        num = den = 0.0
        for b, (t, s, n) in spec.items():
            if b in plain and t > 0 and plain[b][0] > 0:
                w = min(n, plain[b][2])
                num += w * (t / s) / (plain[b][0] / plain[b][1])
                den += w
        return num / den if den else None

    def _end_phase(self) -> None:
        ended = self.drafting
        self.last[ended] = self.current
        self.current = {}
        ratio = self.speedup()
        if ratio is None:  # not both measured at a shared batch size yet: the other side's turn
            nxt, length = not ended, 1
        else:
            won = ratio >= GATE_MARGIN
            if won == ended and self.winner == won:  # the winner's long phase ended: measure the loser again
                nxt, length = not won, 1
            else:  # the loser's phase ended, or a first or changed verdict: the winner runs, longer while it keeps winning
                self.backoff = min(self.backoff * 2, self.max_backoff) if self.winner == won else 1
                # the loser's phase cost (its steps) x (how much slower it ran), within the budget of the whole
                slower = 1 / ratio - 1 if not won else ratio - 1
                nxt, length = won, self.backoff
                need = self.phase_steps * (slower / GATE_LOSS_BUDGET - 1)
                self.steps_left = int(min(GATE_MAX_STEPS, max(self.phase_steps * length, need)))
                self.winner, self.drafting = won, nxt
                return
            self.winner = won
        self.drafting = nxt
        self.steps_left = self.phase_steps * length
