"""What the sampler drew, written into the run folder so a run can be inspected and compared.

    <run>/calibration.jsonl           one line per drawn unit: id, split (train | holdout), domain, bucket,
                                      num_tokens, packed_ids, full_tokens (tokens before truncation)
    <run>/calibration_summary.json    method, seed, counts, the strata table and the notes

Texts and token ids are not stored (the draw is seeded: rerun it to get them back); `read_draw` returns a
`CalibrationDraw` whose units carry ids and counts only.
"""
from __future__ import annotations

import json
from pathlib import Path

from accel.calibration.sampler import CalibrationDraw, DrawnSample, StratumReport

DRAW_FILE = "calibration.jsonl"
SUMMARY_FILE = "calibration_summary.json"


def write_draw(draw: CalibrationDraw, path: str | Path) -> tuple[Path, Path]:
    """Write calibration.jsonl and calibration_summary.json into the folder `path` (created if needed)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for split, units in (("train", draw.train), ("holdout", draw.holdout)):
        for u in units:
            lines.append(json.dumps({"id": u.id, "split": split, "domain": u.domain, "bucket": u.bucket,
                                     "num_tokens": u.num_tokens, "packed_ids": list(u.packed_ids),
                                     "full_tokens": u.full_tokens}, ensure_ascii=False))
    draw_path = folder / DRAW_FILE
    draw_path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    summary = {
        "method": draw.method,
        "seed": draw.seed,
        "num_train": len(draw.train),
        "num_holdout": len(draw.holdout),
        "train_tokens": sum(u.num_tokens for u in draw.train),
        "source_tokens": dict(draw.source_tokens),
        "strata": [{"domain": d, "bucket": b, "available": r.available, "drawn": r.drawn, "held_out": r.held_out}
                   for (d, b), r in draw.strata.items()],
        "notes": list(draw.notes),
    }
    summary_path = folder / SUMMARY_FILE
    summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return draw_path, summary_path


def read_draw(path: str | Path) -> CalibrationDraw:
    """Read a draw written by `write_draw` (ids, strata, counts and notes; no texts or token ids)."""
    folder = Path(path)
    draw_path, summary_path = folder / DRAW_FILE, folder / SUMMARY_FILE
    for p in (draw_path, summary_path):
        if not p.is_file():
            raise FileNotFoundError(f"calibration draw not found: {p} (written by write_draw)")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    train, holdout = [], []
    with draw_path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            unit = DrawnSample(id=row["id"], domain=row["domain"], bucket=row["bucket"], text="", token_ids=(),
                               num_tokens=row["num_tokens"], packed_ids=tuple(row["packed_ids"]),
                               full_tokens=row.get("full_tokens", row["num_tokens"]))
            if row["split"] not in ("train", "holdout"):
                raise ValueError(f"{draw_path}:{n}: split must be 'train' or 'holdout', got {row['split']!r}")
            (train if row["split"] == "train" else holdout).append(unit)
    strata = {(s["domain"], s["bucket"]): StratumReport(s["available"], s["drawn"], s["held_out"])
              for s in summary["strata"]}
    return CalibrationDraw(train=train, holdout=holdout, strata=strata, notes=list(summary["notes"]),
                           method=summary["method"], seed=summary["seed"],
                           source_tokens=dict(summary.get("source_tokens", {})))
