"""The docs stay a product description, not a lab notebook.

README.md and everything under docs/ are held to a size, to no history words, and to a handful of numbers per
table cell (one number per cell is the aim: the median; run logs belong in the benchmarks' own JSON output).
No model and no torch: this reads text files only.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_CHARS = 10_000
DOCS_MAX_CHARS = 30_000
MAX_NUMBERS_PER_CELL = 4

HISTORY_WORDS = [
    r"\btoday\b",
    r"\byesterday\b",
    r"\bthis week\b",
    r"\blast week\b",
    r"\bsession\b",
    r"\bissue\s*#?\d+",
]

# A number is a numeral standing on its own ("1.97x", "0.0024", "97.5%", "1.88-2.31" holds two); digits inside a
# name (INT8, Q4_K_M, g64, fp32, SmolLM2) are part of the name. Code spans are removed first, so commands and
# identifiers in backticks never count.
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
CELL_SPLIT = re.compile(r"(?<!\\)\|")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _doc_files() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*") if p.is_file())


def _markdown_files() -> list[Path]:
    return [README] + [p for p in _doc_files() if p.suffix == ".md"]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _table_rows(text: str):
    """(line number, cells) for every row of every Markdown table outside fenced code blocks."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
            continue
        if in_fence or not stripped.startswith("|") or TABLE_RULE.match(stripped):
            continue
        body = stripped[1:-1] if stripped.endswith("|") and len(stripped) > 1 else stripped[1:]
        yield number, [cell.strip() for cell in CELL_SPLIT.split(body)]


def _numbers(cell: str) -> list[str]:
    return NUMBER.findall(CODE_SPAN.sub(" ", cell))


def test_readme_fits_its_size():
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_MAX_CHARS, (
        f"README.md is {size} characters, over the {README_MAX_CHARS} limit by {size - README_MAX_CHARS}: "
        "move detail to docs/ and measurements to the benchmarks' JSON output"
    )


def test_docs_fit_their_size():
    sizes = {_rel(p): len(p.read_text(encoding="utf-8")) for p in _doc_files()}
    total = sum(sizes.values())
    assert total <= DOCS_MAX_CHARS, (
        f"docs/ holds {total} characters, over the {DOCS_MAX_CHARS} limit by {total - DOCS_MAX_CHARS}: {sizes}"
    )


def test_docs_name_no_history():
    found = []
    for path in _markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern in HISTORY_WORDS:
                match = re.search(pattern, line, flags=re.IGNORECASE)
                if match:
                    found.append(f"{_rel(path)}:{number}: history word {match.group(0)!r} in: {line.strip()[:120]}")
    assert not found, "docs describe the product, not its history:\n" + "\n".join(found)


def test_table_cells_hold_a_handful_of_numbers():
    over = []
    for path in _markdown_files():
        for number, cells in _table_rows(path.read_text(encoding="utf-8")):
            for column, cell in enumerate(cells, start=1):
                numbers = _numbers(cell)
                if len(numbers) > MAX_NUMBERS_PER_CELL:
                    over.append(
                        f"{_rel(path)}:{number}: column {column} holds {len(numbers)} numbers "
                        f"(at most {MAX_NUMBERS_PER_CELL}): {cell[:120]}"
                    )
    assert not over, "one number per cell (the median; spread in its own column):\n" + "\n".join(over)


def test_the_cell_counter_counts_what_it_should():
    rows = list(_table_rows("| a | b |\n|---|---|\n| 1.97x (1.92-2.03) | `--repeats 5 --batches 16` |\n"))
    assert rows == [(1, ["a", "b"]), (3, ["1.97x (1.92-2.03)", "`--repeats 5 --batches 16`"])]
    assert _numbers(rows[1][1][0]) == ["1.97", "1.92", "2.03"]
    assert _numbers(rows[1][1][1]) == []
    assert _numbers("INT4 g64 / Q4_K_M, fp32, SmolLM2") == []
    assert _numbers("129 MiB, 97.5%, 1,500 prompts") == ["129", "97.5", "1,500"]
    assert [c for _, c in _table_rows(r"| `accel serve [--quant int8\|int4]` | x |")] == [
        [r"`accel serve [--quant int8\|int4]`", "x"]
    ]
