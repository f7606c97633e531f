"""Which Linears a plan quantizes (fused units), and fake quantization (a plan's weights rounded while they run).

What each scheme is (its bits, rounding, checkpoint form, kernels, loaders) is the scheme registry's
(`accel.schemes`): this module asks it. Bits per weight include the metadata as the checkpoint stores it (scales in
fp16); the average bits are the parameter-count-weighted mean over the quantizable Linears (the lm_head follows the
recipe's rule and is reported apart; the embedding table's is `Plan.table`).

Fake quantization (quantize then dequantize in float) reproduces compressed-tensors' numerics exactly for the
RTN min-max observer (same ranges, same rounding), so the sensitivity measured here is what the library's RTN
would produce; GPTQ then does better than this per layer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from accel import schemes as registry
from accel.kernels.linear import INT5_GROUP, INT8_GROUP  # noqa: F401  (the quant modules import them from here)
from accel.schemes import HEAD, TABLE  # noqa: F401  (likewise)

# The Linears of a decoder block that weight-only quantization targets (Llama family naming).
_BLOCK_LINEAR = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)$")


def schemes() -> tuple[str, ...]:
    """The registered schemes from cheapest to most expensive as stored: allocation demotes towards the left,
    fallback promotes towards the right."""
    return registry.names()


def bits_per_weight(scheme: str, in_features: int, group_size: int) -> float:
    """Storage bits per weight of `scheme` including scales / zero points, as written."""
    return registry.get(scheme).bits_per_weight(in_features, group_size)


def group_sized(scheme: str) -> bool:
    """Whether a scheme's groups follow the recipe's INT4 group size (chosen per unit by the allocator)."""
    return registry.get(scheme).group_sized


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
    return registry.check(scheme)


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
    """Round to INT8 per channel and back (the int8 scheme's rounding)."""
    return registry.get("int8").fake_quant(w, 0)


def fake_quant_int4(w: torch.Tensor, group_size: int, float_zero: bool = False) -> torch.Tensor:
    """Round to INT4 (integer zero point, or fp16 with float_zero: "int4f") and back."""
    return registry.get("int4f" if float_zero else "int4").fake_quant(w, group_size)


def fake_quant(w: torch.Tensor, scheme: str, group_size: int) -> torch.Tensor:
    """Quantize then dequantize a [out, in] weight with RTN; fp16 returns the weight unchanged. group_size: INT4's,
    or int8g's (the lm_head / table's, `head_group`); int5 is always per 32."""
    return registry.get(scheme).fake_quant(w, group_size)


def quantized_weight(w: torch.Tensor, name: str, scheme: str, group_size: int,
                     given: dict[str, dict[str, torch.Tensor]] | None = None) -> torch.Tensor:
    """The weight of Linear `name` at `scheme`: the quantizer's own result where `given` has it, else RTN."""
    g = (given or {}).get(scheme, {}).get(name)
    group_size = registry.get(scheme).group_of(name, group_size, group_size) or group_size  # int8g Linears: per 32
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
        head_group = group_size.get(name, INT8_GROUP) if isinstance(group_size, dict) else INT8_GROUP
        g = registry.get(scheme).group_of(name, group_size_of(group_size, name), head_group)  # Plan.sizes: the head's
        chosen[name] = (scheme, g or 0)
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
