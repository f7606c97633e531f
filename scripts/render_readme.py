"""Rewrite the ledger blocks of README and benchmarks/README.md from the benchmark ledger (`accel.bench.readme`).

    .venv/bin/python scripts/render_readme.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.bench.readme import RENDERED, render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a file differs from its rendering")
    a = ap.parse_args(argv)
    stale = []
    for name in RENDERED:
        path = ROOT / name
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(name)
            if not a.check:
                path.write_text(new)
    if a.check and stale:
        print(f"differ from the ledger: {', '.join(stale)} (run scripts/render_readme.py)")
    return int(a.check and bool(stale))


if __name__ == "__main__":
    sys.exit(main())
