"""Plan -> llm-compressor recipe -> oneshot (GPTQ / RTN / AWQ / SmoothQuant+GPTQ) -> compressed-tensors checkpoint
-> model with accel's Int8 / Int4 kernel modules.

The quantization algorithms are llm-compressor's (a well-kept library); accel only translates its plan into the
library's recipe (one config group per scheme, with the exact module names as targets, and an ignore list for
16-bit layers) and converts the library's checkpoint format into its own kernels.

Formats written (what vLLM and transformers read; see accel/export/compatibility.py):
- int8 = "pack-quantized" 8-bit, channel-wise symmetric: int32 `weight_packed` [out, in/4] (four values + 128 per
  word, lowest byte first), `weight_scale` [out, 1], `weight_shape`; int8g the same group-wise, `weight_scale`
  [out, in/32]. vLLM loads weight-only INT8 as W8A16 from this
  format only ("int-quantized" means weights *and* activations to its parser).
- w8a8 = "int-quantized" 8-bit channel-wise symmetric (int8 `weight`, `weight_scale` [out, 1]) with
  `input_activations` dynamic per-token INT8 (`W8A8_ACTIVATIONS`): vLLM's W8A8 INT8 (what its CPU kernels run).
- int4 = "pack-quantized" 4-bit, group-wise asymmetric: `weight_packed` [out, in/8], `weight_scale` [out, G],
  packed int32 `weight_zero_point`, `weight_shape`.
- int4f = "pack-quantized" 4-bit with `zp_dtype: float16` and `strategy: block`, `block_structure: [1, g]` (one
  group of g inputs per block): `weight_packed` [out, in/8], fp16 `weight_scale` and `weight_zero_point` [out, G].
  compressed-tensors packs a *group* strategy's zero points as 4-bit integers (destroying float ones) but leaves a
  block strategy's as they are, and dequantizes both alike: 4 + 32/g bits per weight, where the int8 container
  ("int-quantized", which llm-compressor writes and `pack_int4f` rewrites) took 8 + 32/g. transformers decompresses
  it bit for bit; vLLM has no kernel for float zero points.

The lm_head's scheme is written into the checkpoint like any Linear's; when it is tied to the embeddings,
llm-compressor unties it first (the embedding table stays 16-bit), so every loader runs the same lm_head. With
`plan.table` at the INT8 lm_head's scheme of a tied model (not for vLLM), `tie_int8_table` then stores the table once
(an untied model's table at int4 / int8 / int8g: `quantize_table`):
- table = "int-quantized" 8-bit symmetric (channel- or, int8g, group-wise) over `model.embed_tokens` and `lm_head`: the lm_head's
  integers as an int8 `model.embed_tokens.weight`, the same fp16 scales as `model.embed_tokens.weight_scale` and
  `lm_head.weight_scale` (transformers ties only the weight, so the scales are stored twice: 10 MB of int8g's
  262k-row table), `tie_word_embeddings: true`. transformers ties lm_head.weight to the int8 table and
  decompresses both; vLLM ties only an unquantized table (and reads "int-quantized" as W8A8), so it refuses it.
  SmolLM2-135M's all-INT8 export drops its 16-bit table's bytes and its held-out KLD hardly moves
  (scripts/bench_quality.py; docs/DESIGN.md, Export and loaders).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from accel import memory
from accel import schemes as registry
from accel.quant.allocate import Plan
from accel.quant.schemes import TABLE
from accel.schemes.base import GRID_OBSERVER

METHODS = ("gptq", "rtn", "awq", "smoothquant+gptq")
PLAN_FILE = "accel_plan.json"


# GPTQ's INT4 scales and zero points come from llm-compressor's imatrix-weighted MSE search (per group, the clip
# range that minimizes the output-weighted error, as llama.cpp's imatrix does) instead of min-max: on SmolLM2-135M
# it lowers all-INT4 group 32's held-out KL, and below plain MSE's (docs/DESIGN.md, Quantization). RTN stays
# min-max: data-free and exactly what the sensitivity's fake quantization measures. int4f, int5 and int8g take
# accel's grid observer (`register_grid_observer`):
# a group already on a grid of their codes keeps it, any other is min-max, as the fake quantization rounds.
SEARCHED_OBSERVER = "imatrix_mse"
SEARCHED_METHODS = ("gptq", "smoothquant+gptq")


def register_grid_observer() -> None:
    """Register GRID_OBSERVER with llm-compressor: the qparams of `accel.kernels.linear`'s own rounding (grid_fit,
    then min-max), so GPTQ / RTN start from exactly what accel's fake quantization measured. GPTQ takes a weight's
    qparams once, before its column sweep; on a weight already on the grid every rounding error is 0, so it stays
    there."""
    from llmcompressor.observers import Observer

    if GRID_OBSERVER.replace("_", "-") in Observer.registered_names():  # the registry's own spelling
        return

    @Observer.register(GRID_OBSERVER)
    class GridObserver(Observer):
        _stats_attrs = ["grid_scale", "grid_zero_point"]

        def update_statistics_from_observed(self, observed: torch.Tensor) -> None:
            from accel.kernels.linear import quantize_int4_groupwise, quantize_symmetric_groupwise

            a = self.args
            if not self.is_weight_obs or a.strategy != "group" or observed.shape[0] != 1:
                raise ValueError(f"{GRID_OBSERVER} observes group-wise weights only; got {self.base_name} "
                                 f"{a.strategy}")
            w = observed[0].flatten(-2)  # [out, G, g] -> [out, in]
            if a.symmetric:
                _, scale = quantize_symmetric_groupwise(w, a.group_size, a.num_bits)
                zp = torch.zeros_like(scale)
            else:  # float zero point (int4f): ours are [0, 15] codes, the library's [-8, 7]
                _, scale, zeros = quantize_int4_groupwise(w, a.group_size, float_zero=True)
                zp = zeros.float() - 8
            self.grid_scale, self.grid_zero_point = scale.to(observed.dtype), zp.to(observed.dtype)

        def get_qparams(self):
            scale, zp = self.grid_scale, self.grid_zero_point
            self.delete_statistics()
            return {"scale": scale, "zero_point": zp, "global_scale": None}


def _group_of(plan: Plan, name: str, scheme: str) -> int | None:
    """The group size Linear (or lm_head) `name` is written at under `scheme`."""
    return registry.get(scheme).group_of(name, plan.sizes()[name], plan.lm_head_group_size)


def recipe_config(plan: Plan, method: str = "rtn") -> dict:
    """The plan as llm-compressor config groups + ignore list (plain data; `build_modifiers` wraps it).

    {"config_groups": {"int8": {"targets": [...], "weights": {...}, "format": ...}, "int4": {...},
                       "int4_g32": {...} (Linears at a group size other than their scheme's default: the plan's INT4
                       size, 32 for int8g)},
     "ignore": [fp16 modules..., "lm_head" when it stays 16-bit]}
    Targets are exact module names (no regex), so the checkpoint states precisely what the plan chose.
    """
    schemes = {**plan.schemes, "lm_head": plan.lm_head}
    groups = {}
    for scheme in registry.names():
        s = registry.get(scheme)
        if not s.quantized:
            continue
        default = s.group_of("", plan.group_size, plan.lm_head_group_size)
        at: dict[int | None, list[str]] = {}
        for n, sn in schemes.items():
            if sn == scheme:
                at.setdefault(_group_of(plan, n, sn), []).append(n)
        for g, targets in sorted(at.items(), key=lambda kv: kv[0] != default):
            weights = s.weights_args(g, plan.w8a8_weight_bits)
            if s.searched and method in SEARCHED_METHODS:
                weights["observer"] = SEARCHED_OBSERVER
            name = scheme if g == default else f"{scheme}_g{g}"
            groups[name] = {"targets": targets, "weights": weights, "format": s.format}
            if s.input_activations:
                groups[name]["input_activations"] = dict(s.input_activations)
    return {"config_groups": groups, "ignore": [n for n, s in schemes.items() if s == "fp16"]}


def build_modifiers(plan: Plan, method: str, dampening: float = 0.01) -> list:
    """llm-compressor modifiers for `method` applying the plan (see recipe_config)."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; allowed: {', '.join(METHODS)}")
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    cfg = recipe_config(plan, method)
    if not cfg["config_groups"]:
        return []
    register_grid_observer()
    groups = {name: QuantizationScheme(targets=g["targets"], weights=QuantizationArgs(**g["weights"]),
                                       format=g["format"], input_activations=QuantizationArgs(**g["input_activations"])
                                       if g.get("input_activations") else None)
              for name, g in cfg["config_groups"].items()}
    if method == "rtn":
        return [QuantizationModifier(config_groups=groups, ignore=cfg["ignore"])]
    if method == "gptq":
        return [GPTQModifier(config_groups=groups, ignore=cfg["ignore"], dampening_frac=dampening)]
    if method == "awq":
        from llmcompressor.modifiers.transform import AWQModifier

        return [AWQModifier(), QuantizationModifier(config_groups=groups, ignore=cfg["ignore"])]
    from llmcompressor.modifiers.transform import SmoothQuantModifier

    return [SmoothQuantModifier(smoothing_strength=0.8),
            GPTQModifier(config_groups=groups, ignore=cfg["ignore"], dampening_frac=dampening)]


