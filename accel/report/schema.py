"""The run result a report is built from (the JSON `accel optimize` writes as eval.json / result.json).

    {
      "name": "default",                        # run name
      "created": "2026-11-29T10:00:00Z",        # optional
      "command": "accel optimize recipes/default.yaml",
      "recipe": "<resolved recipe YAML>",       # accel.recipe.dump_recipe(recipe)
      "machine": {...},                         # accel.report.machine_info(); filled in when missing
      "variants": [                             # the first variant is the reference (baseline) for ratios
        {
          "name": "fp32",
          "quality": {"ppl": 12.1, "ppl_increase_pct": 0.0, "kl_mean": 0.0, "kl_p99": 0.0, "top1": 1.0,
                      "task_accuracy": 0.41, "per_domain": {"code": {"ppl": 5.2, "kl_mean": 0.0, ...}}},
          "speed": {"batch1": <BenchResult JSON>, "batch16": <BenchResult JSON>},  # workload -> result
          "sweep": <SweepResult JSON> | null,   # throughput vs concurrency, optional
          "spec": {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 25,
                   "num_accepted_tokens_per_pos": [9, 7, 5, 4]} | null,
          "spec_per_domain": {"code": {"num_drafts": 5, "num_draft_tokens": 20, "num_accepted_tokens": 15}},
          "size_mb": 513.0 | null, "avg_bits": 32.0 | null  # the whole file's bits per model parameter
        }, ...
      ],
      "sensitivity": {"model.layers.0.mlp.down_proj": {"int4": 0.012, "int8": 0.0004}} | null,  # KL per scheme
      "plan": {"model.layers.0.mlp.down_proj": "int8", ...} | null
    }

`RunReport.from_dict` validates this and names the field that is wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from accel.bench.latency import BenchResult, SweepResult
from accel.speculative.stats import SpecDecodeStats

def scheme_bits(scheme: str) -> float | None:
    """Bits of one stored code of a plan's scheme (a float dtype: its width); None for what is not a scheme."""
    from accel import schemes

    if scheme in ("bf16", "fp32"):
        return {"bf16": 16, "fp32": 32}[scheme]
    return schemes.get(scheme).code_bits if scheme in schemes.names() else None


class ReportInputError(ValueError):
    """The run result is not in the documented shape; the message names the field."""


@dataclass
class Variant:
    name: str
    quality: dict[str, Any] = field(default_factory=dict)
    speed: dict[str, BenchResult] = field(default_factory=dict)
    sweep: SweepResult | None = None
    spec: SpecDecodeStats | None = None
    spec_per_domain: dict[str, SpecDecodeStats] = field(default_factory=dict)
    size_mb: float | None = None
    avg_bits: float | None = None


@dataclass
class RunReport:
    name: str
    variants: list[Variant]
    created: str | None = None
    command: str | None = None
    recipe: str | None = None
    machine: dict[str, Any] | None = None
    sensitivity: dict[str, dict[str, float]] | None = None
    plan: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunReport:
        if not isinstance(d, dict):
            raise ReportInputError(f"a run result must be a JSON object, got {type(d).__name__}")
        variants = d.get("variants")
        if not isinstance(variants, list):
            raise ReportInputError(f"'variants' must be a list of variants, got {type(variants).__name__}")
        return cls(name=str(d.get("name", "run")), variants=[_variant(v, i) for i, v in enumerate(variants)],
                   created=d.get("created"), command=d.get("command"), recipe=d.get("recipe"),
                   machine=d.get("machine"), sensitivity=_sensitivity(d.get("sensitivity")),
                   plan=_plan(d.get("plan")))


def _variant(v: Any, i: int) -> Variant:
    where = f"variants[{i}]"
    if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"]:
        raise ReportInputError(f"{where} must be an object with a non-empty 'name'")
    where = f"variants[{i}] ({v['name']})"
    quality = v.get("quality") or {}
    if not isinstance(quality, dict):
        raise ReportInputError(f"{where}.quality must be an object of metric -> number")
    speed = {}
    for wl, r in (v.get("speed") or {}).items():
        try:
            speed[wl] = r if isinstance(r, BenchResult) else BenchResult.from_dict(r)
        except (TypeError, KeyError) as e:
            raise ReportInputError(f"{where}.speed.{wl} is not a BenchResult: {e}") from None
    sweep = v.get("sweep")
    if sweep is not None and not isinstance(sweep, SweepResult):
        try:
            sweep = SweepResult.from_dict(sweep)
        except (TypeError, KeyError) as e:
            raise ReportInputError(f"{where}.sweep is not a SweepResult: {e}") from None
    return Variant(name=v["name"], quality=quality, speed=speed, sweep=sweep, spec=_spec(v.get("spec"), f"{where}.spec"),
                   spec_per_domain={d: _spec(c, f"{where}.spec_per_domain.{d}")
                                    for d, c in (v.get("spec_per_domain") or {}).items()},
                   size_mb=v.get("size_mb"), avg_bits=v.get("avg_bits"))


def _spec(s: Any, where: str) -> SpecDecodeStats | None:
    if s is None or isinstance(s, SpecDecodeStats):
        return s
    try:
        return SpecDecodeStats.from_dict(s)
    except ValueError as e:
        raise ReportInputError(f"{where}: {e}") from None


def _sensitivity(s: Any) -> dict[str, dict[str, float]] | None:
    if s is None:
        return None
    if not isinstance(s, dict) or not all(isinstance(v, dict) for v in s.values()):
        raise ReportInputError("'sensitivity' must be an object {module: {scheme: kl}}")
    return {m: {k: float(x) for k, x in v.items()} for m, v in s.items()}


def _plan(p: Any) -> dict[str, str] | None:
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ReportInputError("'plan' must be an object {module: scheme}")
    bad = {m: s for m, s in p.items() if scheme_bits(s) is None}
    if bad:
        from accel import schemes

        m, s = next(iter(bad.items()))
        raise ReportInputError(f"plan[{m!r}] = {s!r} is not a scheme; allowed: "
                               f"{', '.join((*schemes.names(), 'bf16', 'fp32'))}")
    return dict(p)


def report_from_bench(result: BenchResult | SweepResult, name: str = "bench", command: str | None = None
                      ) -> RunReport:
    """A one-variant report for `accel bench` output (a single run or a sweep)."""
    if isinstance(result, SweepResult):
        first = result.points[0] if result.points else None
        model = first.config.get("model") if first else None
        v = Variant(name=str(model or name), speed={f"c{p.config.get('concurrency')}": p for p in result.points},
                    sweep=result)
    else:
        first = result
        v = Variant(name=str(result.config.get("model") or name), speed={name: result})
    return RunReport(name=name, variants=[v], command=command, machine=first.machine if first else None)
