"""Quantization schemes: what each precision costs in bits, which Linears are quantizable, and fake quantization.

Glossary
- scheme: "int4" (weight-only, group-wise asymmetric, integer zero point: the compressed-tensors / vLLM W4A16
  form), "int4f" (the same with a floating-point zero point per group: the GGUF Q4_1 / HQQ form, see
  `fake_quant_int4`), "int8" (weight-only, per output channel symmetric), "fp16" (the model's 16-bit dtype; kept in
  fp32 on CPU, still *counted* as 16 bits), "w8a8" (int8's weights with input activations rounded to INT8 per
  token at run time, dynamically: vLLM's W8A8, which its CPU kernels run where they run no weight-only INT8; the
  sensitivity rounds its weights only), "int5" (weight-only, symmetric 5-bit per group of 32: the GGUF Q5_0
  form, exact on a Q5_0 release; held as int8g codes at run time), "int8g" (INT8 per group of 32).
  int4f, int5 and int8g keep any group already on a grid of their codes (`accel.kernels.linear.grid_fit`): a GGUF
  release's Q4_K / Q5_0 / Q8_0 blocks come back bit for bit, where min-max would re-round them.
- bits per weight include the quantization metadata as the checkpoint stores it (scales in fp16, see
  `accel.quant.quantize.store_16bit`):
    int8, w8a8: 8 + 16 / in_features   (one fp16 scale per output row)
    int8g: 8 + 16 / 32           (one fp16 scale per 32 inputs; the lm_head / tied table per lm_head_group_size)
    int5: 5 + 16 / 32            (one fp16 scale per 32 inputs, the codes packed densely, 32 to five int32s)
    int4: 4 + 20 / group_size    (one fp16 scale + one 4-bit zero point, packed eight to an int32, per group)
    int4f: 4 + 32 / group_size   (one fp16 scale + one fp16 zero point per group, stored unpacked: see
                                  accel.quant.quantize.pack_int4f)
    fp16: 16
- average bits: the parameter-count-weighted mean over the quantizable Linears (the lm_head follows the recipe's
  rule and is reported apart; the embedding table's is `Plan.table`).

Fake quantization (quantize then dequantize in float) reproduces compressed-tensors' numerics exactly for the
RTN min-max observer (same ranges, same rounding), so the sensitivity measured here is what the library's RTN
would produce; GPTQ then does better than this per layer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from accel.kernels.linear import (INT5_GROUP, INT8_GROUP, dequantize_int4_groupwise, dequantize_int8_per_channel,
                                  quantize_int4_groupwise, quantize_int5_groupwise, quantize_int8_groupwise,
                                  quantize_int8_per_channel)
from accel.kernels.loader import TABLE  # noqa: F401  (the quant modules import it from here)
"""The embedding table (Llama family naming); tied to the lm_head in small models."""

SCHEMES = ("int4", "int4f", "int5", "int8", "w8a8", "int8g", "fp16")
"""From cheapest to most expensive as stored: allocation demotes towards the left, fallback promotes towards the
right. int4f is a candidate only where it is far better than int4 (weights on a float-min grid, see
accel.quant.plan.int4_candidates), where it is exact at 5 bits (g32)."""

# The Linears of a decoder block that weight-only quantization targets (Llama family naming).
_BLOCK_LINEAR = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)$")


@dataclass(frozen=True)
class SchemeInfo:
    name: str
    weight_bits: int

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        """Storage bits per weight including scales / zero points, as written (see module doc)."""
        if self.name == "int4":
            return 4.0 + 20.0 / group_size
        if self.name == "int4f":
            return 4.0 + 32.0 / group_size
        if self.name in ("int8", "w8a8"):
            return 8.0 + 16.0 / in_features
        if self.name == "int8g":
            return 8.0 + 16.0 / INT8_GROUP
        if self.name == "int5":
            return 5.0 + 16.0 / INT5_GROUP
        return 16.0


INT4_SCHEMES = ("int4", "int4f")
SCHEME_INFO = {s: SchemeInfo(s, b) for s, b in (("int4", 4), ("int4f", 4), ("int5", 5), ("int8", 8), ("w8a8", 8),
                                                ("int8g", 8), ("fp16", 16))}
HEAD = "lm_head"


# vLLM loads q/k/v as one fused `qkv_proj` and gate/up as one `gate_up_proj`, and so does accel's runtime: one
# kernel and one checkpoint format per fused module, so every member of a unit must share one scheme (a plan that
# splits one fails vLLM's loader). Plans, sensitivity and budgets work on units.
_FUSED_INTO = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def quant_units(names: Sequence[str]) -> dict[str, list[str]]:
    """{unit: its member Linears}, in model order. A unit is a fused module (`layers.N.self_attn.qkv_proj`,
    `layers.N.mlp.gate_up_proj`) or a Linear that is fused with nothing (o_proj, down_proj), named as itself."""
    units: dict[str, list[str]] = {}
    for n in names:
        parent, _, leaf = n.rpartition(".")
        unit = f"{parent}.{_FUSED_INTO[leaf]}" if leaf in _FUSED_INTO and parent else n
        units.setdefault(unit, []).append(n)
    return units


DECODER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def uniform_plan(num_layers: int, scheme: str, lm_head: bool = True) -> dict[str, str]:
    """Every decoder Linear of a Llama-family model (HF names) at one scheme, the lm_head too unless told not."""
    check_scheme(scheme)
    plan = {f"model.layers.{i}.{p}": scheme for i in range(num_layers) for p in DECODER_LINEARS}
    return {**plan, "lm_head": scheme} if lm_head else plan


def expand_units(unit_schemes: dict[str, str], units: dict[str, list[str]]) -> dict[str, str]:
    """{unit: scheme} -> {Linear: scheme} (every member gets its unit's scheme)."""
    return {m: scheme for u, scheme in unit_schemes.items() for m in units.get(u, [u])}


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEME_INFO:
        raise ValueError(f"unknown scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")
    return scheme


class GroupSizes(dict):
    """{Linear: INT4 group size} with one size for the Linears it does not name (`Plan.sizes`)."""

    def __init__(self, default: int, sizes: dict[str, int] | None = None) -> None:
        super().__init__(sizes or {})
        self.default = default

    def __missing__(self, name: str) -> int:
        return self.default


def group_size_of(group_size: int | dict[str, int], name: str) -> int:
    """The INT4 group size of Linear `name`: one size for every Linear, or a `GroupSizes`."""
    return group_size if isinstance(group_size, int) else group_size[name]


def check_group_size(in_features: int, group_size: int, name: str = "") -> None:
    if group_size <= 0 or in_features % group_size:
        raise ValueError(f"int4 group_size {group_size} does not divide in_features {in_features} of {name or 'a Linear'}"
                         f"; use a divisor such as 32 or 64")


def quantizable_linears(model: nn.Module) -> list[str]:
    """HF module names of the decoder-block Linears (q/k/v/o, gate/up/down), in model order.

    lm_head and the embeddings are not listed: the lm_head follows the recipe's `lm_head` rule.
    """
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and _BLOCK_LINEAR.search(n)]
    if not names:
        raise ValueError("no quantizable Linear found (expected Llama-style '...layers.N.self_attn.q_proj' names)")
    return names


