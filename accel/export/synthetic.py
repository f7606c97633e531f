"""A checkpoint of a real model's shapes with random weights made straight in their stored INT4 / INT8 form: for
memory and speed measurements at sizes no model on this machine has (a Qwen2.5-7B). Integer codes, fp16 scales and
zero points are drawn directly as packed words, one tensor at a time (`accel.tensorio`), so no weight matrix ever
exists in float, and the folder is what an accel export of that plan stores: compressed-tensors "pack-quantized"
Linears (every decoder Linear and the lm_head), a 16-bit token table, fp32 norms and biases.

    python -m accel.export.synthetic qwen2.5-7b OUT [--scheme int4 --group-size 32 --tokenizer-from DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from accel.progress import SILENT, Reporter
from accel.tensorio import TensorSpec, write_folder

# Qwen2.5-7B(-Instruct / -Coder) as its config.json on the Hub gives it.
SHAPES = {
    "qwen2.5-7b": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, bos_token_id=151643,
                       eos_token_id=151645, hidden_act="silu"),
}
SCHEMES = ("int4", "int8")


def _linears(c: dict) -> list[tuple[str, int, int, bool]]:
    """(name, out, in, bias) of every Linear a Qwen2 / Llama decoder holds, and the lm_head."""
    h, i, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"] * c["hidden_size"] // \
        c["num_attention_heads"]
    bias = c["model_type"] == "qwen2"
    out = []
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out += [(f"{p}.self_attn.q_proj", h, h, bias), (f"{p}.self_attn.k_proj", kv, h, bias),
                (f"{p}.self_attn.v_proj", kv, h, bias), (f"{p}.self_attn.o_proj", h, h, False),
                (f"{p}.mlp.gate_proj", i, h, False), (f"{p}.mlp.up_proj", i, h, False),
                (f"{p}.mlp.down_proj", h, i, False)]
    return out + [("lm_head", c["vocab_size"], h, False)]


def _specs(c: dict, scheme: str, group_size: int) -> list[tuple[TensorSpec, str]]:
    """Every tensor of the folder and how to draw it."""
    h, v = c["hidden_size"], c["vocab_size"]
    specs = [(TensorSpec("model.embed_tokens.weight", torch.float16, (v, h)), "normal")]
    for layer in range(c["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            specs.append((TensorSpec(f"model.layers.{layer}.{norm}.weight", torch.float32, (h,)), "ones"))
    specs.append((TensorSpec("model.norm.weight", torch.float32, (h,)), "ones"))
    for name, n_out, n_in, bias in _linears(c):
        per_word = 8 if scheme == "int4" else 4
        specs += [(TensorSpec(f"{name}.weight_packed", torch.int32, (n_out, n_in // per_word)), "bits"),
                  (TensorSpec(f"{name}.weight_shape", torch.int64, (2,)), f"shape:{n_out},{n_in}")]
        if scheme == "int4":
            specs += [(TensorSpec(f"{name}.weight_scale", torch.float16, (n_out, n_in // group_size)), "scale"),
                      (TensorSpec(f"{name}.weight_zero_point", torch.int32, (n_out // 8, n_in // group_size)),
                       "zeros")]
        else:
            specs.append((TensorSpec(f"{name}.weight_scale", torch.float16, (n_out, 1)), "scale"))
        if bias:
            specs.append((TensorSpec(f"{name}.bias", torch.float32, (n_out,)), "normal"))
    return specs


def _draw(spec: TensorSpec, how: str, g: torch.Generator, scheme: str) -> torch.Tensor:
    if how == "ones":
        return torch.ones(spec.shape)
    if how == "normal":
        return (torch.randn(spec.shape, generator=g) * 0.02).to(spec.dtype)
    if how == "scale":  # a weight spread of ~0.02 over 15 (INT4) or 255 (INT8) steps
        return torch.empty(spec.shape).uniform_(0.002, 0.004, generator=g).to(spec.dtype) if scheme == "int4" \
            else torch.empty(spec.shape).uniform_(1e-4, 2e-4, generator=g).to(spec.dtype)
    if how == "zeros":  # every packed nibble 8 (the middle of the grid): 0x88888888 as int32
        return torch.full(spec.shape, -2004318072, dtype=torch.int32)
    if how == "bits":
        return torch.randint(-(1 << 31), 1 << 31, spec.shape, dtype=torch.int32, generator=g)
    out_f, in_f = (int(x) for x in how.split(":")[1].split(","))
    return torch.tensor([out_f, in_f], dtype=torch.int64)


def quantization_config(c: dict, scheme: str, group_size: int) -> dict:
    """compressed-tensors' config for every Linear at `scheme` (the form `accel.quant.quantize` writes)."""
    weights = ({"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": group_size}
               if scheme == "int4" else {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"})
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {scheme: {"targets": [n for n, *_ in _linears(c)], "weights": weights,
                                       "format": "pack-quantized"}},
            "ignore": []}


def write(shape: str | dict, out: Path, scheme: str = "int4", group_size: int = 32, seed: int = 0,
          tokenizer_from: Path | None = None, reporter: Reporter = SILENT) -> Path:
    """Write the folder (config.json, model-*.safetensors) of `shape` (a name in SHAPES, or a config dict of the
    same keys) at `scheme`, with the tokenizer files of `tokenizer_from` when given; returns `out`."""
    if isinstance(shape, str) and shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is unknown; allowed: {', '.join(SHAPES)}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is invalid; allowed: {', '.join(SCHEMES)}")
    c = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = _specs(c, scheme, group_size)
    g = torch.Generator().manual_seed(seed)

    def tensors() -> Iterator[torch.Tensor]:
        for spec, how in specs:
            yield _draw(spec, how, g, scheme)

    with reporter.task(f"drawing {c['model_type']} at {scheme}", sum(s.nbytes for s, _ in specs), unit="B") as advance:
        write_folder(out, [s for s, _ in specs], tensors(), progress=advance)
    config = {**c, "torch_dtype": "float16", "quantization_config": quantization_config(c, scheme, group_size),
              "_synthetic": f"random weights drawn in {scheme} form by accel.export.synthetic (seed {seed})"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in sorted(Path(tokenizer_from).glob("*")) if tokenizer_from else []:
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


def main() -> None:
    from accel.progress import RichReporter

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--scheme", choices=SCHEMES, default="int4")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", type=Path, help="a folder whose tokenizer files to copy (the family's)")
    args = ap.parse_args()
    write(args.shape, args.out, args.scheme, args.group_size, args.seed, args.tokenizer_from, RichReporter())
    print(args.out)


if __name__ == "__main__":
    main()
