"""The committed data: schema of every line, ids, counts, and no overlap between eval/ and calibration_data/.

Overlap means exact text reuse, a shared 50-character substring, or a shared run of 13 words
(case-folded). The builder (scripts/build_data.py) keeps the two apart by construction; this test is the
independent check.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from accel.calibration.overlap import OverlapIndex, find_overlaps

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ["chat", "code", "math", "prose", "structured", "multilingual"]
TASKS = ["arithmetic", "json_extraction", "multiple_choice", "formatting", "factual"]
TEXT_KEYS = {"id", "domain", "text", "source"}
MATCH_KINDS = {"exact", "json", "choice", "number"}


def _read(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _cal() -> dict[str, list[dict]]:
    return {d: _read(ROOT / "calibration_data" / f"{d}.jsonl") for d in DOMAINS}


def _eval_text() -> dict[str, list[dict]]:
    return {d: _read(ROOT / "eval" / "text" / f"{d}.jsonl") for d in DOMAINS}


def _tasks() -> dict[str, list[dict]]:
    return {t: _read(ROOT / "eval" / "tasks" / f"{t}.jsonl") for t in TASKS}


def test_folders_hold_exactly_the_listed_files():
    assert sorted(p.stem for p in (ROOT / "calibration_data").glob("*.jsonl")) == sorted(DOMAINS)
    assert sorted(p.stem for p in (ROOT / "eval" / "text").glob("*.jsonl")) == sorted(DOMAINS)
    assert sorted(p.stem for p in (ROOT / "eval" / "tasks").glob("*.jsonl")) == sorted(TASKS)
    assert (ROOT / "calibration_data" / "README.md").exists()
    assert (ROOT / "eval" / "README.md").exists()


@pytest.mark.parametrize("which", ["calibration", "eval"])
def test_text_rows_schema_and_ids(which):
    sets = _cal() if which == "calibration" else _eval_text()
    prefix = "" if which == "calibration" else "eval-"
    for domain, rows in sets.items():
        for i, row in enumerate(rows, 1):
            assert set(row) == TEXT_KEYS, (domain, row.get("id"))
            assert row["domain"] == domain
            assert row["id"] == f"{prefix}{domain}-{i:04d}"
            assert isinstance(row["text"], str) and row["text"].strip()
            assert row["source"] == "handwritten" or row["source"].startswith("template:")


def test_calibration_has_at_least_100_per_domain_and_eval_25_to_40():
    assert {d: len(r) >= 100 for d, r in _cal().items()} == dict.fromkeys(DOMAINS, True)
    assert {d: 25 <= len(r) <= 40 for d, r in _eval_text().items()} == dict.fromkeys(DOMAINS, True)


def test_calibration_lengths_are_spread():
    # Character proxies for the token buckets (the README table has the real token counts).
    for domain, rows in _cal().items():
        lengths = [len(r["text"]) for r in rows]
        assert min(lengths) < 300 and max(lengths) > 2000, domain


def test_task_rows_schema():
    for task, rows in _tasks().items():
        assert 40 <= len(rows) <= 60, task
        for i, row in enumerate(rows, 1):
            assert row["id"] == f"{task}-{i:04d}"
            assert row["task"] == task
            assert row["match"] in MATCH_KINDS
            assert {"id", "task", "prompt", "answer", "match"} <= set(row) <= {"id", "task", "prompt", "answer",
                                                                               "match", "choices"}
            assert row["prompt"].strip() and row["answer"].strip()
            if row["match"] == "number":
                assert math.isfinite(float(row["answer"]))
            if row["match"] == "json":
                assert isinstance(json.loads(row["answer"]), dict)
            if row["match"] == "choice":
                assert row["answer"] in "ABCD" and len(row["choices"]) == 4
                # The gold letter points at the option the prompt lists under that letter.
                letter_line = f"{row['answer']}. {row['choices']['ABCD'.index(row['answer'])]}"
                assert letter_line in row["prompt"]
        assert len({r["prompt"] for r in rows}) == len(rows), f"duplicate prompts in {task}"


def test_task_kinds():
    kinds = {t: {r["match"] for r in rows} for t, rows in _tasks().items()}
    assert kinds == {"arithmetic": {"number"}, "json_extraction": {"json"}, "multiple_choice": {"choice"},
                     "formatting": {"exact"}, "factual": {"exact", "number"}}


def test_eval_does_not_overlap_calibration():
    cal = [r["text"] for rows in _cal().values() for r in rows]
    held_out = [r["text"] for rows in _eval_text().values() for r in rows]
    held_out += [r["prompt"] + "\n" + r["answer"] for rows in _tasks().values() for r in rows]
    assert not set(cal) & set(held_out)
    # Index the (smaller) eval side, scan calibration.
    hits = find_overlaps(held_out, cal, min_chars=50, ngram=13)
    assert hits == [], hits[:3]


def test_overlap_checker_catches_shared_substrings_and_ngrams():
    base = "The quick brown fox jumps over the lazy dog while the farmer watches from the gate at dawn."
    index = OverlapIndex([base], min_chars=50, ngram=13)
    assert index.first_overlap("Prefix! " + base[10:70] + " suffix").kind == "chars"
    # Same 13 words, different spacing and case: no 50-char window in common, but a word 13-gram.
    spaced = "  ".join(base.upper().split()[:14])
    assert index.first_overlap(spaced).kind == "words"
    assert index.first_overlap("An unrelated sentence about tea and maps, long enough to have windows.") is None
