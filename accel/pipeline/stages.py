"""Resumable stages: the mechanism `accel optimize` runs on.

A stage declares which recipe sections and which upstream stages it depends on, and the files it writes into the
run folder. Its *key* is a hash of those recipe sections, the upstream stages' output hashes and the stage's version;
a rerun skips a stage whose key and output files are unchanged. Outputs are written into a temp folder and moved into
the run folder only when the stage finished, and the manifest (`manifest.json`) is rewritten atomically after each
stage, so Ctrl-C or a crash leaves finished stages intact and no half-written file under a final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel import memory
from accel.fsutil import atomic_write_json, normalize_modes, sha256_file

MANIFEST = "manifest.json"


@dataclass
class StageContext:
    """What a stage's function gets: the recipe, the run folder, a temp folder for its outputs, upstream summaries,
    and `state`, an in-memory dict shared by stages of one run (loaded models etc.; never persisted)."""

    recipe: Any
    run_dir: Path
    out_dir: Path
    summaries: dict[str, dict]
    state: dict[str, Any]

    def upstream_path(self, name: str) -> Path:
        """A file written by an earlier stage (already in the run folder)."""
        return self.run_dir / name


@dataclass
class Stage:
    name: str
    fn: Callable[[StageContext], dict]
    """Writes its files into ctx.out_dir and returns a JSON-able summary."""
    sections: tuple[str, ...] = ()
    """Recipe sections (or dotted fields, e.g. "quantization.budget") whose values enter the key."""
    after: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    """Files or folders (relative to the run folder) the stage writes; all must exist when it returns."""
    version: str = "1"
    extra_key: Callable[[Any], str] | None = None
    """Extra inputs to hash (e.g. a model folder's fingerprint)."""


@dataclass
class StageRecord:
    name: str
    key: str
    status: str  # ran | reused | failed
    duration_s: float
    summary: dict = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # relative path -> sha256 (folders: hash of the file hashes)
    peak_rss_gb: float | None = None  # the process's most resident memory while the stage ran


def hash_output(path: Path) -> str:
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(str(p.relative_to(path)).encode())
            h.update(sha256_file(p).encode())
        return h.hexdigest()
    return sha256_file(path)


def _section(data: dict, path: str) -> Any:
    """A recipe section or a field inside one ("quantization" or "quantization.budget")."""
    for part in path.split("."):
        data = data[part]
    return data


def _stage_key(stage: Stage, recipe: Any, records: dict[str, StageRecord]) -> str:
    data = {
        "stage": stage.name,
        "version": stage.version,
        "sections": {s: _section(recipe.model_dump(mode="json"), s) for s in stage.sections},
        "upstream": {a: records[a].outputs for a in stage.after if a in records},
        "extra": stage.extra_key(recipe) if stage.extra_key else None,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:20]


def read_manifest(run_dir: Path) -> dict[str, dict]:
    p = Path(run_dir) / MANIFEST
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text()).get("stages", {})
    except (json.JSONDecodeError, AttributeError):
        return {}  # a corrupt manifest only costs a rerun


def _write_manifest(run_dir: Path, records: dict[str, StageRecord]) -> None:
    atomic_write_json(run_dir / MANIFEST, {"stages": {n: r.__dict__ for n, r in records.items()}})


def _reusable(old: dict | None, key: str, run_dir: Path, stage: Stage) -> bool:
    if not old or old.get("key") != key or old.get("status") not in ("ran", "reused"):
        return False
    for rel in stage.outputs:
        p = run_dir / rel
        if not p.exists() or old.get("outputs", {}).get(rel) != hash_output(p):
            return False
    return True


def _move_outputs(stage: Stage, tmp: Path, run_dir: Path) -> None:
    missing = [rel for rel in stage.outputs if not (tmp / rel).exists()]
    if missing:
        raise RuntimeError(f"stage {stage.name!r} did not write {missing}")
    for rel in stage.outputs:
        dst = run_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_dir():
            old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
            os.replace(dst, old)
            os.replace(tmp / rel, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp / rel, dst)


def run_stages(stages: list[Stage], recipe: Any, run_dir: Path, *, state: dict | None = None,
               on_event: Callable[[str, Stage, StageRecord | None], None] | None = None,
               force: tuple[str, ...] = ()) -> dict[str, StageRecord]:
    """Run `stages` in order, reusing those whose key and outputs are unchanged. Returns the records.

    `on_event(kind, stage, record)` is called with kind in {"start", "reused", "done", "failed"} (for progress UIs).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for p in run_dir.glob(".stage-*"):  # leftovers of an interrupted stage
        shutil.rmtree(p, ignore_errors=True)
    old = read_manifest(run_dir)
    records: dict[str, StageRecord] = {}
    state = {} if state is None else state
    for stage in stages:
        key = _stage_key(stage, recipe, records)
        if stage.name not in force and _reusable(old.get(stage.name), key, run_dir, stage):
            rec = StageRecord(**{**old[stage.name], "status": "reused", "duration_s": 0.0,
                                   "peak_rss_gb": None})
            records[stage.name] = rec
            _write_manifest(run_dir, records | {n: StageRecord(**v) for n, v in old.items() if n not in records})
            if on_event:
                on_event("reused", stage, rec)
            continue
        if on_event:
            on_event("start", stage, None)
        tmp = Path(tempfile.mkdtemp(prefix=f".stage-{stage.name}-", dir=run_dir))
        memory.collect()  # what earlier stages freed goes back to the system, so this stage's peak is its own
        memory.reset_peak()
        t0 = time.perf_counter()
        try:
            ctx = StageContext(recipe, run_dir, tmp, {n: r.summary for n, r in records.items()}, state)
            summary = stage.fn(ctx) or {}
            normalize_modes(tmp)
            _move_outputs(stage, tmp, run_dir)
        except BaseException:
            if on_event:
                on_event("failed", stage, None)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rec = StageRecord(stage.name, key, "ran", time.perf_counter() - t0, summary,
                          {rel: hash_output(run_dir / rel) for rel in stage.outputs},
                          round(memory.peak_rss() / memory.GB, 2))
        records[stage.name] = rec
        # Keep older records of stages not yet reached, so an interrupted rerun can still reuse them later.
        _write_manifest(run_dir, records | {n: StageRecord(**v) for n, v in old.items() if n not in records})
        if on_event:
            on_event("done", stage, rec)
    return records
