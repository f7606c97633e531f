"""What the runtime needs to speculate: the proposer, the draft length and the adaptive knobs.

`EngineConfig.speculative` holds one `SpecConfig` (None: no speculation). The recipe's `speculation:` section
maps onto it with `from_recipe` (method none | ngram | draft_model | distilled).
"""

from __future__ import annotations

from dataclasses import dataclass

from accel.spec.adaptive import AdaptiveConfig

SPEC_METHODS = ("ngram", "draft")


# Speculation off from this many running requests, per method (CPU, closed batches of open-ended chat on the
# real model, bench_spec.py, 4 rotated repeats): n-gram lookup costs no draft forward and reads 1.27x at batch 4,
# 0.96x at batch 8; the EAGLE draft (a forward ~0.1 of a step, acceptance ~0.5) 1.07x at batch 4 but 0.90x at
# batch 8, and 0.94x at batch 16 with drafting from 8 running down. n-gram at 8 read 0.89-0.94x in closed batches
# of 16 (drafting in their tail, 5-7 running, where the longest request sets the wall time anyway) against 1.03x
# for a cutoff of 4, so both methods stop at 5. On a GPU verification is nearly free and the cutoff belongs at 32
# or more.
DISABLE_ABOVE_BATCH_SIZE = {"ngram": 5, "draft": 5}