def _dataloader(batches: Sequence[torch.Tensor]):
    """One calibration row per item (llm-compressor's pipelines take batch_size=None loaders of dicts)."""
    from torch.utils.data import DataLoader

    rows = [{"input_ids": b[i:i + 1], "attention_mask": torch.ones_like(b[i:i + 1])} for b in batches
            for i in range(b.shape[0])]
    return DataLoader(rows, batch_size=None)


@dataclass
class OneshotResult:
    model: nn.Module
    seconds: float
    method: str


def _llmcompressor_logs_to_stderr() -> None:
    """llm-compressor's log lines are diagnostics, but its loguru sink is the sys.stdout of its import: send them to
    whatever sys.stderr is when they are written (the run log during `accel optimize`, see accel.runlog)."""
    from loguru import logger

    logger.remove()
    logger.add(lambda message: sys.stderr.write(message), level="INFO",
               format="{time:YYYY-MM-DDTHH:mm:ss} | {function} | {level} - {message}")


@contextlib.contextmanager
def _no_pinning_without_accelerator():
    """AWQ pins its cached activations for faster host-to-device copies; torch refuses pin_memory() where there is
    no accelerator, and on the CPU there is no copy to speed up, so pinning is skipped there."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        yield
        return
    saved = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *a, **k: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = saved


GPTQ_CHUNK_BYTES = 256 << 20  # a weight GPTQ quantizes in row blocks of at most this many fp32 bytes


def rows_at_a_time(quantize_weight):
    """llm-compressor's GPTQ `quantize_weight`, run on blocks of output rows when a weight is larger than
    GPTQ_CHUNK_BYTES. GPTQ treats rows independently (the Hessian, its factor and the column order come from the
    inputs alone; scales are per row), so the result is the same, but the error propagation's [rows, columns]
    temporary and the column permutation's copy shrink to a block: a 152k-row lm_head's 0.93 GB each, 1.9 GB of the
    1.5B model's quantize stage."""
    def run(weights, hessians, scale, zero_point, global_scale, quant_args, blocksize=128, percdamp=0.01):
        b, rows, cols = weights.shape
        step = max(1, GPTQ_CHUNK_BYTES // (4 * b * cols))
        if rows <= step or scale.dim() < 2 or scale.shape[1] != rows:
            return quantize_weight(weights, hessians, scale, zero_point, global_scale, quant_args, blocksize, percdamp)
        losses, fallback = 0, None
        for r0 in range(0, rows, step):
            part = slice(r0, min(r0 + step, rows))
            q, loss, fb = quantize_weight(weights[:, part], hessians.clone(), scale[:, part],
                                          None if zero_point is None else zero_point[:, part], global_scale,
                                          quant_args, blocksize, percdamp)  # factorized in place: a copy each block
            if q.data_ptr() != weights[:, part].data_ptr():
                weights[:, part] = q
            losses, fallback = losses + loss, fb if fallback is None else fallback | fb
        return weights, losses, fallback
    return run


def observed_rows_at_a_time(update):
    """llm-compressor's imatrix-MSE observer search (`update_statistics_from_observed`), run on blocks of output rows
    when a weight is larger than GPTQ_CHUNK_BYTES. Its fake-quantized copy, the error and the importance broadcast
    to the weight's shape are each as large as the weight (a 152k-row INT4 lm_head: 0.93 GB each); per block they
    shrink. Each group's search is the same; its early stop counts per block."""
    def run(self, observed):
        if observed.dim() != 4:  # (1, rows, groups, group size) as the observer flattens a weight
            return update(self, observed)
        step = max(1, GPTQ_CHUNK_BYTES // (4 * observed[:, :1].numel()))
        if observed.shape[1] <= step:
            return update(self, observed)
        mins, maxs = [], []
        for r0 in range(0, observed.shape[1], step):
            update(self, observed[:, r0:r0 + step])
            mins.append(self.min_vals)
            maxs.append(self.max_vals)
        self.min_vals, self.max_vals = torch.cat(mins), torch.cat(maxs)
    return run


@contextlib.contextmanager
def _gptq_rows_at_a_time():
    """GPTQ's solve and its imatrix-MSE range search in row blocks (`rows_at_a_time`, `observed_rows_at_a_time`)."""
    import llmcompressor.modifiers.gptq.base as gptq_base
    from llmcompressor.observers.imatrix import IMatrixMSEObserver

    saved, saved_update = gptq_base.quantize_weight, IMatrixMSEObserver.update_statistics_from_observed
    gptq_base.quantize_weight = rows_at_a_time(saved)
    IMatrixMSEObserver.update_statistics_from_observed = observed_rows_at_a_time(saved_update)
    try:
        yield
    finally:
        gptq_base.quantize_weight = saved
        IMatrixMSEObserver.update_statistics_from_observed = saved_update


@contextlib.contextmanager
def _released_after():
    """Drop what oneshot leaves holding the model, so it is freed with the caller's last reference (7.1 GB on a
    1.5B model had stayed into the evaluation): llm-compressor's global session, and the namespaces its sequential
    tracing runs forwards in (copies of modeling modules' globals with `self` = the model or a submodule), which
    `torch.fx.wrap` keeps in a module-level registry for good: every entry the block added goes."""
    import torch.fx._symbolic_trace as fx_trace
    from llmcompressor.core import reset_session

    registry = fx_trace._wrapped_fns_to_patch
    before = set(registry)
    try:
        yield
    finally:
        reset_session()
        for key in set(registry) - before:
            del registry[key]


@contextlib.contextmanager
def _trimmed_per_layer(model: nn.Module):
    """Hand glibc's free pages back as each decoder layer starts: GPTQ's per-column temporaries stay in its heaps
    otherwise (1.5 GB of a 1.5B model's run)."""
    from accel.memory import release_free_memory

    last = [-1]

    def at(i):
        def fn(*_):
            if i != last[0]:  # once per layer, not per calibration row
                last[0] = i
                release_free_memory()
        return fn

    handles = [layer.register_forward_pre_hook(at(i)) for i, layer in enumerate(model.model.layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def oneshot_quantize(model: nn.Module, plan: Plan, batches: Sequence[torch.Tensor], method: str = "gptq",
                     dampening: float = 0.01, processor=None, pipeline: str = "independent",
                     progress: bool = False) -> OneshotResult:
    """Run llm-compressor's oneshot on CPU with our calibration token batches; the model is modified in place.

    The model must have been loaded from a folder (llm-compressor re-reads `config.name_or_path`). `processor` is
    the tokenizer (llm-compressor requires one when a dataset is passed; it is not used to tokenize here).
    pipeline: llm-compressor's default ("independent") runs GPTQ layer by layer on the outputs of the already quantized
    layers before it; "basic" calibrates every layer on the unquantized model's activations in one pass.
    progress: a bar with an ETA, over layers (independent) or calibration rows (basic).
    """
    from accel.progress import forward_progress

    with contextlib.redirect_stdout(sys.stderr):  # its import logs through a sink on the sys.stdout of that moment
        from llmcompressor import oneshot
    _llmcompressor_logs_to_stderr()
    if not Path(str(model.config.name_or_path)).is_dir():
        raise ValueError(f"oneshot needs a model loaded from a local folder; config.name_or_path is "
                         f"{model.config.name_or_path!r}")
    if processor is None:
        from transformers import AutoTokenizer

        processor = AutoTokenizer.from_pretrained(model.config.name_or_path)
    modifiers = build_modifiers(plan, method, dampening)
    t0 = time.perf_counter()
    if modifiers:
        n = sum(b.shape[0] for b in batches)
        seq = max(b.shape[1] for b in batches)
        per_row = pipeline == "basic" or method == "rtn"
        with _no_pinning_without_accelerator(), _gptq_rows_at_a_time(), _trimmed_per_layer(model), forward_progress(
                model, f"{method} ({'calibration rows' if per_row else 'layers'})", progress and method != "rtn",
                rows=n if per_row else None, passes=len(modifiers)):
            with _released_after():
                oneshot(model=model, dataset=_dataloader(batches), processor=processor, recipe=modifiers,
                        num_calibration_samples=n, max_seq_length=seq, tie_word_embeddings=True, pipeline=pipeline)
    return OneshotResult(model=model, seconds=time.perf_counter() - t0, method=method)


# layers per pass of `layerwise_gptq`: the basic pipeline holds every targeted Linear's [in, in] fp32 Hessian at
# once, and Qwen2.5-Coder-1.5B's 28 down_proj Hessians alone are 9 GB
GPTQ_HESSIAN_BYTES = 3 * 2**29


@dataclass(frozen=True)
class PackedInt4:
    """A Linear's INT4 weight as GPTQ made it, held at 4 bits (packed codes, fp32 scales, uint8 zero points in
    accel's [0, 15] convention); `dequantize()` gives the fp32 weight bit for bit."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.q.shape[0], 2 * self.q.shape[1]))

    def dequantize(self) -> torch.Tensor:
        from accel.kernels.linear import dequantize_int4_groupwise, unpack_int4

        return dequantize_int4_groupwise(unpack_int4(self.q), self.scales, self.zeros, self.group_size)

    @classmethod
    def of(cls, module: nn.Module, group_size: int) -> PackedInt4:
        """From a Linear llm-compressor quantized in place: its dequantized weight, `weight_scale` and
        `weight_zero_point` (compressed-tensors' signed codes, ours - 8)."""
        from accel.kernels.linear import pack_int4

        w, scale = module.weight.detach().float(), module.weight_scale.detach().float()
        zp = module.weight_zero_point.detach().float()
        out_f, in_f = w.shape
        codes = torch.round(w.reshape(out_f, -1, group_size) / scale[..., None]) + zp[..., None] + 8
        q, zeros = codes.clamp_(0, 15).to(torch.uint8).reshape(out_f, in_f), (zp + 8).to(torch.uint8)
        packed = cls(pack_int4(q), scale, zeros, group_size)
        if not torch.equal(packed.dequantize(), w):
            raise ValueError("a GPTQ weight is off its INT4 grid (scale / zero point do not reproduce it)")
        return packed


def layerwise_gptq(load_model: Callable[[], nn.Module], names: Sequence[str], group_size: int,
                   batches: Sequence[torch.Tensor], dampening: float = 0.01, processor=None,
                   progress: bool = False) -> dict[str, PackedInt4]:
    """{Linear: its INT4 weight as GPTQ makes it}, each Linear quantized on the unquantized model's inputs (the basic
    pipeline): what GPTQ does to a unit alone, which is what the sensitivity measures. GPTQ cuts the units' damage by
    different factors, so an allocation on RTN's damage misplaces INT8 units. The decoder layers go in passes whose
    Hessians fit GPTQ_HESSIAN_BYTES, each on a fresh fp32 model from `load_model` (consumed: the layers of earlier
    passes must not reach later ones quantized); the weights are kept at 4 bits (`PackedInt4`)."""
    import re

    layer_of = {n: int(re.search(r"layers\.(\d+)\.", n).group(1)) for n in names}
    passes: list[list[str]] = []
    held = GPTQ_HESSIAN_BYTES + 1
    out: dict[str, PackedInt4] = {}
    model = load_model()
    shapes = {n: model.get_submodule(n).in_features for n in names}
    for layer in sorted(set(layer_of.values())):
        members = [n for n in names if layer_of[n] == layer]
        need = sum(4 * shapes[n] ** 2 for n in members)
        if held + need > GPTQ_HESSIAN_BYTES:
            passes.append([])
            held = 0
        passes[-1] += members
        held += need
    for i, group in enumerate(passes):
        if i:
            model = load_model()
        plan = Plan(schemes=dict.fromkeys(group, "int4"), group_size=group_size, avg_bits=4.0, estimated_kl=0.0,
                    lm_head="fp16")
        res = oneshot_quantize(model, plan, batches, "gptq", dampening, processor, pipeline="basic",
                               progress=progress)
        out.update({n: PackedInt4.of(res.model.get_submodule(n), group_size) for n in group})
        del res, model
        memory.collect()
    return out


def _fp16_exact_enough(t: torch.Tensor) -> bool:
    """Whether fp16 keeps every value of a scale tensor to fp16's own rounding (2^-11 relative): no overflow and no
    subnormal precision loss."""
    back = t.half().float()
    return bool(torch.isfinite(back).all()) and bool(((back - t).abs() <= t.abs() * 2.0 ** -11).all())


def store_16bit(folder: str | Path) -> int:
    """Rewrite the checkpoint's fp32 tensors that need no more than 16 bits to fp16; returns the bytes saved.
    - Unquantized weight matrices (the embedding table, 16-bit fallback Linears, a 16-bit lm_head): a 16-bit fallback
      is then stored at 16 bits and the file is what the plan counts. The fp32 embedding table alone was 113 MB of a
      249 MB all-INT8 export of SmolLM2-135M (fp16 keeps 11 mantissa bits; held-out KLD unchanged).
    - Quantization scales (`weight_scale`): llm-compressor rounds them to fp16 (`scale_dtype`) but writes them in the
      dtype of the model it quantized (fp32 on CPU), so the cast is exact; a tensor it would round (not written by
      accel's recipe) stays fp32.
    Norms stay as they are (tiny); loaders cast to the dtype they run in. Done on the written files, after
    llm-compressor, whose offloaded parameters it leaves alone; the runtime and the evaluation load these files, so
    what is measured is what is stored."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    saved = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as src:
            metadata = src.metadata()
            state = {k: src.get_tensor(k) for k in src.keys()}
        quantized = {k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_scale")}
        cast = [k for k, v in state.items() if k.endswith(".weight") and v.dtype == torch.float32 and v.dim() == 2
                and k.rsplit(".", 1)[0] not in quantized]
        cast += [k for k, v in state.items() if k.endswith(".weight_scale") and v.dtype == torch.float32
                 and _fp16_exact_enough(v)]
        if not cast:
            continue
        for k in cast:
            saved += state[k].numel() * 2
            state[k] = state[k].half()
        save_file(state, str(f), metadata=metadata)
    return saved


def _single_file_state(folder: Path) -> tuple[Path, dict, dict[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"{folder}: storing the table at 8 bits needs one safetensors file, found {len(files)}")
    with safe_open(str(files[0]), "pt") as src:
        return files[0], src.metadata(), {k: src.get_tensor(k) for k in src.keys()}


def _table_group(folder: Path, targets: list[str], weights: dict | None = None, tied: bool = False,
                 fmt: str = "int-quantized") -> None:
    """config.json: the table's "int-quantized" group over `targets`, with `weights` (default: taken from the
    lm_head's group, whose target it leaves)."""
    import json

    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    qc = cfg["quantization_config"]
    for group in qc["config_groups"].values():
        if "lm_head" in group["targets"] and "lm_head" in targets:
            weights = dict(group["weights"])
            group["targets"] = [t for t in group["targets"] if t != "lm_head"]
    qc["config_groups"] = {n: g for n, g in qc["config_groups"].items() if g["targets"]}
    qc["config_groups"]["table"] = {"targets": targets, "weights": weights, "format": fmt,
                                    "input_activations": None, "output_activations": None}
    if tied:
        cfg["tie_word_embeddings"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def tie_int8_table(folder: str | Path) -> None:
    """Store a tied model's INT8 lm_head once as its embedding table too (see the module doc): the embedding rows
    become the lm_head's integers, the separate 16-bit table and lm_head tensors go."""
    from safetensors.torch import save_file

    from accel.kernels.linear import int8_from_compressed_tensors

    folder = Path(folder)
    file, metadata, state = _single_file_state(folder)
    packed, shape = state.pop("lm_head.weight_packed", None), state.pop("lm_head.weight_shape", None)
    if packed is None or int(shape[1]) != 4 * packed.shape[1]:
        raise ValueError(f"{folder}: the lm_head is not pack-quantized INT8; only an INT8 lm_head is stored as a table")
    q = int8_from_compressed_tensors(packed, shape)
    table = state.pop(f"{TABLE}.weight")
    if tuple(q.shape) != tuple(table.shape):
        raise ValueError(f"{folder}: lm_head {tuple(q.shape)} and {TABLE} {tuple(table.shape)} are not one table")
    scale = state.pop("lm_head.weight_scale")
    state.update({f"{TABLE}.weight": q, f"{TABLE}.weight_scale": scale, "lm_head.weight_scale": scale.clone()})
    save_file(state, str(file), metadata=metadata)
    _table_group(folder, [TABLE, "lm_head"], tied=True)


def quantize_table(folder: str | Path, scheme: str, group_size: int) -> None:
    """An untied model's embedding table stored at `scheme`, rounded on its own by RTN, the held-out check's rounding
    (a row is a token's vector; the scheme's `stored_table` writes its tensors). transformers decompresses them;
    accel's runtime gathers rows from them (`Int8Embedding`, `Int4Embedding`)."""
    from safetensors.torch import save_file

    if scheme not in registry.names("table") or not registry.quantized(scheme):
        allowed = [n for n in registry.names("table") if registry.quantized(n)]
        raise ValueError(f"the table is stored at {', '.join(allowed)}, not {scheme!r}")
    folder = Path(folder)
    file, metadata, state = _single_file_state(folder)
    tensors, fmt = registry.get(scheme).stored_table(state.pop(f"{TABLE}.weight"), group_size)
    state.update({f"{TABLE}.{k}": v for k, v in tensors.items()})
    save_file(state, str(file), metadata=metadata)
    _table_group(folder, [TABLE], registry.get(scheme).weights_args(group_size), fmt=fmt)


def pack_int4f(folder: str | Path) -> int:
    """Rewrite int4f's int8 containers (4-bit values, fp16 scale and zero point per group; "int-quantized" as
    llm-compressor saves them) as 4-bit `weight_packed` under a `block` [1, g] strategy (see the module doc): the
    same values, half the bytes. Returns the bytes saved."""
    import json

    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    groups = [g for g in cfg.get("quantization_config", {}).get("config_groups", {}).values()
              if g.get("format") == "int-quantized" and g["weights"]["num_bits"] == 4
              and "float" in str(g["weights"].get("zp_dtype") or "")]
    if not groups:
        return 0
    targets = {t for g in groups for t in g["targets"]}
    saved = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as src:
            metadata, state = src.metadata(), {k: src.get_tensor(k) for k in src.keys()}
        here = [t for t in targets if f"{t}.weight" in state]
        for t in here:
            q = state.pop(f"{t}.weight")
            state[f"{t}.weight_packed"] = pack_to_int32(q, 4)
            state[f"{t}.weight_shape"] = torch.tensor(tuple(q.shape))
            saved += q.numel() // 2
        if here:
            save_file(state, str(f), metadata=metadata)
    for g in groups:
        w = g["weights"]
        g["format"] = "pack-quantized"
        w.update(strategy="block", block_structure=[1, w["group_size"]], group_size=None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return saved


def widen_w8a8(folder: str | Path) -> bool:
    """A w8a8 group quantized within 7 bits (`Plan.w8a8_weight_bits`) declared as the 8-bit weights it is stored as:
    its int8 values and scales mean the same at 8 bits, and vLLM's W8A8 takes 8-bit weights only. Returns whether
    any group changed."""
    import json

    cfg_path = Path(folder) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    groups = [g for g in (cfg.get("quantization_config") or {}).get("config_groups", {}).values()
              if g.get("input_activations") and g["weights"]["num_bits"] == 7]
    for g in groups:
        g["weights"]["num_bits"] = 8
    if groups:
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return bool(groups)


def save_checkpoint(model: nn.Module, plan: Plan, out_dir: str | Path, processor=None) -> Path:
    """Write the compressed-tensors checkpoint (+ tokenizer, + the plan as accel_plan.json); weights the plan leaves
    unquantized are stored at 16 bits (`store_16bit`), int4f packed to 4 bits (`pack_int4f`), 7-bit w8a8 declared
    at 8 (`widen_w8a8`), a tied INT8 table once (`tie_int8_table`). The pipeline calls its two halves with the
    model dropped between them, so the rewrites never meet the fp32 model (the 1.5B: 14.7 GB at once)."""
    out = write_compressed(model, out_dir)
    return finish_checkpoint(out, plan, processor)


def write_compressed(model: nn.Module, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, save_compressed=True)
    return out


def finish_checkpoint(out: Path, plan: Plan, processor=None) -> Path:
    if plan.table != "fp16" and not plan.tied:  # from the table as the model held it, as the held-out check rounds it
        quantize_table(out, plan.table, plan.sizes()[TABLE])
    store_16bit(out)
    pack_int4f(out)
    widen_w8a8(out)
    if plan.table != "fp16" and plan.tied:
        tie_int8_table(out)
    if processor is not None:
        processor.save_pretrained(out)
    plan.to_json(out / PLAN_FILE)
    return out
