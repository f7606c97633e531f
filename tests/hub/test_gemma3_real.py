"""Integration: the real Gemma 3 270M pulled from PyPI, converted by accel, against llama.cpp on the same GGUF."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_token_ids_equal_llama_cpps_on_the_eval_text(real_gemma_path, tmp_path):
    from transformers import AutoTokenizer

    from accel.eval.chunked import held_out_text
    from accel.eval.gguf import llama_perplexity_path
    from accel.hub import accel_home, get_spec

    binary = llama_perplexity_path(None).parent / "llama-tokenize"
    gguf = accel_home() / "downloads" / get_spec("gemma3-270m").gguf_file
    if not binary.is_file() or not gguf.is_file():
        pytest.skip(f"needs {binary} (scripts/peers/build_llama_cpp.sh) and {gguf}")
    text = held_out_text(ROOT / "eval" / "text")
    (tmp_path / "t.txt").write_text(text)
    out = subprocess.run([str(binary), "-m", str(gguf), "-f", str(tmp_path / "t.txt"), "--ids", "--log-disable",
                          "--no-parse-special", "--no-escape"], capture_output=True, text=True, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = AutoTokenizer.from_pretrained(real_gemma_path)(text)["input_ids"]
    assert len(theirs) > 80_000 and ours == theirs


def test_transformers_continues_as_llama_cpp_does(real_gemma_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_gemma_path)
    model = AutoModelForCausalLM.from_pretrained(real_gemma_path, dtype=torch.float32).eval()
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    assert ids[0].tolist() == [2, 818, 5279, 529, 7001, 563]  # llama.cpp's ids for the same text
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    # llama.cpp (llama-cli, greedy) on the GGUF: " the capital of the country of France. It is the largest city..."
    assert tok.decode(out[0, ids.shape[1]:]).startswith(" the capital of the country of France. It is the largest")
