"""Per-unit sensitivity: the damage of quantizing one unit alone, at each candidate precision.

A unit is what shares one scheme in a plan (`accel.quant.schemes.quant_units`): a fused module (q/k/v, gate/up) or
a Linear fused with nothing.

metric "kl": mean KL(P_ref || P_quant) of the next-token distribution over the calibration tokens, with only that
unit fake-quantized (RTN). To make 120 units x 2 precisions affordable on a CPU, the input of every decoder layer
is cached from one reference forward; a unit in layer i then only re-runs layers i..L-1 plus the head, so each
measurement costs (L - i) / L of a forward (about half a forward on average).

metric "proxy": the Fisher-weighted output error (`_proxy_damage`), a second-order estimate of the same KL from one
forward and a few backward passes, in KL units. `rank_agreement` reports how it ranks units against the KL
measure.

Both measure RTN's weights unless `given` holds the quantizer's own (a GPTQ recipe's INT4: `accel.quant.quantize
.layerwise_gptq`), since a plan should rank units by the damage the export will have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from accel.quant.schemes import (check_scheme, fake_quantized, layer_index, quant_units, quantized_weight,
                                 quantizable_linears)


@dataclass
class SensitivityResult:
    """damage[unit][scheme]: mean KL (metric kl) or relative output MSE (metric proxy); fp16 is 0.
    units[unit]: the unit's member Linears (a unit missing from it is a Linear alone)."""

    metric: str
    group_size: int
    candidates: list[str]
    damage: dict[str, dict[str, float]]
    num_tokens: int
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    units: dict[str, list[str]] = field(default_factory=dict)

    def modules(self) -> list[str]:
        """The units measured (the allocation's decision variables)."""
        return list(self.damage)

    def members(self, unit: str) -> list[str]:
        return self.units.get(unit, [unit])

    def unit_map(self) -> dict[str, list[str]]:
        return {u: self.members(u) for u in self.damage}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(asdict(self), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> SensitivityResult:
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        data = json.loads(p.read_text() if p is not None else str(text_or_path))
        return cls(**data)

    def by_group_size(self) -> dict[int, SensitivityResult]:
        """{INT4 group size: result}: this one and those measured with it at other group sizes (`with_group_sizes`)."""
        return {self.group_size: self, **{int(g): SensitivityResult(**d)
                                          for g, d in self.extra.get("group_sizes", {}).items()}}


def with_group_sizes(results: Sequence[SensitivityResult]) -> SensitivityResult:
    """The first result carrying the others in extra["group_sizes"]: one sensitivity.json for the allocator's choice
    of INT4 group size."""
    first, rest = results[0], results[1:]
    if not rest:
        return first
    return replace(first, extra={**first.extra, "group_sizes": {str(r.group_size): asdict(r) for r in rest}})


def _check_batches(batches: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if not batches:
        raise ValueError("sensitivity needs at least one calibration batch, got none")
    out = []
    for i, b in enumerate(batches):
        if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.dtype != torch.long:
            raise ValueError(f"batch {i} must be a LongTensor of token ids [B, S], got "
                             f"{type(b).__name__} {getattr(b, 'shape', '')} {getattr(b, 'dtype', '')}")
        out.append(b)
    return out


def _progress(total: int, desc: str, enabled: bool):
    from accel.progress import bar

    return bar(total, desc, enabled)


F64_CHUNK_BYTES = 64 << 20  # one float64 [rows, V] chunk: a vocabulary's size must not set the working set


def f64_rows(vocab: int) -> int:
    """Rows per float64 chunk of [N, vocab] logits: 64 MB each (a 152k vocabulary's [512, V] was 0.62 GB, and the
    KL's five of them 3.1 GB over the model on Qwen2.5-Coder)."""
    return max(1, F64_CHUNK_BYTES // (8 * vocab))


def kl_sum(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Sum over positions of KL(P_ref || P); ref_logits and logits are [N, V].

    The softmax and the difference run in float64, in row chunks of `f64_rows`: single-layer int8 damage can be
    ~1e-7 per token, below float32 rounding noise of a 49k-way log-softmax.
    """
    total, chunk = 0.0, f64_rows(ref_logits.shape[-1])
    for i in range(0, ref_logits.shape[0], chunk):
        a = F.log_softmax(ref_logits[i:i + chunk].double(), dim=-1)  # [n, V]
        b = F.log_softmax(logits[i:i + chunk].double(), dim=-1).neg_().add_(a)  # a - b, in place
        total += float(b.mul_(a.exp_()).sum())
    return total


@dataclass
class _LayerCache:
    """Reference inputs of every decoder layer for one batch, plus what the layers need besides hidden states."""

    inputs: list[torch.Tensor]  # per layer: [B, S, H]
    kwargs: dict
    ref_logits: torch.Tensor  # [B*S, V]


def _capture(model: nn.Module, ids: torch.Tensor) -> _LayerCache:
    layers = model.model.layers
    inputs: list[torch.Tensor | None] = [None] * len(layers)
    kwargs: dict = {}

    def hook(idx):
        def fn(_mod, args, kw):
            hs = args[0] if args else kw["hidden_states"]
            inputs[idx] = hs.detach()
            if not kwargs:
                kwargs.update({k: v for k, v in kw.items() if k != "hidden_states"})
                kwargs["past_key_values"] = None
                kwargs["use_cache"] = False
        return fn

    handles = [layer.register_forward_pre_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        logits = model(ids, use_cache=False).logits  # [B, S, V]
    finally:
        for h in handles:
            h.remove()
    return _LayerCache(inputs=inputs, kwargs=kwargs, ref_logits=logits.float().reshape(-1, logits.shape[-1]))


def _suffix_logits(model: nn.Module, cache: _LayerCache, start: int) -> torch.Tensor:
    """Run decoder layers start..L-1, the final norm and lm_head from the cached input of layer `start`."""
    h = cache.inputs[start]
    for layer in model.model.layers[start:]:
        h = layer(h, **cache.kwargs)
    logits = model.lm_head(model.model.norm(h))  # [B, S, V]
    return logits.reshape(-1, logits.shape[-1])


def unmeasured(model, candidate: str, group_size: int, metric: str) -> SensitivityResult:
    """The units of `model` with no damage measured: a plan of one candidate has nothing to choose, so the
    pipeline's sensitivity stage writes this instead of spending minutes measuring."""
    units = quant_units(quantizable_linears(model))
    return SensitivityResult(metric=metric, group_size=group_size, candidates=[candidate],
                             damage={u: {candidate: 0.0} for u in units}, num_tokens=0, units=units,
                             extra={"skipped": "one candidate: nothing to allocate"})


def measure_sensitivity(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    candidates: Sequence[str] = ("int4", "int8"),
    group_size: int = 64,
    metric: str = "kl",
    progress: bool = True,
    modules: Sequence[str] | None = None,
    given: dict[str, dict[str, torch.Tensor]] | None = None,
) -> SensitivityResult:
    """Damage per unit (fused module or lone Linear) per candidate scheme, each unit quantized alone (RTN
    fake-quant). `modules`: the Linears to cover (default: every quantizable one), grouped into units.
    given: {scheme: {Linear: dequantized weight}} from the quantizer the plan will use (`accel.quant.quantize
    .layerwise_gptq`), measured instead of RTN where present.

    batches: LongTensors of token ids [B, S] (packed, no padding). fp16 candidates get damage 0 without a forward.
    """
    if metric not in ("kl", "proxy"):
        raise ValueError(f"unknown sensitivity metric {metric!r}; allowed: kl, proxy")
    for c in candidates:
        check_scheme(c)
    batches = _check_batches(batches)
    units = quant_units(list(modules) if modules is not None else quantizable_linears(model))
    t0 = time.perf_counter()
    if metric == "proxy":
        damage, ntok = _proxy_damage(model, batches, units, candidates, group_size, progress, given)
    else:
        damage, ntok = _kl_damage(model, batches, units, candidates, group_size, progress, given)
    return SensitivityResult(metric=metric, group_size=group_size, candidates=list(candidates), damage=damage,
                             num_tokens=ntok, seconds=time.perf_counter() - t0, units=units)


@torch.inference_mode()
def _kl_damage(model, batches, units, candidates, group_size, progress, given=None):
    quantized = [c for c in candidates if c != "fp16"]
    totals = {u: {c: 0.0 for c in candidates} for u in units}
    ntok = 0
    # Deepest layers first is irrelevant for cost; model order keeps the progress bar readable.
    with _progress(len(batches) * len(units) * len(quantized), "sensitivity (KL)", progress) as bar:
        for ids in batches:
            cache = _capture(model, ids)
            ntok += ids.numel()
            for unit, members in units.items():
                start = layer_index(unit)
                for c in quantized:
                    with fake_quantized(model, {m: c for m in members}, group_size, given):
                        logits = _suffix_logits(model, cache, start)
                    totals[unit][c] += kl_sum(cache.ref_logits, logits)
                    bar.update(1)
            del cache
    damage = {u: {c: totals[u][c] / ntok for c in candidates} for u in units}
    return damage, ntok


FISHER_SAMPLES = 4  # next tokens drawn per position for the Fisher estimate (backward passes per batch)


def _proxy_damage(model, batches, units, candidates, group_size, progress, given=None):
    """Fisher-weighted output error: KL(P || P_q) ~ 1/2 E_y[(dlog p(y) / dout . dout)^2] per position, with
    dout = dW x the unit's output change and the gradient taken at tokens y drawn from the model itself (the
    Fisher of the output distribution). Per batch, one forward and FISHER_SAMPLES backward passes: the forward hook
    forms each Linear's output change dW x per candidate (dW from the weight at hand, never kept), and the
    gradient hook folds each output gradient into its unit's [tokens] sum at once. Neither inputs nor gradients are
    held: holding them (and every dW across batches) took a Qwen2.5-1.5B-shaped model past 23 GB on 24."""
    names = [m for members in units.values() for m in members]
    unit_of = {m: u for u, members in units.items() for m in members}
    modules = dict(model.named_modules())
    quantized = [c for c in candidates if c != "fp16"]
    change: dict[tuple[str, str], torch.Tensor] = {}  # (Linear, scheme) -> dW x on this batch, [N, O]
    sums: dict[tuple[str, str], list[torch.Tensor]] = {}  # (unit, scheme) -> per sample, the change of log p(y) [N]
    seen: dict[str, int] = {}  # Linear -> output gradients folded in on this batch (the sample index)
    totals = {u: dict.fromkeys(candidates, 0.0) for u in units}

    def fold(name):
        def fn(g):
            k = seen[name] = seen.get(name, -1) + 1
            g = g.detach().reshape(-1, g.shape[-1]).float()
            with torch.no_grad():
                for c in quantized:
                    v = (change[name, c].float() * g).sum(-1)  # first-order change of log p(y) from its outputs
                    acc = sums.setdefault((unit_of[name], c), [])
                    if k < len(acc):
                        acc[k] += v
                    else:
                        acc.append(v)
        return fn

    def hook(name):
        def fn(mod, args, out):
            with torch.no_grad():
                x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
                w = mod.weight.float()
                for c in quantized:
                    # held in bf16 until the backward passes read it: half the bytes, ~0.4% off per element
                    change[name, c] = (x @ (quantized_weight(w, name, c, group_size, given).float() - w).T).bfloat16()
            out.register_hook(fold(name))
        return fn

    def leaf(_mod, _args, out):  # gradients flow through the activations only, never into the weights
        return out.detach().requires_grad_(True)

    requires = {p: p.requires_grad for p in model.parameters()}
    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    handles.append(model.get_input_embeddings().register_forward_hook(leaf))
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    ntok = 0
    try:
        with _progress(len(batches) * len(units), "sensitivity (Fisher)", progress) as bar:
            for ids in batches:
                with torch.enable_grad():
                    logits = model(ids, use_cache=False).logits
                    logp = logits.float().log_softmax(-1).reshape(-1, logits.shape[-1])
                    probs = logp.detach().exp()
                    for k in range(FISHER_SAMPLES):
                        y = torch.multinomial(probs, 1, generator=gen)  # [B*T, 1]
                        logp.gather(1, y).sum().backward(retain_graph=k + 1 < FISHER_SAMPLES)
                    del logits, logp, probs
                ntok += ids.numel()
                for unit in units:
                    for c in quantized:
                        totals[unit][c] += 0.5 * float(torch.stack(sums[unit, c]).pow(2).mean(0).sum())
                    bar.update(1)
                change.clear()
                sums.clear()
                seen.clear()
    finally:
        for h in handles:
            h.remove()
        for p_, r in requires.items():
            p_.requires_grad_(r)
    return {u: {c: totals[u][c] / ntok for c in candidates} for u in units}, ntok


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman needs two equal-length sequences of >= 2 values, got {len(a)} and {len(b)}")

    def ranks(x):
        t = torch.tensor(list(x), dtype=torch.float64)
        order = torch.argsort(t)
        r = torch.empty_like(t)
        r[order] = torch.arange(len(t), dtype=torch.float64)
        for v in torch.unique(t):  # average ties
            m = t == v
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-30))


def rank_agreement(kl: SensitivityResult, proxy: SensitivityResult) -> dict[str, float]:
    """Spearman correlation between two sensitivity tables, per quantized scheme and pooled."""
    out = {}
    mods = [m for m in kl.modules() if m in proxy.damage]
    pooled_a, pooled_b = [], []
    for c in kl.candidates:
        if c == "fp16" or c not in proxy.candidates:
            continue
        a = [kl.damage[m][c] for m in mods]
        b = [proxy.damage[m][c] for m in mods]
        out[c] = spearman(a, b)
        pooled_a += a
        pooled_b += b
    if len(out) > 1:
        out["pooled"] = spearman(pooled_a, pooled_b)
    return out
