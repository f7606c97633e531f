"""The scheme registry: every quantization scheme accel knows, one object each (`accel.schemes.base.QuantScheme`),
one file each beside this one. What lists or dispatches on schemes reads them from here: the recipe's allowed
values and bits floor, `--quant`'s choices, the allocator's order, llm-compressor's config groups, the loader table,
and the runtime's kernel modules (`kernel_module`, `apply_plan`). A new scheme is one new file that registers it.

Plans for the runtime ({module: scheme}) may also name a float dtype ("fp16", "bf16", "fp32": the Linear stays
float in that dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import HEAD, LOADERS, TABLE, QuantScheme, Rows

if TYPE_CHECKING:
    from torch import Tensor, nn

FLOAT_DTYPES = ("fp16", "bf16", "fp32")
"""Names a runtime plan may give a Linear that stays float."""
ROLES = ("candidate", "head", "table", "on_load")
_REGISTRY: dict[str, QuantScheme] = {}


def register(scheme: QuantScheme) -> QuantScheme:
    """Add a scheme (its name unused so far, not a float dtype's); returns it."""
    if not scheme.name or scheme.name in _REGISTRY or (scheme.name in FLOAT_DTYPES and scheme.name != "fp16"):
        raise ValueError(f"scheme name {scheme.name!r} is empty or taken; registered: {', '.join(_REGISTRY)}")
    _REGISTRY[scheme.name] = scheme
    return scheme


def unregister(name: str) -> None:
    """Drop a scheme (a test's own)."""
    _REGISTRY.pop(name, None)


def names(role: str | None = None) -> tuple[str, ...]:
    """Registered schemes from cheapest to most expensive as stored; `role` ("candidate", "head", "table",
    "on_load"): only those a recipe or `--quant` may use there."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown scheme role {role!r}; allowed: {', '.join(ROLES)}")
    ordered = sorted(_REGISTRY.values(), key=lambda s: s.rank)
    return tuple(s.name for s in ordered if role is None or getattr(s, role))


def get(name: str, role: str | None = None) -> QuantScheme:
    """The scheme called `name`; ValueError naming it and what is allowed (for `role`, see `names`)."""
    allowed = names(role)
    if name not in allowed:
        where = f" as {role}" if role else ""
        raise ValueError(f"unknown scheme {name!r}{where}; allowed: {', '.join(allowed)}")
    return _REGISTRY[name]


def check(name: str, role: str | None = None) -> str:
    """`name` if it is a scheme allowed for `role` (pydantic validators call this)."""
    get(name, role)
    return name


def json_enum(role: str | None = None):
    """A pydantic `json_schema_extra` that lists the schemes allowed for `role` when the schema is generated."""
    def extra(schema: dict) -> None:
        schema["enum"] = list(names(role))
    return extra


def identify(weights: dict, fmt: str | None, activations: dict | None) -> QuantScheme | None:
    """The scheme a compressed-tensors config group stores (None: none accel reads); a scheme registered later is
    asked first, so a new scheme may claim a form an older one also reads."""
    for s in reversed(_REGISTRY.values()):
        if s.quantized and s.reads(weights, fmt, activations):
            return s
    return None


def describe_unread(weights: dict, activations: dict | None) -> str:
    """Why no scheme reads a config group, in one phrase with what accel does read."""
    if activations:
        runs = "; ".join(f"{s} {get(s).input_activations}" for s in names() if get(s).input_activations)
        return f"accel runs quantized activations only as {runs}"
    return (f"{weights.get('num_bits')}-bit {weights.get('type', 'int')} {weights.get('strategy')} weights; "
            f"accel reads the schemes {', '.join(s for s in names() if get(s).quantized)}")


def quantized(name: str) -> bool:
    """Whether a plan entry quantizes its Linear (a registered scheme below 16 bits; a float dtype does not)."""
    return name not in FLOAT_DTYPES and get(name).quantized


# --- runtime plans: {HF module name: scheme or float dtype} -----------------------------------------------------

def check_plan(model: nn.Module, plan: dict[str, str], group_size: int = 64) -> None:
    """Raise ValueError naming the entry when `plan` cannot apply to `model` (a scheme that does not exist, a module
    that is not an nn.Linear of the model, a width the scheme's groups do not divide). Reads shapes only: the model
    may still be on the meta device."""
    from torch import nn

    modules = dict(model.named_modules())
    for name, scheme in plan.items():
        if scheme not in FLOAT_DTYPES and scheme not in names("on_load"):
            raise ValueError(f"plan[{name!r}] = {scheme!r} is not a scheme; allowed: "
                             f"{', '.join(names('on_load') + FLOAT_DTYPES)}")
        if name not in modules:
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            raise ValueError(f"plan names module {name!r}, which the model does not have; "
                             f"Linear modules are: {linears[:8]}{' ...' if len(linears) > 8 else ''}")
        if not isinstance(modules[name], nn.Linear):
            raise ValueError(f"plan names module {name!r} of type {type(modules[name]).__name__}; "
                             f"only nn.Linear can be quantized")
        if scheme not in FLOAT_DTYPES and (why := get(scheme).check_width(modules[name].in_features, group_size)):
            raise ValueError(f"module {name!r}: {why}")


def quantize_rows(rows: Rows, out_features: int, in_features: int, scheme: str, group_size: int = 64,
                  bias: Tensor | None = None) -> nn.Module:
    """The kernel module of a quantized `scheme` (RTN), its weight read a block of rows at a time."""
    if not quantized(scheme):
        raise ValueError(f"{scheme!r} is not a quantized scheme; allowed: {', '.join(names('on_load'))}")
    return get(scheme).kernel(rows, out_features, in_features, group_size, bias)


def quantize_linear(linear: nn.Linear, scheme: str, group_size: int = 64) -> nn.Module:
    """`linear` as the kernel module of `scheme` (RTN), or `linear` itself for a float dtype."""
    if scheme in FLOAT_DTYPES:
        return linear
    w = linear.weight.detach()
    return quantize_rows(lambda a, b: w[a:b], *w.shape, scheme, group_size, linear.bias).to(w.device)


def apply_plan(model: nn.Module, plan: dict[str, str], group_size: int = 64) -> nn.Module:
    """Replace the nn.Linear submodules named in `plan` in place (`group_size`: INT4's); returns `model`. The plan
    is checked before anything is replaced (`check_plan`), so a bad plan leaves the model untouched. A tied lm_head
    gets its own quantized copy; the embedding keeps the float tensor. (A model loaded from disk gets its plan as it
    loads: `accel.kernels.loader.load_weights`.)"""
    check_plan(model, plan, group_size)
    for name, scheme in plan.items():
        new = quantize_linear(model.get_submodule(name), scheme, group_size)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return model


def scheme_of(module: nn.Module) -> str:
    """The scheme a Linear-like module runs, or its float dtype as "fp16" / "bf16" / "fp32"."""
    import torch
    from torch import nn

    from accel.kernels.linear import PackedLinear

    for s in _REGISTRY.values():
        if s.owns(module):
            return s.name
    dtypes = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
    if isinstance(module, PackedLinear):
        return dtypes[module.weight_dtype]
    if isinstance(module, nn.Linear) and module.weight.dtype in dtypes:
        return dtypes[module.weight.dtype]
    raise ValueError(f"{type(module).__name__} is not a Linear accel knows; expected nn.Linear (fp16/bf16/fp32) or "
                     f"a kernel module of {', '.join(_REGISTRY)}")


def held_bytes(scheme: str, out_features: int, in_features: int, group_size: int = 64, dtype=None) -> int:
    """Bytes a Linear's weight of `scheme` holds once loaded for the CPU kernels (compacted: the kernel layout is
    the only copy); a float Linear holds its `dtype`'s bytes. Bias not counted."""
    import torch

    dtype = dtype or torch.float32
    if not quantized(scheme):
        return out_features * in_features * torch.empty(0, dtype=dtype).element_size()
    return get(scheme).held_bytes(out_features, in_features, group_size, dtype)


def _register_builtins() -> None:
    from accel.schemes.fp16 import Fp16
    from accel.schemes.int4 import Int4
    from accel.schemes.int4f import Int4f
    from accel.schemes.int5 import Int5
    from accel.schemes.int8 import Int8
    from accel.schemes.int8g import Int8g
    from accel.schemes.w4a8 import W4A8
    from accel.schemes.w8a8 import W8A8

    for cls in (Int4, Int4f, Int5, Int8, W8A8, W4A8, Int8g, Fp16):
        register(cls())


_register_builtins()

__all__ = ["FLOAT_DTYPES", "HEAD", "LOADERS", "TABLE", "QuantScheme", "apply_plan", "check", "check_plan", "get",
           "held_bytes", "json_enum", "names", "quantize_linear", "quantize_rows", "quantized", "register",
           "scheme_of", "unregister"]
