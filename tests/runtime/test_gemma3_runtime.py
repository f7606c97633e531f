"""Integration: the real Gemma 3 270M in accel's runtime: greedy output identical to transformers on the converted
folder, in a batch and alone, fp32, through the native step; the server's completions work and its chat endpoint
refuses a base model without a chat template."""

from __future__ import annotations

import httpx
import pytest
import torch

from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from tests.server.conftest import serve_in_thread

pytestmark = pytest.mark.integration
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Water boils at", "1, 2, 3, 5, 8, 13,"]


@pytest.fixture(scope="module")
def engine(real_gemma_path):
    return Engine.from_pretrained(real_gemma_path, num_threads=2, max_model_len=1024)


def test_greedy_equals_transformers_in_a_batch_and_alone(real_gemma_path, engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_gemma_path)
    hf = AutoModelForCausalLM.from_pretrained(real_gemma_path, dtype=torch.float32).eval()
    refs = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        out = hf.generate(ids, max_new_tokens=24, do_sample=False)
        refs.append(out[0, ids.shape[1]:].tolist())
    assert engine.model.native_decode is not None
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    batch = [o.token_ids for o in engine.generate([tok(p)["input_ids"] for p in PROMPTS], greedy)]
    assert batch == refs
    assert engine.generate([tok(PROMPTS[1])["input_ids"]], greedy)[0].token_ids == refs[1]


def test_served_base_model_completes_and_refuses_chat(engine):
    with serve_in_thread(engine, model_name="gemma3-270m") as running:
        r = httpx.post(running.base_url + "/v1/completions", json={
            "model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(" the capital of")
        r = httpx.post(running.base_url + "/v1/chat/completions", json={
            "model": "gemma3-270m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "no chat template; use /v1/completions" in r.text
