"""What the runtime needs to speculate: the proposer, the draft length and the adaptive knobs.

`EngineConfig.speculative` holds one `SpeculativeConfig` (None: no speculation). Its fields are declared here once:
the recipe's `speculation:` section is this class with two more methods (none, and distilled: a draft trained in the
run), `accel serve --speculative-config` takes its fields as JSON, scripts/bench_spec.py by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Literal

from accel.runtime.config import STRICT, check_choice, check_range
from accel.speculative.adaptive import AdaptiveConfig

SPEC_METHODS = ("ngram", "draft")


# Speculation off from this many running requests, per method (CPU, closed batches of open-ended chat on the
# real model, bench_spec.py, 4 rotated repeats): n-gram lookup costs no draft forward and gains at batch 4, not at
# batch 8 (docs/DESIGN.md, Speculative decoding); the EAGLE draft gains at batch 4 but loses at batch 8, and at
# batch 16 with drafting from 8 running down. In closed batches of 16 (drafting in their tail, where the longest
# request sets the wall time anyway) n-gram lost with a cutoff of 8 and gained with one of 4, so both methods stop
# at 5. On a GPU verification is nearly free and the cutoff belongs at 32 or more.
DISABLE_ABOVE_BATCH_SIZE = {"ngram": 5, "draft": 5}


# Adaptive internals are fixed, not configuration (accel.speculative.adaptive: DECAY, PRIOR_ALPHA, PROBE_INTERVAL);
# the draft's cost relative to a target step is always measured while the engine runs (`adaptive.CostMeter`),
# starting from a prior of 0.01 for n-gram lookup and 0.25 for a draft model.
# The prior cost ratio adds what verifying one extra row costs a CPU step (a decode step over 2 rows against 1)
# until the engine's CostMeter has measured the real ratio.
VERIFY_ROW_COST_PRIOR = 0.05


@dataclass(kw_only=True)
class SpeculativeConfig:
    """Speculative decoding inside the engine.

        speculation:
          method: draft                  # ngram | draft
          draft_model: runs/default/draft
          num_speculative_tokens: 6
          draft_min_path_confidence: 0.3
    """

    __pydantic_config__ = STRICT
    METHODS: ClassVar[tuple[str, ...]] = SPEC_METHODS

    method: Literal["ngram", "draft"] = "ngram"
    """ngram: prompt lookup; draft: a small model sharing the target's tokenizer."""
    num_speculative_tokens: int = 4
    """Draft tokens per step at most (k_max)."""
    ngram_min_n: int = 2
    """Shortest suffix prompt lookup tries."""
    ngram_max_n: int = 4
    """Longest suffix prompt lookup tries (it tries longest first)."""
    draft_model: str | None = None
    """HF folder or registry name of the draft (method draft); its tokenizer must match the target's."""
    draft_quantization: Literal["int8", "int4"] | None = None
    """Quantize the draft's decoder Linears; None: as stored."""
    adaptive: bool = True
    """Per-request draft length from recent acceptance and the measured draft cost (Leviathan's formula); false:
    always num_speculative_tokens."""
    disable_above_batch_size: int | Literal["auto"] | None = "auto"
    """No speculation while at least this many requests run (None: never off; auto: DISABLE_ABOVE_BATCH_SIZE of
    the method)."""
    max_step_rows: int | None = 16
    """Decode rows plus draft tokens one step may carry (None: no cap); drafts of the best recent acceptance go
    first. On CPU a step costs about the same up to ~16 rows and grows with every row beyond."""
    draft_min_path_confidence: float | None = None
    """A draft model proposes a token only while the product of its top probabilities along the chain stays at or
    above this (EAGLE-2's path score); None: off."""
    draft_min_first_confidence: float | None = None
    """The same gate for a chain's first token only (None: draft_min_path_confidence)."""
    draft_ngram_first: bool | None = None
    """A draft model's requests try prompt lookup first; the model drafts only where it finds nothing (None: on
    with a draft model; false measures the draft alone)."""

    def __post_init__(self) -> None:
        check_choice(self, "method", self.METHODS)
        drafts = self.method in ("draft", "distilled")  # "distilled": the recipe's draft trained in the run
        check_range(self, "num_speculative_tokens", 1, 16)
        check_range(self, "ngram_min_n", 1, 8)
        check_range(self, "ngram_max_n", 1, 8)
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(f"ngram_min_n={self.ngram_min_n}, ngram_max_n={self.ngram_max_n} are invalid; "
                             "allowed: ngram_min_n <= ngram_max_n")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model (a path or model name of a draft sharing the "
                             "target's tokenizer)")
        if self.method != "draft" and self.draft_model:
            raise ValueError(f"draft_model is set but method is {self.method!r}; allowed with it: 'draft'")
        check_choice(self, "draft_quantization", (None, "int8", "int4"))
        for name in ("draft_min_path_confidence", "draft_min_first_confidence"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                raise ValueError(f"{name}={value!r} is invalid; allowed: None or in (0, 1)")
        for name in ("draft_min_path_confidence", "draft_min_first_confidence", "draft_quantization"):
            if getattr(self, name) is not None and not drafts:
                raise ValueError(f"{name}={getattr(self, name)!r} needs a draft model; method is {self.method!r} "
                                 "(allowed with it: draft, distilled)")
        if self.draft_ngram_first and not drafts:
            raise ValueError(f"draft_ngram_first=True needs a draft model to fall back to; method is "
                             f"{self.method!r} (allowed with it: draft, distilled)")
        if self.draft_ngram_first is None and self.method in SPEC_METHODS:
            self.draft_ngram_first = self.method == "draft"
        check_range(self, "max_step_rows", 2, optional=True)
        if self.disable_above_batch_size == "auto" and self.method in SPEC_METHODS:
            self.disable_above_batch_size = DISABLE_ABOVE_BATCH_SIZE[self.method]
        if self.disable_above_batch_size != "auto":
            check_range(self, "disable_above_batch_size", 1, optional=True)

    def default_cost_ratio(self) -> float:
        """The draft's own cost before it was measured: n-gram lookup ~0, a small draft model ~0.25 (CPU)."""
        return 0.01 if self.method == "ngram" else 0.25

    def adaptive_config(self) -> AdaptiveConfig:
        return AdaptiveConfig(k_max=self.num_speculative_tokens,
                              cost_ratio=self.default_cost_ratio() + VERIFY_ROW_COST_PRIOR,
                              disable_above_batch_size=self.disable_above_batch_size, adaptive=self.adaptive)

    @classmethod
    def from_recipe(cls, speculation, draft_dir: str | None = None) -> SpeculativeConfig | None:
        """The recipe's `speculation` section (this class's fields, method none | ngram | draft | distilled; or
        that section as an export's accel.json stores it, a dict) ->
        the engine's SpeculativeConfig (None for method "none"). draft_dir: where the draft lives for "distilled"
        (the run folder's draft/), and overrides `draft_model` for "draft" when the pipeline resolved it to a
        local folder."""
        given = speculation if isinstance(speculation, dict) else {f.name: getattr(speculation, f.name)
                                                                   for f in fields(cls)}
        method = given.get("method", "ngram")
        if method == "none":
            return None
        values = {f.name: given[f.name] for f in fields(cls) if f.name in given}  # an older export lacks new fields
        if method == "ngram":
            return cls(**values)
        draft = draft_dir or given.get("draft_model")
        if draft is None:
            raise ValueError(f"speculation.method {method!r} needs a draft folder; none was produced")
        return cls(**{**values, "method": "draft", "draft_model": str(draft)})
