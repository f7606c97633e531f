"""Where calibration text comes from: the project's calibration_data/, a user file, or a `datasets` dataset.

Every source becomes a flat list of `TextSample`s. Validation happens here, where the data enters:
a missing file, a missing text field (the error lists the fields that exist) and a domain named in
`domains` or `weights` that the data does not have all fail with a message naming the bad value.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from accel.fsutil import read_jsonl

BUILTIN_DIR = Path(__file__).resolve().parent.parent.parent / "calibration_data"
DEFAULT_DOMAIN = "default"  # domain of every sample when the source has no domain field
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class TextSample:
    """One calibration text with its domain label."""

    id: str
    domain: str
    text: str
    source: str


def load_samples(cfg, root: str | Path | None = None) -> list[TextSample]:
    """Load the samples named by `cfg.source` (a CalibrationConfig or anything with the same attributes).

    source: "builtin" (every `<domain>.jsonl` in `root`, default the project's calibration_data/),
    a path to a .jsonl/.json/.parquet file, or "hf:<name>[:<config>]" for a `datasets` dataset stored
    locally (a folder or file; the Hub is not reachable offline). Samples are filtered to `cfg.domains`
    when set. Empty texts are skipped with a warning.
    """
    source = str(cfg.source)
    if source == "builtin":
        rows, label = _read_builtin(Path(root) if root is not None else BUILTIN_DIR), "builtin"
    elif source.startswith("hf:"):
        rows, label = _read_hf(source[3:], cfg.split), source
    else:
        rows, label = _read_file(Path(source)), source
    samples = _to_samples(rows, cfg.text_field, cfg.domain_field, label)
    return filter_domains(samples, cfg)


def filter_domains(samples: list[TextSample], cfg) -> list[TextSample]:
    """Keep `cfg.domains` (all when None); fail on a domain in `domains` or `weights` the data lacks."""
    present = sorted({s.domain for s in samples})
    named = {"domains": list(cfg.domains or []), "weights": list((getattr(cfg, "weights", None) or {}).keys())}
    for field, wanted in named.items():
        unknown = [d for d in wanted if d not in present]
        if unknown:
            raise ValueError(f"calibration.{field} names domain(s) {unknown} that the data does not have; "
                             f"available domains: {present}")
    if cfg.domains:
        keep = set(cfg.domains)
        samples = [s for s in samples if s.domain in keep]
    return samples


def _read_builtin(folder: Path) -> list[dict]:
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no <domain>.jsonl files in the builtin calibration folder {folder}")
    rows: list[dict] = []
    for path in files:
        rows += read_jsonl(path)
    return rows


def _read_file(path: Path) -> list[dict]:
    if path.suffix not in FILE_SUFFIXES:
        raise ValueError(f"calibration.source {str(path)!r}: unsupported file type {path.suffix!r}; "
                         f"use one of {list(FILE_SUFFIXES)}, 'builtin' or 'hf:<name>[:<config>]'")
    if not path.is_file():
        raise FileNotFoundError(f"calibration.source file not found: {path}")
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(x, Mapping) for x in data):
            raise ValueError(f"{path}: a .json calibration file must hold a list of objects, "
                             f"got {type(data).__name__}")
        return [dict(x) for x in data]
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reading .parquet calibration files needs pandas and pyarrow: pip install pandas pyarrow") from e
    return pd.read_parquet(path).to_dict(orient="records")




def _read_hf(spec: str, split: str) -> list[dict]:
    """`datasets.load_dataset` on a local folder or file; Hub names fail early with a clear message."""
    name, _, config = spec.partition(":")
    if not name:
        raise ValueError(f"calibration.source 'hf:{spec}': expected 'hf:<name>[:<config>]'")
    if not Path(name).exists():
        raise FileNotFoundError(
            f"calibration.source 'hf:{spec}': {name!r} is not a local folder or file, and the Hugging Face Hub "
            f"is not reachable offline. Save the dataset locally (dataset.save_to_disk / data files in a folder) "
            f"and pass 'hf:<path>'")
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("'hf:' calibration sources need the `datasets` package: pip install datasets") from e
    path = Path(name)
    saved = any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))
    if path.is_dir() and saved:
        ds = datasets.load_from_disk(str(path))  # a folder written by save_to_disk
    else:
        ds = datasets.load_dataset(str(path), config or None)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"calibration.split {split!r} not in dataset {name!r}; available splits: {sorted(ds)}")
        ds = ds[split]
    return [dict(row) for row in ds]


def _to_samples(rows: Iterable[dict], text_field: str, domain_field: str, label: str) -> list[TextSample]:
    samples, empty = [], 0
    for i, row in enumerate(rows):
        if text_field not in row:
            raise KeyError(f"calibration.text_field {text_field!r} not found in {label} (row {i}); "
                           f"available fields: {sorted(row)}")
        text = row[text_field]
        if not isinstance(text, str):
            raise TypeError(f"{label} row {i}: field {text_field!r} must be a string, got {type(text).__name__}")
        if not text.strip():
            empty += 1
            continue
        domain = row.get(domain_field)
        sid = row.get("id")
        samples.append(TextSample(id=str(sid) if sid is not None else f"{_stem(label)}-{i:06d}",
                                  domain=str(domain) if domain is not None else DEFAULT_DOMAIN,
                                  text=text, source=str(row.get("source", label))))
    if empty:
        warnings.warn(f"{label}: skipped {empty} sample(s) with empty {text_field!r}", stacklevel=3)
    if not samples:
        raise ValueError(f"calibration source {label} holds no non-empty samples")
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = sorted({x for x in ids if ids.count(x) > 1})[:5]
        raise ValueError(f"calibration source {label} has duplicate ids, e.g. {dup}")
    return samples


def _stem(label: str) -> str:
    return Path(label.removeprefix("hf:").split(":")[0]).stem or "sample"
