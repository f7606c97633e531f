"""Integration: the real Qwen2.5-Coder 1.5B and 0.5B pulled from PyPI, converted by accel a tensor at a time, against
llama.cpp on the same GGUF and against transformers on the converted folder; skipped where a model is not pulled
(`accel models pull qwen2.5-coder-0.5b`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
MODELS = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def _pulled(name: str) -> Path:
    from accel.hub import ModelNotFoundError, resolve_model

    try:
        return resolve_model(name)
    except ModelNotFoundError:
        pytest.skip(f"{name} is not pulled (`accel models pull {name}`)")


def _llama_ids(gguf: Path, text: str, tmp_path: Path) -> list[int]:
    from accel.eval.gguf import llama_perplexity_path

    binary = llama_perplexity_path(None).parent / "llama-tokenize"
    if not binary.is_file() or not gguf.is_file():
        pytest.skip(f"needs {binary} (scripts/peers/build_llama_cpp.sh) and {gguf}")
    (tmp_path / "t.txt").write_text(text)
    out = subprocess.run([str(binary), "-m", str(gguf), "-f", str(tmp_path / "t.txt"), "--ids", "--log-disable",
                          "--no-parse-special", "--no-escape"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", MODELS)
def test_token_ids_equal_llama_cpps_on_the_eval_text_and_on_code(name, tmp_path):
    from accel.eval.chunked import held_out_text
    from accel.hub import accel_home, get_spec
    from accel.tokenizer import load_tokenizer

    folder = _pulled(name)
    gguf = accel_home() / "downloads" / get_spec(name).gguf_file
    tok = load_tokenizer(folder)
    code = "\n\n".join(json.loads(line)["text"] for f in ("eval/text/code.jsonl", "calibration_data/code.jsonl")
                       for line in (ROOT / f).read_text().splitlines() if line.strip())
    for text in (held_out_text(ROOT / "eval" / "text"), code):
        assert tok(text)["input_ids"] == _llama_ids(gguf, text, tmp_path)


@pytest.mark.parametrize("name", MODELS)
def test_the_chat_template_is_the_ggufs(name):
    from gguf import GGUFReader

    from accel.hub import accel_home, get_spec
    from accel.tokenizer import load_tokenizer

    folder = _pulled(name)
    gguf = accel_home() / "downloads" / get_spec(name).gguf_file
    if not gguf.is_file():
        pytest.skip(f"{gguf} not kept")
    template = GGUFReader(str(gguf)).fields["tokenizer.chat_template"].contents()
    tok = load_tokenizer(folder)
    assert tok.chat_template == template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_runtime_greedy_equals_transformers_on_the_0_5b():
    from transformers import AutoModelForCausalLM

    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    folder = _pulled("qwen2.5-coder-0.5b")
    engine = Engine.from_pretrained(folder, num_kv_blocks=64, block_size=16, max_num_seqs=1)
    prompt = engine.tokenizer("def fibonacci(n):\n").input_ids
    ours = engine.generate(prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].token_ids
    del engine
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert ours == out[0, len(prompt):].tolist()


def test_served_quantized_within_its_memory_and_refused_below_it():
    """`accel generate` of the 1.5B at INT8: peak RSS within a limit that holds its weights, KV and process; one
    line with the numbers under a limit that does not."""
    folder = _pulled("qwen2.5-coder-1.5b")

    def generate(limit: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "ACCEL_MEMORY_LIMIT": limit}
        return subprocess.run([sys.executable, "-m", "accel", "generate", str(folder), "def f(x):", "--max-tokens",
                               "8", "--quant", "int8"], capture_output=True, text=True, env=env, timeout=900)

    refused = generate("2G")
    assert refused.returncode == 2 and "ACCEL_MEMORY_LIMIT=2G allows" in " ".join(refused.stderr.split())
    fits = generate("4G")
    assert fits.returncode == 0, fits.stderr
    peak = float(" ".join(fits.stderr.split()).split("peak RSS ")[1].split(" GB")[0])
    assert peak <= 4 * (1 << 30) / 1e9
