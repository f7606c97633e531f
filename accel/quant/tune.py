"""Scale tuning: after GPTQ, the scales of the quantized Linears are tuned end to end on the KL of the model's
next-token distribution to the unquantized model's (EfficientQAT's E2E-QP step). The integer codes and zero points
stay as GPTQ chose them, so the checkpoint keeps its format and every loader (vLLM's W4A16 / W8A16 included).

Why: GPTQ fits each Linear on its own output error; the errors then add up through 30 layers. Tuning the scales
of SmolLM2-135M's 210 INT4 / INT8 Linears against the model's own output (4 x 256 tokens a step, bf16 matmuls)
lowers int4-mixed's held-out KLD, most of it in the first steps, with the decay below (scripts/bench_quality.py;
docs/DESIGN.md, Quantization). On the draw's ~150 rows alone the loss kept falling while the held-out KLD barely
moved: the steps fit those rows, so they take distinct rows from every calibration unit not held out
(`tuning_rows`). Per-layer refits (least-squares scales on each Linear's inputs, bias correction) lowered the
calibration holdout's KL far less than these steps.
Written here because llm-compressor has no end-to-end step; the model stays a compressed-tensors model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from accel.quant.sensitivity import _progress


BATCH_ROWS = 4  # rows of 256 tokens a step: keeps a step to seconds on 2 cores


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (AVX512-BF16 or AMX): there autocast runs the step faster;
    elsewhere oneDNN emulates bf16 GEMMs several times slower than fp32."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


class _ScaledCodes(nn.Module):
    """A quantized Linear during tuning: weight = codes * (scale * exp(u)) per group, u trained."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, codes: torch.Tensor) -> None:
        super().__init__()
        self.group = weight.shape[1] // scale.shape[1]
        self.register_buffer("codes", codes)
        self.register_buffer("scale0", scale.float())
        self.u = nn.Parameter(torch.zeros_like(self.scale0))

    def scale(self) -> torch.Tensor:
        return self.scale0 * torch.exp(self.u)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.codes * self.scale().repeat_interleave(self.group, 1).to(self.codes.dtype))


def _codes(module: nn.Module) -> torch.Tensor | None:
    """The module's integer codes less their zero point (what the scale multiplies), as the library's quantizer
    rounds them; None for a module without integer weight quantization or with a float zero point (int4f)."""
    s, w = getattr(module, "weight_scale", None), getattr(module, "weight", None)
    args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
    if s is None or w is None or args is None or str(getattr(args.type, "value", args.type)) != "int":
        return None
    if w.dim() != 2 or s.dim() != 2 or w.shape[0] != s.shape[0] or w.shape[1] % s.shape[1]:
        return None
    g = w.shape[1] // s.shape[1]
    z = getattr(module, "weight_zero_point", None)
    z = torch.zeros_like(s, dtype=torch.float32) if z is None else z.float()
    if not torch.equal(z, torch.round(z)):
        return None
    zx = z.repeat_interleave(g, 1)
    lo, hi = -(2 ** (args.num_bits - 1)), 2 ** (args.num_bits - 1) - 1
    return torch.clamp(torch.round(w.float() / s.float().repeat_interleave(g, 1)) + zx, lo, hi) - zx


def tunable_linears(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: codes} of the quantized decoder Linears with integer codes. The lm_head is left out: its weight
    gradient is the largest GEMM of a step, for ~0.5% of int4-mixed's KL."""
    out = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and name != "lm_head" and not name.endswith(".lm_head"):
                c = _codes(mod)
                if c is not None:
                    out[name] = c
    return out


