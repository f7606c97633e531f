"""lm-evaluation-harness tasks over this project's eval/tasks files (no hub): the same items, prompts and scoring
rules `accel eval` uses, so a server's lm-eval scores can be checked against accel's own.

    lm_eval --model local-completions --model_args base_url=http://127.0.0.1:8000/v1/completions,tokenizer=DIR \\
        --include_path eval/lm_eval --tasks accel_multiple_choice
    lm_eval --model local-chat-completions --apply_chat_template \\
        --model_args base_url=http://127.0.0.1:8000/v1/chat/completions --include_path eval/lm_eval \\
        --tasks accel_arithmetic
"""

from __future__ import annotations

import json
from pathlib import Path

TASKS = Path(__file__).resolve().parents[1] / "tasks"
LETTERS = "ABCD"  # accel.eval.runner.CHOICE_LETTERS


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def _dataset(name: str):
    import datasets

    rows = [{**r, "answer": r["answer"] if isinstance(r["answer"], str) else json.dumps(r["answer"]),
             "choices": r.get("choices") or []} for r in _rows(name)]  # one column type: JSON answers as text
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def multiple_choice(**kwargs):
    return _dataset("multiple_choice")


def arithmetic(**kwargs):
    return _dataset("arithmetic")


def letters(doc: dict) -> list[str]:
    return list(LETTERS[: len(doc["choices"])])


def answer_index(doc: dict) -> int:
    from accel.eval.scoring import answer_letter

    return LETTERS.index(answer_letter(doc["answer"]))


def score(doc: dict, results: list[str]) -> dict:
    """accel eval's rule for the item's match kind (accel.eval.scoring.score_reply)."""
    from accel.eval.scoring import score_reply

    return {"acc": float(score_reply(results[0], doc["answer"], doc["match"]))}