@dataclass
class SpecConfig:
    """Speculative decoding inside the engine.

    method                    "ngram" (prompt lookup) or "draft" (a small model sharing the tokenizer).
    num_speculative_tokens    draft tokens per step at most (k_max).
    ngram_min_n, ngram_max_n  suffix lengths tried by prompt lookup (longest first).
    draft_model               HF folder of the draft (method "draft"); its tokenizer must match the target's.
    draft_quant_scheme        quantize the draft's decoder Linears ("int8" | "int4"; None: as stored).
    adaptive                  per-request draft length from recent acceptance (False: always k_max).
    cost_ratio                cost of one draft token relative to one target decode step, verification of the
                              extra position included; the adaptive rule picks k with Leviathan's formula.
                              None: measured while the engine runs (`adaptive.CostMeter`: time proposing per
                              draft forward + the fitted extra target time per verified row), starting from
                              0.06 for n-gram and 0.3 for a draft model; a number fixes it.
    disable_above_batch_size  no speculation at all while at least this many requests run (None: never off;
                              "auto": DISABLE_ABOVE_BATCH_SIZE of the method, 5 on CPU for n-gram and
                              for a draft model; see there).
    draft_min_confidence      a draft model stops a request's chain after a token it gave less than this
                              probability (the token itself is still proposed: its forward is paid and its
                              verification costs one row); None: chains run to k. EAGLE-2's observation: a
                              feature draft's confidence tracks its acceptance.
    draft_min_path_confidence a draft model proposes a token only while the product of its top probabilities
                              along the chain (that position's included) stays >= this; the chain ends before
                              the first position below it (EAGLE-2's path score: a calibrated draft's chance
                              that the whole path so far is accepted). Unlike draft_min_confidence, an unlikely
                              token is not verified at all (on a CPU each verified row costs ~5% of a batch-1
                              step) and a request whose draft is unsure of even its first token drafts nothing
                              this step. None: off.
    draft_min_first_confidence  the gate for a chain's first token only (its top probability); later tokens
                              still need the path score >= draft_min_path_confidence, and a chain whose path
                              is already below that stops without another draft forward. Why: the first extra
                              row is the cheapest token a draft gets verified (its forward was paid to learn
                              that the draft is unsure), so it pays from a lower probability than a chain's
                              continuation, which costs a draft forward more. None: draft_min_path_confidence.
    draft_ngram_first         a draft model's requests try prompt lookup (ngram_min_n..ngram_max_n) first; the
                              draft model drafts only those it finds nothing for (`NgramFirstProposer`). Prompt
                              lookup is free and copies long spans; the model covers the rest.
    draft_context_window      an EAGLE draft's first draft for a request catches up on only this many of its
                              latest positions (None: the whole context); see EagleProposer.
    max_step_rows             decode rows + draft tokens one step may carry (None: no cap). Drafts go to the
                              requests with the best recent acceptance until the step holds this many rows: on
                              CPU a step costs about the same up to ~16 rows (streaming the weights dominates)
                              and grows with every row beyond (compute-bound), so drafts past the cap cost more
                              than they return at batch 4-15 (measured: n-gram at batch 16 fell to 0.85x of no
                              speculation without the cap).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    ngram_min_n: int = 2
    ngram_max_n: int = 4
    draft_model: str | None = None
    draft_quant_scheme: str | None = None
    adaptive: bool = True
    cost_ratio: float | None = None
    disable_above_batch_size: int | str | None = "auto"  # DISABLE_ABOVE_BATCH_SIZE[method]
    max_step_rows: int | None = 16
    probe_interval: int = 8
    draft_min_confidence: float | None = None
    draft_min_path_confidence: float | None = None
    draft_min_first_confidence: float | None = None
    draft_ngram_first: bool = False
    draft_context_window: int | None = 128

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative method={self.method!r} is invalid; allowed: {SPEC_METHODS}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={self.num_speculative_tokens} is invalid; allowed: >= 1")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ValueError(f"ngram_min_n={self.ngram_min_n}, ngram_max_n={self.ngram_max_n} are invalid; "
                             "allowed: 1 <= ngram_min_n <= ngram_max_n")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model (an HF folder sharing the tokenizer)")
        if self.draft_quant_scheme not in (None, "int8", "int4"):
            raise ValueError(f"draft_quant_scheme={self.draft_quant_scheme!r} is invalid; allowed: None, int8, int4")
        if self.cost_ratio is not None and self.cost_ratio < 0:
            raise ValueError(f"cost_ratio={self.cost_ratio} is invalid; allowed: None or >= 0")
        if self.draft_min_confidence is not None and not 0.0 < self.draft_min_confidence < 1.0:
            raise ValueError(f"draft_min_confidence={self.draft_min_confidence} is invalid; allowed: None or in (0, 1)")
        if self.draft_min_path_confidence is not None and not 0.0 < self.draft_min_path_confidence < 1.0:
            raise ValueError(f"draft_min_path_confidence={self.draft_min_path_confidence} is invalid; "
                             "allowed: None or in (0, 1)")
        if self.draft_min_first_confidence is not None and not 0.0 < self.draft_min_first_confidence < 1.0:
            raise ValueError(f"draft_min_first_confidence={self.draft_min_first_confidence} is invalid; "
                             "allowed: None or in (0, 1)")
        if self.method == "ngram" and (self.draft_min_confidence is not None
                                       or self.draft_min_path_confidence is not None
                                       or self.draft_min_first_confidence is not None):
            raise ValueError("draft_min_confidence / draft_min_path_confidence / draft_min_first_confidence need a "
                             "draft model; n-gram lookup has no confidence (allowed with method 'ngram': None)")
        if self.method == "ngram" and self.draft_ngram_first:
            raise ValueError("draft_ngram_first=True needs a draft model to fall back to; with method 'ngram' "
                             "prompt lookup is all there is (allowed: False)")
        if self.draft_context_window is not None and self.draft_context_window < 1:
            raise ValueError(f"draft_context_window={self.draft_context_window} is invalid; allowed: None or >= 1")
        if self.max_step_rows is not None and self.max_step_rows < 2:
            raise ValueError(f"max_step_rows={self.max_step_rows} is invalid; allowed: None or >= 2")
        if self.disable_above_batch_size == "auto":
            self.disable_above_batch_size = DISABLE_ABOVE_BATCH_SIZE[self.method]
        if self.disable_above_batch_size is not None and (not isinstance(self.disable_above_batch_size, int)
                                                          or self.disable_above_batch_size < 1):
            raise ValueError(f"disable_above_batch_size={self.disable_above_batch_size!r} is invalid; "
                             "allowed: None, \"auto\" or an integer >= 1")

    def default_cost_ratio(self) -> float:
        """The draft's own cost before it was measured: n-gram lookup ~0, a small draft model ~0.25 (CPU)."""
        return 0.01 if self.method == "ngram" else 0.25

    def adaptive_config(self) -> AdaptiveConfig:
        # the configured ratio, or (measured later by the engine's CostMeter) the draft's prior + verification
        ratio = self.cost_ratio if self.cost_ratio is not None else self.default_cost_ratio() + 0.05
        return AdaptiveConfig(k_max=self.num_speculative_tokens, cost_ratio=ratio,
                              disable_at_batch_size=self.disable_above_batch_size, adaptive=self.adaptive,
                              probe_interval=self.probe_interval)

    @classmethod
    def from_recipe(cls, speculation, draft_dir: str | None = None) -> SpecConfig | None:
        """The recipe's `speculation` section -> SpecConfig (None for method "none").

        draft_dir: where the draft lives for "distilled" (the run folder's draft/), and overrides
        `draft_model` for "draft_model" when the pipeline resolved it to a local folder."""
        if speculation.method == "none":
            return None
        common = dict(num_speculative_tokens=speculation.num_speculative_tokens, adaptive=speculation.adaptive,
                      disable_above_batch_size=speculation.disable_above_batch_size,
                      max_step_rows=speculation.max_step_rows)
        if speculation.method == "ngram":
            return cls(method="ngram", ngram_min_n=speculation.ngram.min_n, ngram_max_n=speculation.ngram.max_n,
                       **common)
        draft = draft_dir or speculation.draft_model
        if draft is None:
            raise ValueError(f"speculation.method {speculation.method!r} needs a draft folder; none was produced")
        scheme = speculation.draft_quantization if speculation.method == "draft_model" else None
        return cls(method="draft", draft_model=str(draft), draft_min_confidence=speculation.draft_min_confidence,
                   draft_min_path_confidence=speculation.draft_min_path_confidence,
                   draft_min_first_confidence=speculation.draft_min_first_confidence,
                   draft_ngram_first=speculation.draft_ngram_first, ngram_min_n=speculation.ngram.min_n,
                   ngram_max_n=speculation.ngram.max_n,
                   draft_context_window=speculation.draft_context_window,
                   draft_quant_scheme=scheme if scheme in ("int8", "int4") else None, **common)
