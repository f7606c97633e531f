"""Evaluation results as dataclasses, with a lossless JSON round trip (`EvalResult.to_json` / `from_json`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from accel.eval.metrics import TextMetrics
from accel.eval.text_protocol import EvalProtocol

SCHEMA_VERSION = 1


@dataclass
class TaskScores:
    """Accuracy of one model on one task (or pooled over tasks): p and sqrt(p(1-p)/n)."""

    n: int
    num_correct: int
    accuracy: float
    stderr: float


@dataclass
class TaskRecord:
    """One example: the greedy reply of the model (and of the baseline) and whether it scored."""

    id: str
    correct: bool
    reply: str
    baseline_correct: bool | None = None
    baseline_reply: str | None = None


@dataclass
class TaskMetrics:
    task: str
    model: TaskScores
    baseline: TaskScores | None = None
    records: list[TaskRecord] = field(default_factory=list)
    max_new_tokens: int | None = None  # the generation budget this task ran with (see task_token_budget)


@dataclass
class EvalResult:
    """Everything `run_eval` measured; `overall` pools all scored tokens, `tasks_overall` all task examples."""

    model: str
    baseline: str | None
    protocol: EvalProtocol
    domains: dict[str, TextMetrics]
    overall: TextMetrics | None
    tasks: dict[str, TaskMetrics] = field(default_factory=dict)
    tasks_overall: TaskMetrics | None = None
    max_new_tokens: int | None = None
    elapsed_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """Flat headline metrics (the report's `quality` shape): ppl, ppl_increase_pct, kl_mean, kl_p99,
        kl_max, top1, num_tokens_scored, task_accuracy, task_accuracy_stderr, and per_domain of the text ones."""

        def text(m: TextMetrics) -> dict[str, Any]:
            return {
                "ppl": m.ppl, "ppl_baseline": m.ppl_baseline, "ppl_increase_pct": m.ppl_increase_pct,
                "kl_mean": m.kl_mean, "kl_p99": m.kl_p99, "kl_max": m.kl_max, "top1": m.top1_agreement,
                "num_tokens_scored": m.num_tokens_scored,
            }

        out: dict[str, Any] = text(self.overall) if self.overall is not None else {}
        if self.tasks_overall is not None:
            out["task_accuracy"] = self.tasks_overall.model.accuracy
            out["task_accuracy_stderr"] = self.tasks_overall.model.stderr
            if self.tasks_overall.baseline is not None:
                out["task_accuracy_baseline"] = self.tasks_overall.baseline.accuracy
        out["per_domain"] = {d: text(m) for d, m in self.domains.items()}
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"eval result schema_version {d.get('schema_version')!r} is not {SCHEMA_VERSION}")
        return cls(
            model=d["model"],
            baseline=d["baseline"],
            protocol=EvalProtocol(**d["protocol"]),
            domains={k: TextMetrics(**v) for k, v in d["domains"].items()},
            overall=TextMetrics(**d["overall"]) if d["overall"] is not None else None,
            tasks={k: _task_metrics(v) for k, v in d["tasks"].items()},
            tasks_overall=_task_metrics(d["tasks_overall"]) if d["tasks_overall"] is not None else None,
            max_new_tokens=d["max_new_tokens"],
            elapsed_s=d["elapsed_s"],
            schema_version=d["schema_version"],
        )

    @classmethod
    def from_json(cls, text: str) -> "EvalResult":
        return cls.from_dict(json.loads(text))


def _task_metrics(d: dict[str, Any]) -> TaskMetrics:
    return TaskMetrics(
        task=d["task"],
        model=TaskScores(**d["model"]),
        baseline=TaskScores(**d["baseline"]) if d["baseline"] is not None else None,
        records=[TaskRecord(**r) for r in d["records"]],
        max_new_tokens=d["max_new_tokens"],
    )
