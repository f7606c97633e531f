"""Is a pulled model the model llama.cpp runs from the same GGUF? Token ids on the held-out eval text (llama.cpp's
tokenizer, no special-token parsing, as llama-perplexity) and next-token distributions of the converted fp32 folder
vs llama.cpp's F32 of the same file (`llama-quantize --allow-requantize ... F32`), read from a
`llama-perplexity --kl-divergence-base` file.

    .venv/bin/python scripts/check_conversion.py gemma3-270m [--n-ctx 1024] [--chunks 4] [--engine transformers]

Also: the ids of code alone (held-out and calibration code documents) and whether the chat template is the GGUF's.

n_ctx 1024: every scored position (512..1022) lies past Gemma 3's 512-token window. --engine accel scores the
runtime (torch path, as `accel.eval.chunked` runs it) instead of transformers. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def llama_tokens(bin_dir: Path, gguf: Path, text_file: Path) -> list[int]:
    out = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(gguf), "-f", str(text_file), "--ids",
                          "--log-disable", "--no-parse-special", "--no-escape"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def logits_fn(engine: str, folder: Path):
    import torch

    if engine == "transformers":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return lambda ids: model(ids[None]).logits[0]
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    engine = Engine.from_pretrained(folder, max_num_batched_tokens=8192, enable_prefix_caching=False)

    def run(ids):  # the whole chunk as one prefill step; every row's logits
        engine.add_request(ids.tolist(), SamplingParams(max_tokens=1, temperature=0))
        sched = engine.scheduler.schedule()
        inputs, positions, meta, _ = engine.runner.prepare_inputs(sched.scheduled)
        logits = engine.model.compute_logits(engine.model(inputs, positions, meta, engine.runner.kv_caches))
        engine.scheduler.update_from_output(sched, engine.runner.execute(sched))  # finishes it: blocks freed
        return logits

    return run


def code_text(root: Path) -> str:
    """Code alone: the held-out code documents and the calibration set's, joined."""
    docs = [json.loads(line)["text"] for f in (root / "eval" / "text" / "code.jsonl", root / "calibration_data" /
                                              "code.jsonl") for line in f.read_text().splitlines() if line.strip()]
    return "\n\n".join(docs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="registry name (pulled)")
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--engine", choices=("transformers", "accel"), default="transformers")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from accel.eval.chunked import held_out_text
    from accel.eval.gguf import BaseLogits, kld_vs_base, llama_perplexity_path, run_llama_perplexity
    from accel.hub import accel_home, get_spec, resolve_model

    torch.set_num_threads(args.threads)
    folder, spec = resolve_model(args.model), get_spec(args.model)
    gguf = accel_home() / "downloads" / spec.gguf_file
    bin_dir = llama_perplexity_path(None).parent
    text = held_out_text(ROOT / "eval" / "text")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with tempfile.TemporaryDirectory() as tmp:
        text_file, f32, logits = Path(tmp) / "text.txt", Path(tmp) / "f32.gguf", Path(tmp) / "base.kld"
        text_file.write_text(text)
        theirs, ours = llama_tokens(bin_dir, gguf, text_file), tokenizer(text)["input_ids"]
        first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        code_file = Path(tmp) / "code.txt"
        code_file.write_text(code_text(ROOT))
        code_theirs, code_ours = llama_tokens(bin_dir, gguf, code_file), tokenizer(code_file.read_text())["input_ids"]
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(gguf), str(f32), "F32"],
                       capture_output=True, check=True)
        run_llama_perplexity(bin_dir / "llama-perplexity", ["-m", str(f32), "-f", str(text_file), "-c",
                             str(args.n_ctx), "-b", str(args.n_ctx), "--chunks", str(args.chunks),
                             "--kl-divergence-base", str(logits)], args.threads)
        with torch.no_grad():
            bos = tokenizer.bos_token_id
            adds_bos = bos is not None and tokenizer("a").input_ids[:1] == [bos]
            scores = kld_vs_base(BaseLogits.read(logits), logits_fn(args.engine, folder), bos if adds_bos else None)
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    print(json.dumps({"model": args.model, "engine": args.engine, "tokens": len(theirs),
                      "ids_identical": ours == theirs and first_diff is None, "first_difference": first_diff,
                      "code_tokens": len(code_theirs), "code_ids_identical": code_ours == code_theirs,
                      "chat_template_from_gguf": field is not None and tokenizer.chat_template == field.contents(),
                      "n_ctx": args.n_ctx, **scores}, indent=1))


if __name__ == "__main__":
    main()