def layer_index(name: str) -> int:
    """Decoder layer index of a module name ('model.layers.12.mlp.up_proj' -> 12)."""
    m = re.search(r"layers\.(\d+)\.", name)
    if m is None:
        raise ValueError(f"module name {name!r} has no 'layers.N.' part")
    return int(m.group(1))


def param_counts(model: nn.Module, names: list[str]) -> dict[str, int]:
    modules = dict(model.named_modules())
    return {n: modules[n].weight.numel() for n in names}


def in_features_of(model: nn.Module, names: list[str]) -> dict[str, int]:
    modules = dict(model.named_modules())
    return {n: modules[n].in_features for n in names}


# --- fake quantization (RTN, min-max observer, compressed-tensors conventions) ---------------------------------

def fake_quant_int8(w: torch.Tensor) -> torch.Tensor:
    """Round to INT8 and back: `accel.kernels.linear.quantize_int8_per_channel`, the one rounding."""
    q, scales = quantize_int8_per_channel(w)
    return dequantize_int8_per_channel(q, scales).to(w.dtype)


def fake_quant_int4(w: torch.Tensor, group_size: int, float_zero: bool = False) -> torch.Tensor:
    """Round to INT4 (integer zero point, or fp16 with float_zero: "int4f") and back:
    `accel.kernels.linear.quantize_int4_groupwise`, the one rounding."""
    check_group_size(w.shape[1], group_size)
    q, scales, zeros = quantize_int4_groupwise(w, group_size, float_zero)
    return dequantize_int4_groupwise(q, scales, zeros, group_size).to(w.dtype)


