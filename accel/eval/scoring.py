"""Task scoring: exact match after normalisation, per match kind, and accuracy with its standard error.

Match kinds:
  exact   "quasi-exact": the reply's first line, stripped of whitespace, quotes, markdown emphasis and final
          punctuation and case-folded, equals the answer; or that first line is a short sentence (<= 12 words)
          containing the answer as a whole phrase ("The capital of France is Paris." for "Paris"). A 135M
          chat model rarely answers with the bare word, and strict equality measured verbosity, not knowledge.
  json    the first parseable {...} object in the reply (code fences and prose around it are ignored)
          equals the answer parsed as JSON
  choice  the first standalone letter A-D in the reply equals the answer letter. Upper case counts anywhere;
          lower case only when written as an option label ("b)", "b.", "b:") or alone, so the article
          "a" in "a good answer is C" is not read as a choice
  number  the last number on the reply's first line ("1,234", "-3.5", "12.") equals the answer numerically, so
          "17 - 2 = 15" and "The answer is 15." both read 15 (GSM8K-style: the result comes last)
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from accel.eval.data import MATCH_KINDS

# A digit run with optional thousands commas and decimals; a trailing "." (end of sentence) is not a decimal.
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_UPPER_CHOICE_RE = re.compile(r"(?<![A-Za-z0-9_'])([A-D])(?![A-Za-z0-9_'])")
_LOWER_CHOICE_RE = re.compile(r"(?<![A-Za-z0-9_'])([a-d])(?:[).:]|\s*$)")


def normalize_exact(text: str) -> str:
    return text.strip().strip("*_`\"'").strip().rstrip(".!").strip().casefold()


def first_line(text: str) -> str:
    return next((line for line in text.strip().splitlines() if line.strip()), "")


def exact_match(reply: str, answer: str) -> bool:
    line, ans = normalize_exact(first_line(reply)), normalize_exact(answer)
    if not ans:
        return not line
    if line == ans or normalize_exact(reply) == ans:
        return True
    return len(line.split()) <= 12 and re.search(rf"(?<!\w){re.escape(ans)}(?!\w)", line) is not None


def extract_last_number(text: str) -> float | None:
    """The last number on the first non-empty line of `text`, or None."""
    found = _NUMBER_RE.findall(first_line(text))
    return float(found[-1].replace(",", "")) if found else None


def extract_number(text: str) -> float | None:
    """The first number in `text` as a float, or None."""
    m = _NUMBER_RE.search(text)
    return float(m.group(0).replace(",", "")) if m else None


def extract_json_object(text: str) -> Any | None:
    """The first {...} JSON object that parses, scanning each '{' in order; None when there is none."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def extract_choice(text: str) -> str | None:
    """The first standalone choice letter A-D (see the module docstring), upper-cased, or None."""
    found = [(m.start(1), m.group(1)) for m in _UPPER_CHOICE_RE.finditer(text)]
    found += [(m.start(1), m.group(1).upper()) for m in _LOWER_CHOICE_RE.finditer(text)]
    return min(found)[1] if found else None


def answer_letter(answer: Any) -> str:
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < 4:
        return "ABCD"[answer]
    letter = extract_choice(str(answer))
    if letter is None:
        raise ValueError(f"choice answer must be a letter A-D or an index 0-3, got {answer!r}")
    return letter


def _answer_number(answer: Any) -> float:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    value = extract_number(str(answer))
    if value is None:
        raise ValueError(f"number answer must contain a number, got {answer!r}")
    return value


def score_reply(reply: str, answer: Any, match: str) -> bool:
    """True when `reply` matches `answer` under the match kind `match`."""
    if match == "exact":
        return exact_match(reply, str(answer))
    if match == "json":
        expected = json.loads(answer) if isinstance(answer, str) else answer
        got = extract_json_object(reply)
        return got is not None and got == expected
    if match == "choice":
        return extract_choice(reply) == answer_letter(answer)
    if match == "number":
        got = extract_last_number(reply)
        expected = _answer_number(answer)
        return got is not None and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    raise ValueError(f"match must be one of {MATCH_KINDS}, got {match!r}")


def accuracy_stderr(num_correct: int, n: int) -> tuple[float, float]:
    """(accuracy p, standard error sqrt(p(1-p)/n)); n must be >= 1."""
    if n < 1 or not 0 <= num_correct <= n:
        raise ValueError(f"need 0 <= num_correct <= n and n >= 1, got num_correct={num_correct}, n={n}")
    p = num_correct / n
    return p, math.sqrt(p * (1.0 - p) / n)
