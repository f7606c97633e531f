"""Rewrite README's ledger blocks from the benchmark ledger (`accel.bench.readme`).

    .venv/bin/python scripts/render_readme.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.bench.readme import render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if README differs from its rendering")
    a = ap.parse_args(argv)
    path = ROOT / "README.md"
    text = path.read_text()
    new = render(text)
    if a.check:
        return int(new != text)
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