def fake_quant(w: torch.Tensor, scheme: str, group_size: int) -> torch.Tensor:
    """Quantize then dequantize a [out, in] weight with RTN; fp16 returns the weight unchanged. group_size: INT4's,
    or int8g's (the lm_head / table's, `head_group`); int5 is always per 32."""
    check_scheme(scheme)
    if scheme in ("int8", "w8a8"):
        return fake_quant_int8(w)
    if scheme in ("int8g", "int5"):
        q, scales = quantize_int8_groupwise(w, group_size) if scheme == "int8g" else quantize_int5_groupwise(w)
        return dequantize_int8_per_channel(q, scales).to(w.dtype)
    if scheme in INT4_SCHEMES:
        return fake_quant_int4(w, group_size, float_zero=scheme == "int4f")
    return w


def quantized_weight(w: torch.Tensor, name: str, scheme: str, group_size: int,
                     given: dict[str, dict[str, torch.Tensor]] | None = None) -> torch.Tensor:
    """The weight of Linear `name` at `scheme`: the quantizer's own result where `given` has it, else RTN."""
    g = (given or {}).get(scheme, {}).get(name)
    if scheme == "int8g" and name not in (HEAD, TABLE):  # int8g Linears: always per 32
        group_size = INT8_GROUP
    if g is None:
        return fake_quant(w, scheme, group_size)
    return g.dequantize().to(w.dtype) if hasattr(g, "dequantize") else g  # held at 4 bits (quantize.PackedInt4)


@contextlib.contextmanager
def fake_quantized(model: nn.Module, schemes: dict[str, str], group_size: int | dict[str, int],
                   given: dict[str, dict[str, torch.Tensor]] | None = None) -> Iterator[None]:
    """Within the block, the named Linears compute with fake-quantized weights; the originals are back afterwards.

    given: {scheme: {Linear: its dequantized weight}} from a real quantizer (GPTQ), used instead of RTN where present.
    Each weight is quantized as its Linear runs and dropped when it returns (a forward pre-hook swaps a new Parameter
    in, never writing in place; a forward hook puts the original back): one Linear's copy exists at a time, where
    quantizing a whole plan up front held a second copy of every weight (6.2 GB on a 1.5B model). A tied lm_head /
    embedding pair is never corrupted: quantizing lm_head leaves embed_tokens untouched.
    """
    modules = dict(model.named_modules())
    chosen: dict[str, tuple[str, int]] = {}
    for name, scheme in schemes.items():
        if scheme == "fp16":
            continue
        if name not in modules:
            raise KeyError(f"module {name!r} not in model")
        g = group_size_of(group_size, name)
        if scheme == "int8g":  # per 32, but a head / table named in a GroupSizes (Plan.sizes: its group)
            g = group_size.get(name, INT8_GROUP) if isinstance(group_size, dict) else INT8_GROUP
        chosen[name] = (scheme, g)
    saved: dict[str, nn.Parameter] = {}

    def swap_in(name: str):
        scheme, g = chosen[name]

        def fn(mod, _args):
            saved[name] = mod.weight
            with torch.no_grad():
                w = quantized_weight(mod.weight.data, name, scheme, g, given)
            mod.weight = nn.Parameter(w.to(saved[name].dtype), requires_grad=False)
        return fn

    def swap_out(name: str):
        def fn(mod, _args, _out):
            mod.weight = saved.pop(name)
        return fn

    handles = []
    try:
        for name in chosen:
            handles.append(modules[name].register_forward_pre_hook(swap_in(name)))
            handles.append(modules[name].register_forward_hook(swap_out(name)))
        yield
    finally:
        for h in handles:
            h.remove()
        for name, p in saved.items():  # a forward that raised between the two hooks
            modules[name].weight = p
