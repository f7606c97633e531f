"""A checkpoint's tensors into a model, quantized Linears as accel's kernel modules: the one way from disk to kernels.

`load_weights(model, folder, dtype, device)` fills any module tree with Hugging Face names (the runtime's CausalLM,
or a transformers model for evaluation): plain tensors are loaded as they are; each compressed-tensors quantized
Linear (`weight_packed` int32 + scale [+ zero point], or an int8 `weight` with a scale) becomes an INT8 / INT4
kernel module built straight from the stored integers, so accel runs exactly what the checkpoint stores and what
transformers and vLLM load. A tied INT8 table is held once (`share_table`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from accel.schemes import TABLE, QuantScheme, describe_unread, identify

ROWS_PER_READ = 8192  # rows of a table or planned Linear read at once: bounds the float transient of a load


def is_compressed(path: str | Path) -> bool:
    """True when `path/config.json` carries a compressed-tensors `quantization_config`."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    q = json.loads(cfg.read_text()).get("quantization_config") or {}
    return q.get("quant_method") == "compressed-tensors"


def _quantizes(scheme: str | None) -> bool:
    """Whether a runtime plan's entry (None: not planned) rounds its Linear as it loads."""
    from accel.schemes import quantized

    return scheme is not None and quantized(scheme)


def stored_schemes(config: dict) -> list[tuple[list[str], QuantScheme]]:
    """(targets, scheme) of each config group of a config.json's compressed-tensors quantization (targets: module
    names, "re:" patterns or "Linear", see `targeted`); ValueError naming a group no registered scheme reads."""
    qc = config.get("quantization_config") or {}
    out = []
    for name, group in (qc.get("config_groups") or {}).items():
        weights, act = group.get("weights") or {}, group.get("input_activations")
        scheme = identify(weights, group.get("format") or qc.get("format"), act)
        if scheme is None:
            raise ValueError(f"config group {name!r}: no accel scheme reads weights {weights} with input activations "
                             f"{act} ({describe_unread(weights, act)})")
        out.append((group.get("targets") or [], scheme))
    return out


def targeted(name: str, targets: list[str]) -> bool:
    """Whether quantized Linear `name` is one of compressed-tensors `targets`: its name, a "re:" pattern it matches,
    or the class name "Linear"."""
    import re

    return any(t == name or t == "Linear" or (t.startswith("re:") and re.match(t[3:], name)) for t in targets)


