"""An export (or any HF folder) into accel's runtime, after checking its files: `load_engine`.

The weights themselves go through `accel.runtime.models.load_model`, which hands an export's quantized Linears to
`accel.kernels.loader` (the one way from a checkpoint to kernel modules).
"""

from __future__ import annotations

import json
from pathlib import Path



class ModelLoadError(ValueError):
    """A model folder that cannot be loaded: the message names the file and what is wrong with it."""


def check_model_files(path: str | Path) -> None:
    """Raise ModelLoadError naming the file when config.json or a safetensors header is unreadable (cheap: reads
    the headers only), so a damaged folder is one clear line, not a loader's traceback."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not a readable JSON file: {e}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path / 'config.json'} is not a JSON object")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    for f in files:
        problem = _safetensors_header_problem(f)
        if problem:
            raise ModelLoadError(f"{f} is not a valid safetensors file: {problem}")


def _safetensors_header_problem(f: Path) -> str | None:
    """What is wrong with a safetensors file's header (8-byte little-endian length + JSON), or None."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"the header claims {n} bytes but the file has {size - 8} after the length (truncated or damaged)"
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"the header is not valid JSON ({e})"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1] <= data_len):
            return f"tensor {name!r} has data offsets {offsets} outside the file's {data_len} data bytes"
    return None


def export_speculative_config(path: str | Path):
    """The drafter an export was optimized with, as the engine's SpeculativeConfig: its recipe's `speculation`
    section from accel.json, the draft model from the export's own `draft/` when it carries one. None for a plain
    folder or an export optimized without speculation."""
    from accel.export.checkpoint import MANIFEST_NAME
    from accel.speculative.config import SpeculativeConfig

    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        return None
    try:
        section = (json.loads(manifest.read_text(encoding="utf-8")).get("recipe") or {}).get("speculation")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ModelLoadError(f"{manifest} is not a readable accel manifest: {e}") from None
    if not section:
        return None
    draft = Path(path) / "draft"
    try:
        return SpeculativeConfig.from_recipe(section, str(draft) if (draft / "config.json").is_file() else None)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{manifest}: its recipe's speculation section {section} does not make a drafter "
                             f"({e}); serve it with --speculative-config '{{\"method\": \"none\"}}' or another "
                             "drafter") from None


def load_engine(path: str | Path, **engine_kwargs):
    """An `accel.runtime.engine.Engine` over an export or a plain HF folder (`Engine.from_pretrained`, after a
    cheap check of the folder's files); kwargs are EngineConfig fields. Raises ModelLoadError naming the file when
    the folder is damaged."""
    from accel.runtime.engine import Engine

    check_model_files(path)
    return Engine.from_pretrained(path, **engine_kwargs)