def tuning_rows(samples: Sequence, n: int, shares: dict[str, float] | None = None, seq_len: int = 256
                ) -> torch.Tensor:
    """`n` rows [n, seq_len] for scale tuning, packed per domain from `samples` (every calibration unit not held out,
    not only the draw: steps x batch rows read the draw's ~150 rows several times over and fit them more than other
    text) and mixed by `shares` (the GPTQ rows' domain mix; None = each domain's tokens). Rows are distinct while a
    domain has enough; a domain with fewer cycles."""
    from accel.calibration import largest_remainder
    from accel.quant.domain_weighting import domain_rows, pick_rows

    if n < 1:
        raise ValueError(f"n={n} is invalid; allowed: >= 1")
    per_domain = domain_rows(samples, seq_len)
    if not per_domain:
        raise ValueError(f"scale tuning needs a row of {seq_len} tokens of one domain; the calibration text has "
                         f"none: add text or turn quantization.scale_tuning_steps off")
    weights = {d: shares.get(d, 0.0) if shares else float(r.numel()) for d, r in per_domain.items()}
    if not sum(weights.values()):
        weights = {d: 1.0 for d in per_domain}
    return pick_rows(per_domain, largest_remainder(n, weights))


def _swap(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    parent, _, attr = name.rpartition(".")
    holder = model.get_submodule(parent) if parent else model
    old = getattr(holder, attr)
    setattr(holder, attr, new)
    return old


def tune_scales(model: nn.Module, teacher: nn.Module, rows: torch.Tensor, steps: int, lr: float = 1e-3,
                batch_size: int = BATCH_ROWS, seed: int = 0, progress: bool = False) -> dict:
    """Tune the group scales of `model`'s quantized Linears (in place) for `steps` Adam steps on the mean per-token
    KL(teacher || model) over batches of `rows` [N, T], each row once per pass in an order drawn with `seed`. Each
    scale ends rounded to fp16 (what the checkpoint stores) and each weight is codes x scale, so the library's
    compressor reproduces the same codes. Returns a summary: Linears tuned, steps, seconds, the mean loss of the first and last steps."""
    if steps < 1:
        raise ValueError(f"steps={steps} is invalid; allowed: an integer >= 1")
    targets = tunable_linears(model)
    if not targets:
        return {"linears": 0, "steps": 0}
    was_training = model.training
    grads = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    originals: dict[str, nn.Module] = {}
    tuned: dict[str, _ScaledCodes] = {}
    for name, codes in targets.items():
        mod = model.get_submodule(name)
        tuned[name] = _ScaledCodes(mod.weight.detach(), mod.weight_scale.detach(), codes.to(mod.weight.dtype))
        originals[name] = _swap(model, name, tuned[name])
    opt = torch.optim.Adam([t.u for t in tuned.values()], lr=lr)
    # constant, then a cosine decay to zero over the last 40% of the steps (warmup-stable-decay without the
    # warmup: the scales start at GPTQ's, already close): the steps at full rate keep the constant schedule's pace,
    # and the decay lets the last steps settle instead of ending on one batch's noise
    stable = int(0.6 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < stable else 0.5 * (1.0 + math.cos(math.pi * (s - stable) / (steps - stable))))
    gen = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    bs = min(batch_size, rows.shape[0])
    bf16 = native_bf16()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = _progress(steps, "scale tuning", progress)
    try:
        model.train()
        for step in range(steps):
            if order.numel() < bs:
                order = torch.randperm(rows.shape[0], generator=gen)
            x, order = rows[order[:bs]], order[bs:]
            with torch.no_grad():
                target = teacher(x, use_cache=False).logits.float().log_softmax(-1)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x, use_cache=False).logits
            loss = F.kl_div(logits.float().log_softmax(-1), target, log_target=True, reduction="none").sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(kl=f"{losses[-1]:.4f}")
    finally:
        bar.close()
        with torch.no_grad():
            for name, t in tuned.items():
                _swap(model, name, originals[name])
                mod = originals[name]
                scale = t.scale().to(torch.float16).to(mod.weight_scale.dtype)
                mod.weight_scale.copy_(scale)
                mod.weight.copy_((t.codes.float() * scale.float().repeat_interleave(t.group, 1)).to(mod.weight.dtype))
        for p, g in grads.items():
            p.requires_grad_(g)
        model.train(was_training)
    k = max(1, min(5, len(losses) // 2))
    return {"linears": len(tuned), "steps": len(losses), "seconds": round(time.perf_counter() - t0, 1),
            "bf16": bf16, "loss_first": round(sum(losses[:k]) / k, 5), "loss_last": round(sum(losses[-k:]) / k, 5)}
