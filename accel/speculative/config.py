"""What the runtime needs to speculate: the proposer, the draft length and the adaptive knobs.

`EngineConfig.speculative` holds one `SpeculativeConfig` (None: no speculation). The recipe's `speculation:` section
maps onto it with `from_recipe` (method none | ngram | draft | distilled, the last a draft trained in the run).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from accel.speculative.adaptive import AdaptiveConfig

SPEC_METHODS = ("ngram", "draft")


# Speculation off from this many running requests, per method (CPU, closed batches of open-ended chat on the
# real model, bench_spec.py, 4 rotated repeats): n-gram lookup costs no draft forward and reads 1.27x at batch 4,
# 0.96x at batch 8; the EAGLE draft (a forward ~0.1 of a step, acceptance ~0.5) 1.07x at batch 4 but 0.90x at
# batch 8, and 0.94x at batch 16 with drafting from 8 running down. n-gram at 8 read 0.89-0.94x in closed batches
# of 16 (drafting in their tail, 5-7 running, where the longest request sets the wall time anyway) against 1.03x
# for a cutoff of 4, so both methods stop at 5. On a GPU verification is nearly free and the cutoff belongs at 32
# or more.
DISABLE_ABOVE_BATCH_SIZE = {"ngram": 5, "draft": 5}


# Adaptive internals, fixed (not configuration):
# - a request whose adaptive length fell to 0 still drafts every PROBE_INTERVAL steps (backing off while probes
#   accept nothing), so a change in its text (it starts quoting its prompt) is noticed;
# - an EAGLE draft's first draft for a request catches up on only its latest positions (eagle.DEFAULT_CONTEXT_WINDOW);
# - the draft's cost relative to a target step is always measured while the engine runs (`adaptive.CostMeter`),
#   starting from a prior of 0.01 for n-gram lookup and 0.25 for a draft model.
PROBE_INTERVAL = 8


@dataclass
class SpeculativeConfig:
    """Speculative decoding inside the engine. The recipe's `speculation:` section, `accel serve` and
    scripts/bench_spec.py use these names.

        speculation:
          method: draft                  # ngram | draft
          draft_model: runs/default/draft
          num_speculative_tokens: 6
          draft_min_path_confidence: 0.3

    method                      "ngram" (prompt lookup) or "draft" (a small model sharing the tokenizer).
    num_speculative_tokens      draft tokens per step at most (k_max).
    ngram_min_n, ngram_max_n    suffix lengths tried by prompt lookup (longest first).
    draft_model                 HF folder of the draft (method "draft"); its tokenizer must match the target's.
    draft_quantization          quantize the draft's decoder Linears ("int8" | "int4"; None: as stored).
    adaptive                    per-request draft length from recent acceptance and the measured draft cost
                                (Leviathan's formula); False: always k_max.
    disable_above_batch_size    no speculation while at least this many requests run (None: never off; "auto":
                                DISABLE_ABOVE_BATCH_SIZE of the method).
    max_step_rows               decode rows + draft tokens one step may carry (None: no cap); the scheduler holds
                                the step to it, drafts of the best recent acceptance first: on
                                CPU a step costs about the same up to ~16 rows (streaming the weights dominates)
                                and grows with every row beyond (compute-bound); n-gram at batch 16 fell to 0.85x
                                of no speculation without the cap.
    draft_min_path_confidence   a draft model proposes a token only while the product of its top probabilities
                                along the chain stays >= this (EAGLE-2's path score); a request whose draft is
                                unsure of its first token drafts nothing this step (on a CPU each verified row
                                costs ~5% of a batch-1 step). None: off.
    draft_min_first_confidence  the gate for a chain's first token only (None: draft_min_path_confidence): the first
                                extra row is the cheapest token a draft gets verified.
    draft_ngram_first           a draft model's requests try prompt lookup first; the model drafts only those it
                                finds nothing for (prompt lookup is free and copies long spans). None: on with a
                                draft model (batch 1, EAGLE draft: open-ended 1.30-1.35x against 1.14-1.24x for the
                                draft alone, input-grounded 1.88x); False measures the draft alone.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    ngram_min_n: int = 2
    ngram_max_n: int = 4
    draft_model: str | None = None
    draft_quantization: str | None = None
    adaptive: bool = True
    disable_above_batch_size: int | str | None = "auto"  # DISABLE_ABOVE_BATCH_SIZE[method]
    max_step_rows: int | None = 16
    draft_min_path_confidence: float | None = None
    draft_min_first_confidence: float | None = None
    draft_ngram_first: bool | None = None

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
        if self.draft_quantization not in (None, "int8", "int4"):
            raise ValueError(f"draft_quantization={self.draft_quantization!r} is invalid; allowed: None, int8, int4")
        for name in ("draft_min_path_confidence", "draft_min_first_confidence"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value} is invalid; allowed: None or in (0, 1)")
            if value is not None and self.method == "ngram":
                raise ValueError(f"{name}={value} needs a draft model; n-gram lookup has no confidence (allowed "
                                 "with method 'ngram': None)")
        if self.method == "ngram" and self.draft_ngram_first:
            raise ValueError("draft_ngram_first=True needs a draft model to fall back to; with method 'ngram' "
                             "prompt lookup is all there is (allowed: None, False)")
        if self.draft_ngram_first is None:
            self.draft_ngram_first = self.method == "draft"
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
        # the draft's prior + verification, until the engine's CostMeter has measured it
        return AdaptiveConfig(k_max=self.num_speculative_tokens, cost_ratio=self.default_cost_ratio() + 0.05,
                              disable_above_batch_size=self.disable_above_batch_size, adaptive=self.adaptive,
                              probe_interval=PROBE_INTERVAL)

    @classmethod
    def from_recipe(cls, speculation, draft_dir: str | None = None) -> SpeculativeConfig | None:
        """The recipe's `speculation` section (the same field names) -> SpeculativeConfig (None for method
        "none"). draft_dir: where the draft lives for "distilled" (the run folder's draft/), and overrides
        `draft_model` for "draft" when the pipeline resolved it to a local folder."""
        if speculation.method == "none":
            return None
        fields = {f.name: getattr(speculation, f.name) for f in dataclasses.fields(cls)}
        if speculation.method == "ngram":
            return cls(**fields)
        draft = draft_dir or speculation.draft_model
        if draft is None:
            raise ValueError(f"speculation.method {speculation.method!r} needs a draft folder; none was produced")
        # a distilled draft is trained in this run and served as trained
        quant = speculation.draft_quantization if speculation.method == "draft" else None
        return cls(**{**fields, "method": "draft", "draft_model": str(draft),
                      "draft_quantization": quant if quant in ("int8", "int4") else None})
