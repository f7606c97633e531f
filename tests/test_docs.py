"""The docs stay a product description, not a lab notebook.

README.md and everything under docs/ are held to a size, to no history words, and to a handful of numbers per
table cell (one number per cell is the aim: the median; run logs belong in the benchmarks' own JSON output).
No model and no torch: this reads text files only.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_CHARS = 8_000
DOCS_MAX_CHARS = 25_000
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


# Code text (comments, docstrings, --help strings, recipe comments) keeps one "why" sentence; a measured result
# belongs in benchmarks/ledger/ (with the command, commit and machine that gave it) and docs/DESIGN.md.
CODE_TEXT_DIRS = ("accel", "scripts")
RECIPES = ROOT / "recipes"


def _run_figure(text: str) -> str | None:
    """The measured figure in a line of code text, or None.

    A run figure is a result read off a run: a ratio that is decimal, approximate or a range ("1.36x", "~2x",
    "5-10x", "0.88x the time") or a whole one with a comparison ("17x faster"); a before/after ("20.4 -> 15.3 ms");
    two numbers compared ("257 vs 301 tok/s", "31 s against 529 s"); a rate or timing ("12 tok/s", "3.1 ms",
    "40 GB/s", "~90 s", "took 0.6 s", "4.2 min of the run"); a peak ("12.97 GB peak"); a divergence or rank
    correlation ("KLD 0.063", "Spearman 0.95"); a signed or comparative change ("+12%", "30-40% slower").
    Constants the code implements carry none of these marks: block sizes, "4 + 20/g bits", "2 MB pages",
    "4 MiB", "4x fewer bytes", "32 x 512", a KL written as a setting ("KL budget of 0.005"), a set interval
    ("5 ms switch interval"), the name of a statistic ("Spearman correlation").
    """
    num = r"(?<![\w.])~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?"  # "1.36", "~40", "1.04-1.07"; not the 8 of "int8"
    patterns = (
        r"(?<![\w.])(?:~\d+(?:\.\d+)?|\d+\.\d+|\d+(?:\.\d+)?-\d+(?:\.\d+)?)x\b",
        r"(?<![\w.])\d+x (?:faster|slower|cheaper|dearer|more|less|the (?:speed|time|cost))\b",
        r"\d[\d.,]*\s*(?:%|x|s|ms|us|GB|MB|MiB|tok/s)?\s*(?:->|→)\s*[+-]?~?\d",
        num + r"\s*(?:%|x|s|ms|us|tok/s|GB|MiB)?\s+(?:vs\.?|versus|against)\s+[^\s\d]{0,12}\d",
        num + r"\s*(?:tok/s|tokens/s|ms|us|µs|GB/s|GFLOPS)\b(?! (?:switch )?interval)",
        num + r"\s*(?:s|min|minutes|seconds)\s+(?:against|of the)\b",
        r"~\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s*(?:s|min|minutes|seconds|hours)\b",
        r"\btook\s+~?\d[\d.,-]*\s*(?:s|ms|us|min|minutes|seconds)\b",
        num + r"\s*GB\s+(?:against|peak)\b|\bpeak(?:ed)?\b[^.;]{0,20}?\d+(?:\.\d+)?\s*GB",
        r"\bKLD?\s+[+-]?\d*\.\d+",
        r"\bSpearman\s+(?:of\s+)?~?\d",
        r"(?<![\w.+-])[+-]\d+(?:\.\d+)?\s*%",
        num + r"\s*%\s+(?:slower|faster|cheaper|dearer|throughput)\b",
    )
    for pattern in patterns:
        match = re.search(pattern, text)
        if match:
            return match.group(0)
    return None


def _python_code_text(path: Path):
    """(line number, text) for each comment, docstring line and help= string line of a Python file."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    nodes = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        # A bare string statement is a docstring: of a module, class or function, or of a config field, which
        # the recipe's JSON schema and the generated --help options show (`cli/options.py`).
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            nodes.append(node.value)
        elif isinstance(node, ast.keyword) and node.arg == "help":
            nodes.append(node.value)  # argparse add_argument, typer.Option / typer.Argument / app.command
    for node in nodes:
        for number in range(node.lineno, node.end_lineno + 1):
            yield number, lines[number - 1]


def _recipe_comments(path: Path):
    """(line number, text) for each comment of a recipe, and its description line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#") or stripped.startswith("description:"):
            yield number, stripped
        elif " #" in line:
            yield number, line[line.index(" #") :]


CSRC = ROOT / "accel" / "kernels" / "csrc"


def _cpp_comments(path: Path):
    """(line number, text) for each comment line of a C++ file: `//` comments and the lines of `/* */` blocks (a
    line-based scan: a `//` or `/*` inside a string literal would count too)."""
    in_block = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        rest, parts = line, []
        while rest:
            if in_block:
                end = rest.find("*/")
                parts.append(rest if end < 0 else rest[:end])
                if end < 0:
                    break
                in_block, rest = False, rest[end + 2 :]
                continue
            line_at, block_at = rest.find("//"), rest.find("/*")
            if line_at >= 0 and (block_at < 0 or line_at < block_at):
                parts.append(rest[line_at:])
                break
            if block_at < 0:
                break
            in_block, rest = True, rest[block_at + 2 :]
        if any(part.strip() for part in parts):
            yield number, " ".join(part.strip() for part in parts)


def _code_text():
    for path in sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        for number, text in _cpp_comments(path):
            yield _rel(path), number, text
    for folder in CODE_TEXT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, text in _python_code_text(path):
                yield _rel(path), number, text
    for path in sorted(RECIPES.glob("*.yaml")):
        for number, text in _recipe_comments(path):
            yield _rel(path), number, text


def test_no_run_figures_in_code_text():
    found = []
    for rel, number, text in _code_text():
        figure = _run_figure(text)
        if figure:
            found.append(f"{rel}:{number}: {figure!r} in: {text.strip()[:120]}")
    assert not found, (
        "comments, docstrings, --help text and recipe comments keep the why, not a measured figure "
        "(that goes to benchmarks/ledger/ and docs/DESIGN.md):\n" + "\n".join(found)
    )


def test_the_run_figure_heuristic_tells_figures_from_constants():
    figures = ["1.04-1.07x", "20.4 -> 15.3 ms", "257 vs 301 tok/s", "KLD 0.068 -> 0.063 at 60 steps",
               "31 s against 529 s", "Spearman 0.953", "(0.6x the time)", "12.97 GB peak", "4.2 min of the 1.5B's run",
               "math +12%", "multilingual -33%", "a step 30-40% slower", "~2x an fp32 GEMV", "17x faster",
               "~45 us", "took 0.6-1.1 s", "peaked at 18.1 GB", "held-out KL 0.0576"]
    constants = ["4 + 20/g bits", "max / 127", "2 MB pages", "4 MiB", "[N, V]", "blocks of 32", "8.5 bits",
                 "a held-out KL budget of 0.005", "4x fewer bytes", "32 x 512", "int8 g64, Q4_K_M, fp32",
                 "the 5 ms switch interval", "Spearman rank correlation", "took 8 + 32/g", "+-10%",
                 "0.93 GB each, 1.9 GB of the stage", "torch>=2.10,<=2.14.0"]
    assert [f for f in figures if _run_figure(f) is None] == []
    assert [c for c in constants if _run_figure(c) is not None] == []
