"""How a model plugs into the evaluation: a logits function, a tokenizer and an optional generate function.

Any implementation fits: an HF `PreTrainedModel`, accel's runtime model, or an HF model whose Linears were
swapped for quantized kernels; only `EvalModel` crosses into the metrics code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

# [B, T] int64 token ids -> [B, T, V] logits; row t predicts token t+1.
LogitsFn = Callable[[torch.Tensor], torch.Tensor]
# (prompts, max_new_tokens) -> greedy replies (text only, without the prompt), same order as prompts.
GenerateFn = Callable[[list[str], int], list[str]]


@dataclass
class EvalModel:
    """A model as the evaluation sees it."""

    name: str
    logits_fn: LogitsFn
    tokenizer: Any  # needs encode(text, add_special_tokens=False) -> list[int]
    separator_id: int | None  # document separator of the text protocol (the model's EOS)
    generate_fn: GenerateFn | None = None  # None: this model is not run on the tasks


def _first_id(value: int | Sequence[int] | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    return int(value[0]) if len(value) else None


def eos_id_of(model: Any, tokenizer: Any) -> int | None:
    """The EOS id that ends generation: generation_config first (SmolLM2's tokenizer eos is <|im_start|>)."""
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = _first_id(getattr(cfg, "eos_token_id", None)) if cfg is not None else None
        if eos is not None:
            return eos
    return getattr(tokenizer, "eos_token_id", None)


def hf_logits_fn(model: torch.nn.Module, device: str | torch.device = "cpu") -> LogitsFn:
    """Wrap an HF causal LM as a LogitsFn (no KV cache: each call is one full forward)."""

    @torch.inference_mode()
    def logits_fn(input_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids.to(device), use_cache=False).logits  # [B, T, V]

    return logits_fn


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """The task prompt as one user turn of the tokenizer's chat template (raw prompt when there is none)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    return prompt


def hf_generate_fn(
    model: Any, tokenizer: Any, device: str | torch.device = "cpu", batch_size: int = 16
) -> GenerateFn:
    """Greedy batched generation with HF `generate`: chat template, left padding, EOS stops a row.

    Prompts are batched in length order so a batch pads little; replies come back in the input order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    eos = eos_id_of(model, tokenizer)
    pad = _first_id(getattr(getattr(model, "generation_config", None), "pad_token_id", None))
    pad = pad if pad is not None else (eos if eos is not None else 0)

    @torch.inference_mode()
    def generate_fn(prompts: list[str], max_new_tokens: int) -> list[str]:
        encoded = [tokenizer.encode(chat_prompt(tokenizer, p), add_special_tokens=False) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        replies: list[str] = [""] * len(prompts)
        for lo in range(0, len(order), batch_size):
            rows = order[lo : lo + batch_size]
            width = max(len(encoded[i]) for i in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [B, T] left padded
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                n = len(encoded[i])
                ids[r, width - n :] = torch.tensor(encoded[i])
                mask[r, width - n :] = 1
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )  # [B, T + new]
            for r, i in enumerate(rows):
                replies[i] = tokenizer.decode(out[r, width:].tolist(), skip_special_tokens=True)
        return replies

    return generate_fn


def from_hf(
    model: Any, tokenizer: Any, *, name: str | None = None, device: str | torch.device = "cpu", batch_size: int = 16
) -> EvalModel:
    """Adapt an HF causal LM (already on `device`, eval mode) and its tokenizer."""
    model.eval()
    return EvalModel(
        name=name or str(getattr(model, "name_or_path", "") or type(model).__name__),
        logits_fn=hf_logits_fn(model, device),
        tokenizer=tokenizer,
        separator_id=eos_id_of(model, tokenizer),
        generate_fn=hf_generate_fn(model, tokenizer, device, batch_size),
    )


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A local model folder from a path, a registry name or a .gguf file (accel.hub.resolve_model)."""
    from accel.hub import resolve_model

    return Path(resolve_model(name_or_path))


def load_eval_model(
    model: str | Path | EvalModel | Any,
    *,
    tokenizer: Any = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> EvalModel:
    """An EvalModel from a path or registry name, an HF PreTrainedModel, or an EvalModel (returned as is)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    if isinstance(model, EvalModel):
        return model
    if isinstance(model, PreTrainedModel):
        if tokenizer is None:
            if not model.name_or_path:
                raise ValueError("pass tokenizer= for an in-memory model without name_or_path")
            tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
        return from_hf(model.to(device), tokenizer, device=device)
    if isinstance(model, (str, Path)):
        path = resolve_model_path(model)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        return from_hf(hf, tok, name=str(model), device=device)
    raise TypeError(
        f"model must be a path, a registry name, a transformers PreTrainedModel or an EvalModel, got {type(model).__name__}"
    )