def kernel_module(state: dict[str, torch.Tensor], prefix: str, scheme: QuantScheme, bias) -> nn.Module:
    """The kernel module of quantized `prefix` from its stored tensors: the token table's own modules (INT4, INT8
    rows), any Linear its scheme's reader (`QuantScheme.read`)."""
    from accel.kernels import linear as kernels

    if prefix == TABLE and f"{prefix}.weight_packed" in state:  # an INT4 table (accel.quant.quantize.quantize_table)
        q, scales, zeros = kernels.int4_packed_from_compressed_tensors(
            state[f"{prefix}.weight_packed"], state[f"{prefix}.weight_scale"], state[f"{prefix}.weight_shape"],
            state.get(f"{prefix}.weight_zero_point"))
        return kernels.Int4Embedding(q, scales, zeros, 2 * q.shape[1] // scales.shape[1])
    if prefix == TABLE:
        w = state[f"{prefix}.weight"]
        return kernels.Int8Embedding(w, kernels.per_block_scales(state[f"{prefix}.weight_scale"], w.shape[1]))
    return scheme.read(state, prefix, bias)


def share_table(model: nn.Module) -> None:
    """A tied INT8 table held once: the embedding gathers rows from the lm_head kernel's own int8 tensor."""
    from accel.kernels.linear import Int8Embedding, Int8WeightOnlyLinear

    table, head = model.get_submodule(TABLE), model.lm_head
    if isinstance(table, Int8Embedding) and isinstance(head, Int8WeightOnlyLinear) and \
            torch.equal(table.qweight, head.qweight):
        table.qweight = head.qweight


def _module_prefix(name: str) -> str:
    return name.rsplit(".", 1)[0]


def is_linear_weight(name: str, ndim: int) -> bool:
    """Whether checkpoint tensor `name` is a Linear's weight matrix (the tensors `linear_dtype` holds): a 2-D
    `.weight` other than the token table's."""
    return name.endswith(".weight") and ndim == 2 and name != f"{TABLE}.weight"


def _set_tensor(model: nn.Module, name: str, t: torch.Tensor) -> bool:
    """Put tensor `name` into the tree as its parameter (frozen) or buffer, replacing what is there (a meta
    placeholder); False when the tree has no such tensor."""
    prefix, _, attr = name.rpartition(".")
    try:
        mod = model.get_submodule(prefix) if prefix else model
    except AttributeError:
        return False
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(t, requires_grad=False)
    elif attr in mod._buffers:
        mod._buffers[attr] = t
    else:
        return False
    return True


def _replace(model: nn.Module, prefix: str, module: nn.Module) -> None:
    parent, _, child = prefix.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def load_weights(model: nn.Module, folder: str | Path, dtype: torch.dtype, device: torch.device, tied: bool,
                 plan: dict[str, str] | None = None, group_size: int = 64,
                 table_dtype: torch.dtype | None = None, linear_dtype: torch.dtype | None = None) -> nn.Module:
    """Fill `model` (HF module names; built on the meta device, or with its tensors already allocated) from the
    folder, one module at a time, so memory holds the model as it will run plus one module's tensors:

    - a compressed-tensors quantized Linear becomes its kernel module, built from the stored integers;
    - a Linear that `plan` ({module: scheme}, `--quant`) quantizes is rounded as it is read, a block of rows at a
      time (`quantize_rows`);
    - every other tensor is read as stored and cast to `dtype` (to `table_dtype`, a 16-bit `Float16Embedding`,
      for the token table when given and the head does not share it; to `linear_dtype`, when given, for the
      weights of the Linears left unquantized, which `PackedLinear` then holds in it);
    - `tied`: lm_head shares the token table (or, quantized, is rounded from it).

    Raises ValueError naming what does not match."""
    from accel.kernels.linear import Float16Embedding
    from accel.schemes import check_plan, quantize_rows
    from accel.tensorio import TensorFiles

    folder, plan = Path(folder), dict(plan or {})
    check_plan(model, plan, group_size)
    stored = stored_schemes(json.loads((folder / "config.json").read_text())) \
        if (folder / "config.json").is_file() else []
    files = TensorFiles(folder)
    groups: dict[str, list[str]] = {}
    for name in files.names():
        groups.setdefault(_module_prefix(name), []).append(name)
    quant = {p for p in groups if f"{p}.weight_scale" in files}
    head_scheme = plan.get("lm_head")
    head_quantized = "lm_head" in quant or _quantizes(head_scheme)
    unexpected: list[str] = []

    def rows_of(name: str):
        return lambda a, b: files.read_rows(name, a, b).to(device)

    def planned(prefix: str) -> bool:
        return _quantizes(plan.get(prefix))

    def quantize_from_file(prefix: str, weight: str) -> None:
        """A planned Linear rounded from the file a block of rows at a time: its float weight is never whole."""
        out_f, in_f = files.infos[weight].shape
        bias = files.read(f"{prefix}.bias").to(dtype) if f"{prefix}.bias" in files else None
        _replace(model, prefix, quantize_rows(rows_of(weight), out_f, in_f, plan[prefix], group_size, bias))

    def table_16bit() -> None:
        """The token table read into its 16-bit module a block of rows at a time."""
        name = f"{TABLE}.weight"
        table = torch.empty(files.infos[name].shape, dtype=table_dtype, device=device)
        for r in range(0, table.shape[0], ROWS_PER_READ):
            table[r:r + ROWS_PER_READ] = rows_of(name)(r, min(r + ROWS_PER_READ, table.shape[0]))
        module = Float16Embedding(table, dtype)
        _scale_like(model, module, dtype)
        _replace(model, TABLE, module)

    def place(prefix: str, state: dict[str, torch.Tensor]) -> None:
        """A module's tensors (HF names, as stored) into the tree."""
        if prefix in quant:
            bias = state.get(f"{prefix}.bias")
            scheme = next((sc for targets, sc in stored if targeted(prefix, targets)), None)
            if scheme is None and prefix != TABLE:
                raise ValueError(f"{prefix}: quantized tensors, but no config group names it")
            module = kernel_module(state, prefix, scheme, None if bias is None else bias.to(dtype)).to(device)
            if prefix == TABLE:  # the INT8 table's lookups return the model's dtype, scaled as the module it replaces
                _scale_like(model, module, dtype)
            _replace(model, prefix, module)
            return
        def cast(k: str, v: torch.Tensor) -> torch.Tensor:
            to = linear_dtype if linear_dtype is not None and is_linear_weight(k, v.dim()) else dtype
            return v.to(to) if v.is_floating_point() and v.dtype != to else v

        state = {k: cast(k, v) for k, v in state.items()}
        if planned(prefix):  # a fused checkpoint's part (Phi-3), split in memory
            w = state[f"{prefix}.weight"]
            _replace(model, prefix, quantize_rows(lambda a, b: w[a:b], *w.shape, plan[prefix], group_size,
                                                  state.get(f"{prefix}.bias")))
            return
        for name, t in state.items():
            if tied and name == "lm_head.weight":
                continue
            if not _set_tensor(model, name, t.to(device)):
                unexpected.append(name)

    fused_parts = hasattr(model, "checkpoint_state") and model.config.model_type == "phi3"
    for prefix, names in groups.items():
        weight = f"{prefix}.weight"
        if prefix == TABLE and weight in files and prefix not in quant:
            if tied and planned("lm_head"):  # the head's own rounded copy of the table
                out_f, in_f = files.infos[weight].shape
                _replace(model, "lm_head", quantize_rows(rows_of(weight), out_f, in_f, plan["lm_head"], group_size))
            if table_dtype is not None and (head_quantized or not tied) and names == [weight]:
                table_16bit()
                continue
        if planned(prefix) and weight in files and not fused_parts:
            quantize_from_file(prefix, weight)
            continue
        if prefix == "lm_head" and prefix in quant and not any(f"lm_head.{w}" in files for w in ("weight",
                                                                                                 "weight_packed")):
            names = [*names, f"{TABLE}.weight"]  # a tied INT8 table: the head's integers are the table's
        state = {n: files.read(n) for n in names}
        if hasattr(model, "checkpoint_state"):  # a runtime family's own names (Phi-3's fused projections split)
            state = model.checkpoint_state(state)
        by_module: dict[str, dict[str, torch.Tensor]] = {}
        for n, t in state.items():
            by_module.setdefault(prefix if prefix in quant else _module_prefix(n), {})[n] = t
        for p, st in by_module.items():
            place(p, st)
    if tied and not isinstance(model.lm_head, _quantized_types()) and "lm_head" not in quant:
        model.lm_head.weight = model.get_submodule(TABLE).weight
    _materialize_rest(model, folder, device, unexpected)
    share_table(model)
    return model


def planned_bytes(folder: str | Path, dtype: torch.dtype, tied: bool, plan: dict[str, str] | None = None,
                  group_size: int = 64, table_dtype: torch.dtype | None = None,
                  linear_dtype: torch.dtype | None = None) -> tuple[int, int]:
    """From the safetensors headers alone, before anything is read: (bytes `load_weights` will hold with these
    arguments, bytes of the largest transient while loading: a tensor read and, quantized on load, its fp32
    rounding temporaries)."""
    from accel.schemes import held_bytes
    from accel.tensorio import TensorFiles

    files, plan = TensorFiles(folder), dict(plan or {})
    size = torch.empty(0, dtype=dtype).element_size()
    quant = {_module_prefix(n) for n in files if n.endswith(".weight_scale")}
    held, transient = 0, 0
    head_planned = _quantizes(plan.get("lm_head"))
    for name, info in files.infos.items():
        prefix, numel = _module_prefix(name), math.prod(info.shape)
        if not (name == f"{TABLE}.weight" or _quantizes(plan.get(prefix))):
            transient = max(transient, info.nbytes)  # read whole
        if prefix in quant:  # stored integers as they are; 16-bit scales and zero points held at 32 bits
            held += info.nbytes * (1 if info.dtype in (torch.int8, torch.uint8, torch.int32) else 2)
        elif name == f"{prefix}.weight" and _quantizes(plan.get(prefix)):
            held += held_bytes(plan[prefix], info.shape[0], info.shape[1], group_size)
            # the rounding's fp32 temporaries of a block of rows
            transient = max(transient, 16 * min(info.shape[0], ROWS_PER_READ) * info.shape[1])
        elif name == f"{TABLE}.weight" and table_dtype is not None and (head_planned or not tied):
            held += numel * torch.empty(0, dtype=table_dtype).element_size()
        elif not (tied and name == "lm_head.weight"):
            linear = linear_dtype is not None and is_linear_weight(name, len(info.shape))
            held += (numel * (linear_dtype.itemsize if linear else size) if info.dtype.is_floating_point
                     else info.nbytes)
        if tied and name == f"{TABLE}.weight" and head_planned:
            held += held_bytes(plan["lm_head"], info.shape[0], info.shape[1], group_size)
    return held, transient


def _quantized_types() -> tuple[type, ...]:
    from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear

    return (Int4WeightOnlyLinear, Int8WeightOnlyLinear)


def _scale_like(model: nn.Module, module: nn.Module, dtype: torch.dtype) -> None:
    """A replacement table returns `dtype` rows scaled as the module it replaces (transformers' Gemma scales its
    embedding by sqrt(hidden) inside the module)."""
    module.dtype = dtype
    scale = getattr(model.get_submodule(TABLE), "embed_scale", None)
    module.embed_scale = None if scale is None or scale.is_meta else torch.as_tensor(scale).float()
    if scale is not None and scale.is_meta:
        module.embed_scale = torch.as_tensor(model.get_submodule(TABLE).scalar_embed_scale).float()


def _materialize_rest(model: nn.Module, folder: Path, device: torch.device, unexpected: list[str]) -> None:
    """After the checkpoint: a parameter still on the meta device is missing from it (ValueError, with what was
    unexpected); a meta buffer is one the model computes itself (a rotary table), computed as transformers does."""
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model's architecture: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for mod in model.modules():
        metas = [n for n, b in mod._buffers.items() if b is not None and b.is_meta]
        for n in metas:
            mod._buffers[n] = torch.empty_like(mod._buffers[n], device=device)
        if metas:
            if not hasattr(model, "_init_weights"):
                raise ValueError(f"{type(mod).__name__}: buffers {metas} are neither in the checkpoint nor computed")
            model._init_weights(mod)


def table_dtype_for(quantized: bool, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.dtype | None:
    """The token table's dtype where a model runs quantized: 16 bits (fp16, as exports store it) beside fp32 compute
    on the CPU, else the model's own (None). A 152k x 1536 table is 0.47 GB at fp16, 0.93 at fp32."""
    return torch.float16 if quantized and dtype == torch.float32 and torch.device(device).type == "cpu" else None


def load_hf_model(folder: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A transformers model of the folder (for evaluation next to transformers' own), its quantized Linears as
    kernel modules (weights stay quantized in memory), exactly as stored; built on the meta device and filled one
    module at a time (`load_weights`). A quantized checkpoint's table is held as the runtime holds it
    (`table_dtype_for`; exports store it at 16 bits, so this is exact)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        model.tie_weights()
    table_dtype = table_dtype_for(is_compressed(folder), dtype)
    return load_weights(model, folder, dtype, torch.device("cpu"), tied, table_dtype=table_dtype).eval()
