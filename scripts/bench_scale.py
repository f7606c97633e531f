"""Batch-1 decode at real model shapes with random weights (speed does not depend on the values), accel next to
llama.cpp on the same weights: the folder is converted with llama.cpp's own convert_hf_to_gguf.py (from the sdist
scripts/peers/build_llama_cpp.sh unpacks) to F32, then llama-quantize makes Q8_0 and Q4_K_M.

    .venv/bin/python scripts/bench_scale.py [--shapes llama-3.2-1b,qwen2.5-1.5b] [--pairs fp32,int8,int4km]
                                            [--repeats 2] [--tokens 64] [--json out.json]

Shapes are the published configs' (layers, widths, heads, vocabulary, tied head, RoPE); the tokenizer is
SmolLM2's, padded to the shape's vocabulary. The folders and GGUFs are kept in
$ACCEL_HOME/scale/ (~2.5 + 5 + 1.3 + 0.8 GB per shape). convert_hf_to_gguf.py imports sentencepiece
(`.venv/bin/pip install sentencepiece`). Each repeat runs accel (Engine, `tokens` greedy tokens
after a 4-token prompt) and then llama-bench (-p 0 -n tokens), so a ratio compares the same minute. Prints one
table: tok/s and ratio per shape and pair, with each process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import PAIRS, accel_decode, llama_bin, llama_decode  # noqa: E402

SHAPES = {
    "llama-3.2-1b": ("LlamaConfig", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen2.5-1.5b": ("Qwen2Config", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, use_sliding_window=False)),
}


def make_folder(name: str, out: Path) -> Path:
    """A random-weight HF folder of the shape (bf16 on disk: both engines read the same values in fp32)."""
    import torch
    import transformers

    from accel.hub import resolve_model

    if (out / "config.json").is_file():
        return out
    cls, kw = SHAPES[name]
    config = getattr(transformers, cls)(**kw, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    from transformers import AutoTokenizer

    smollm = resolve_model("smollm2-135m", pull_if_missing=True)
    if cls == "LlamaConfig":  # its converter reads the vocabulary as given: padded here to the table's size
        tokenizer = AutoTokenizer.from_pretrained(smollm)
        tokenizer.add_tokens([f"<pad_{i}>" for i in range(len(tokenizer), config.vocab_size)])
        tokenizer.save_pretrained(tmp)
    else:  # the GPT-2 path pads the vocabulary itself, and checks the files' pre-tokenizer as shipped
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(smollm / f, tmp / f)
    tmp.rename(out)
    return out


def make_ggufs(bin_dir: Path, folder: Path, kinds: list[str]) -> dict[str, Path]:
    convert = bin_dir.parent / "src"
    script = next(convert.glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    f32 = folder.parent / f"{folder.name}.F32.gguf"
    if not f32.is_file():
        # The tokenizer is SmolLM2's as accel converted it from its GGUF: llama.cpp's "smollm" pre-tokenizer, which
        # the converter's hash of these re-saved files does not recognise (the GPT-2 path refuses an unknown hash).
        code = (f"import sys; sys.argv = [{str(script)!r}, {str(folder)!r}, '--outtype', 'f32', '--outfile', "
                f"{str(f32)!r}]; sys.path.insert(0, {str(script.parent)!r}); import conversion.base as b; "
                "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'smollm'; "
                "import convert_hf_to_gguf as c; c.main()")
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    files = {"F32": f32}
    for kind in kinds:
        dst = folder.parent / f"{folder.name}.{kind}.gguf"
        if kind != "F32" and not dst.is_file():
            subprocess.run([str(bin_dir / "llama-quantize"), str(f32), str(dst), kind], check=True,
                           capture_output=True)
        files[kind] = dst
    return files


def accel_rate(folder: Path, pair: str, threads: int, tokens: int, repeats: int) -> list[float]:
    """accel's decode tok/s, `repeats` times, in a child process (its peak memory is its own)."""
    code = ("import sys, json; sys.path.insert(0, 'scripts'); from bench_peers import accel_engine, accel_decode; "
            f"e = accel_engine(__import__('pathlib').Path({str(folder)!r}), {pair!r}, {threads}); accel_decode(e, 8); "
            f"r = [accel_decode(e, {tokens}) for _ in range({repeats})]; import resource; "
            "print(json.dumps({'rates': r, 'peak_gb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--pairs", default="fp32,int8,int4km")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from accel.bench.ledger import Entry, figure, ratio
    from accel.hub import accel_home

    bin_dir = llama_bin()
    rows = []
    pairs = a.pairs.split(",")
    with Entry(f"scale-{a.shapes.replace(',', '+')}", bandwidth_threads=a.threads) as entry:
        entry.info = {"shapes": a.shapes.split(","), "pairs": pairs, "threads": a.threads, "tokens": a.tokens,
                      "repeats": a.repeats, "peer": "llama.cpp", "labels": {p: f"{p} / {PAIRS[p][2]}" for p in pairs}}
        for shape in a.shapes.split(","):
            folder = make_folder(shape, accel_home() / "scale" / shape)
            ggufs = make_ggufs(bin_dir, folder, [PAIRS[p][2] for p in pairs])
            for pair in pairs:
                acc = accel_rate(folder, pair, a.threads, a.tokens, a.repeats)
                peer = [llama_decode(bin_dir, ggufs[PAIRS[pair][2]], a.threads, a.tokens) for _ in range(a.repeats)]
                median_ratio = statistics.median(acc["rates"]) / statistics.median(peer)
                rows.append({"shape": shape, "pair": f"{pair} / {PAIRS[pair][2]}", "accel": acc["rates"],
                             "peer": peer, "ratio": median_ratio, "accel_peak_gb": acc["peak_gb"]})
                print(f"| {shape} | {rows[-1]['pair']} | {statistics.median(acc['rates']):.1f} | "
                      f"{statistics.median(peer):.1f} | {median_ratio:.2f}x | {acc['peak_gb']:.1f} GB |", flush=True)
                entry.figures |= {f"{shape}|{pair}.accel": figure(acc["rates"], "tok/s"),
                                  f"{shape}|{pair}.peer": figure(peer, "tok/s"),
                                  f"{shape}|{pair}.ratio": ratio(acc["rates"], peer),
                                  f"{shape}|{pair}.accel_peak_gb": figure([acc["peak_gb"]], "GB", 2)}
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print(f"\npeak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB")


if __name__ == "__main__":
    main()
