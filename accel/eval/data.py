"""Load the held-out evaluation sets (eval/text/<domain>.jsonl and eval/tasks/<task>.jsonl).

Formats (the contract with the data builders):
  text  {"id", "domain", "text", "source"}
  tasks {"id", "task", "prompt", "answer", "choices"?, "match": "exact" | "json" | "choice" | "number"}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from accel.fsutil import read_jsonl

MATCH_KINDS = ("exact", "json", "choice", "number")


@dataclass(frozen=True)
class TextDoc:
    id: str
    domain: str
    text: str
    source: str = ""


@dataclass(frozen=True)
class TaskExample:
    id: str
    task: str
    prompt: str
    answer: Any  # str for exact/choice, number or str for number, dict or JSON str for json
    match: str
    choices: tuple[str, ...] | None = None




def _require(row: dict, keys: Sequence[str], where: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; have {sorted(row)}")


def _select(directory: Path, names: Sequence[str] | None, kind: str) -> list[Path]:
    """The <name>.jsonl files of a directory, all of them (sorted) or the named ones (in the given order)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{kind} directory {str(directory)!r} does not exist")
    available = {p.stem: p for p in sorted(directory.glob("*.jsonl"))}
    if names is None:
        return list(available.values())
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; available in {directory}: {sorted(available)}")
    return [available[n] for n in names]


def load_texts(text_dir: str | Path, domains: Sequence[str] | None = None) -> dict[str, list[TextDoc]]:
    """Documents per domain from `text_dir/<domain>.jsonl`, in file order; `domains=None` loads every file."""
    out: dict[str, list[TextDoc]] = {}
    for path in _select(Path(text_dir), domains, "domain"):
        docs = []
        for i, row in enumerate(read_jsonl(path), 1):
            _require(row, ("id", "text"), f"{path} row {i}")
            docs.append(TextDoc(str(row["id"]), str(row.get("domain", path.stem)), row["text"], row.get("source", "")))
        out[path.stem] = docs
    return out


def load_tasks(tasks_dir: str | Path, tasks: Sequence[str] | None = None) -> dict[str, list[TaskExample]]:
    """Examples per task from `tasks_dir/<task>.jsonl`, in file order; `tasks=None` loads every file."""
    out: dict[str, list[TaskExample]] = {}
    for path in _select(Path(tasks_dir), tasks, "task"):
        examples = []
        for i, row in enumerate(read_jsonl(path), 1):
            where = f"{path} row {i}"
            _require(row, ("id", "prompt", "answer", "match"), where)
            if row["match"] not in MATCH_KINDS:
                raise ValueError(f"{where}: match must be one of {MATCH_KINDS}, got {row['match']!r}")
            choices = row.get("choices")
            examples.append(
                TaskExample(
                    id=str(row["id"]),
                    task=str(row.get("task", path.stem)),
                    prompt=row["prompt"],
                    answer=row["answer"],
                    match=row["match"],
                    choices=tuple(choices) if choices is not None else None,
                )
            )
        out[path.stem] = examples
    return out
