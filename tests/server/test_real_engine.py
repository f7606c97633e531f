"""The server over the real runtime Engine: a tiny random Llama with SmolLM2's tokenizer (fast), and one
integration test on the real SmolLM2-135M."""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest

from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from tests.conftest import make_tiny_llama
from tests.server.conftest import serve_in_thread, wait_until

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, real_model_path):
    """A tiny random Llama (hidden 64) with SmolLM2's 49152-token vocabulary, tokenizer and chat template."""
    d = tmp_path_factory.mktemp("tiny-smol")
    make_tiny_llama(vocab_size=49152, bos_token_id=1, eos_token_id=2, max_position_embeddings=256).save_pretrained(d)
    for f in TOKENIZER_FILES:
        shutil.copy(real_model_path / f, d)
    return d


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    engine = Engine.from_pretrained(tiny_dir, num_kv_blocks=64, block_size=16, max_model_len=256)
    # the expected greedy text, from the same engine in-process, before the server owns it
    expected = engine.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    with serve_in_thread(engine, model_name="tiny") as running:
        running.expected = expected
        yield running


def oa(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_greedy_completion_matches_the_in_process_engine_streaming_or_not(tiny):
    c = oa(tiny)
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0, extra_body={"ignore_eos": True})
    r = c.completions.create(**kw)
    assert r.choices[0].text == tiny.expected.text
    assert r.usage.prompt_tokens == len(tiny.engine.tokenizer.encode(PROMPT))
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    chunks = list(c.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks) == tiny.expected.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_applies_the_tokenizer_chat_template(tiny):
    msgs = [{"role": "user", "content": "hi"}]
    r = oa(tiny).chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0.0)
    tok = tiny.engine.tokenizer
    expected_ids = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    assert r.usage.prompt_tokens == len(expected_ids)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens <= 4


def test_disconnect_frees_the_engine_blocks(tiny):
    with httpx.Client(base_url=tiny.base_url, timeout=30) as http:
        payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=payload) as r:
            next(r.iter_lines())
    assert wait_until(lambda: tiny.engine.kv.num_held_blocks() == 0 and not tiny.engine.has_unfinished(), 10)


def test_prompt_longer_than_the_context_is_a_400(tiny):
    r = httpx.post(tiny.base_url + "/v1/completions", json={"model": "tiny", "prompt": " hello" * 300}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


@pytest.mark.integration
def test_real_model_chat_with_openai_client(real_model_path):
    engine = Engine.from_pretrained(real_model_path, num_kv_blocks=256, max_model_len=2048)
    with serve_in_thread(engine, model_name="smollm2-135m") as running:
        c = oa(running)
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        r = c.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=16, temperature=0.0)
        assert "paris" in r.choices[0].message.content.lower()
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 16
        chunks = list(c.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=16,
                                                temperature=0.0, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content
        metrics = httpx.get(running.base_url + "/metrics").text
        assert 'vllm:request_success_total{finished_reason="' in metrics
        assert wait_until(lambda: engine.kv.num_held_blocks() == 0)


@pytest.mark.slow
def test_run_server_subprocess_sigint_drains_in_flight_then_exits(tiny_dir):
    """The real entry point: run_server in its own process; SIGINT mid-stream lets the stream finish."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import threading

    from accel.server.serve import free_port

    port = free_port()
    code = ("import sys; from accel.server.config import ServerConfig; from accel.server.serve import run_server; "
            "run_server(sys.argv[1], ServerConfig(port=int(sys.argv[2]), served_model_name='tiny', log_level='warning', "
            "drain_timeout_s=20), num_kv_blocks=64, max_model_len=256)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny_dir), str(port)],
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    base = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            try:
                return httpx.get(base + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(healthy, timeout=120, interval=0.2), "server did not come up"
        events: list[str] = []

        def stream():
            # 200 tokens: long enough on the tiny model that the signal lands mid-stream
            payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True,
                       "temperature": 0.0}
            with httpx.stream("POST", base + "/v1/completions", json=payload, timeout=60) as r:
                events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))

        t = threading.Thread(target=stream)
        t.start()
        # in flight once its first tokens arrived (polling /metrics for a running request could miss a short one)
        assert wait_until(lambda: len(events) >= 2, timeout=30, interval=0.001)
        assert events[-1] != "[DONE]"
        proc.send_signal(signal.SIGINT)
        t.join(timeout=60)
        assert events and events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_draft_speculation_in_the_server_reports_acceptance_in_usage_and_metrics(tiny_dir):
    # `accel serve --speculative-config '{"draft_model": DIR, ...}'` builds this SpeculativeConfig; the model drafting
    # for itself accepts every greedy draft,
    # and the text is identical to no speculation
    from accel.server.serve import speculative_config

    prompt = "one two three four one two three four one two three four one two"
    kw = dict(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = Engine.from_pretrained(tiny_dir, num_kv_blocks=64, block_size=16, max_model_len=256)
    expected = plain.generate(prompt, SamplingParams(**kw))[0].text
    engine = Engine.from_pretrained(tiny_dir, num_kv_blocks=64, block_size=16, max_model_len=256,
                                    speculative=speculative_config({"draft_model": str(tiny_dir), "num_speculative_tokens": 3}))
    with serve_in_thread(engine, model_name="tiny") as running:
        r = httpx.post(running.base_url + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": prompt, **kw})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == expected
        spec = body["usage"]["spec_decode"]
        assert spec["num_drafts"] >= 1 and spec["num_accepted_tokens"] == spec["num_draft_tokens"] > 0
        metrics = httpx.get(running.base_url + "/metrics", timeout=10).text
        drafts = [ln for ln in metrics.splitlines() if ln.startswith("vllm:spec_decode_num_drafts")]
        assert drafts and float(drafts[0].split()[-1]) == spec["num_drafts"]


def test_speculative_config_from_the_flag_uses_the_config_field_names(tiny_dir):
    from accel.server.serve import speculative_config

    assert speculative_config('{"method": "ngram", "num_speculative_tokens": 5}').num_speculative_tokens == 5
    cfg = speculative_config({"draft_model": str(tiny_dir), "num_speculative_tokens": 2})
    assert cfg.method == "draft" and cfg.draft_model == str(tiny_dir) and cfg.num_speculative_tokens == 2
    cfg = speculative_config(json.dumps({"draft_model": str(tiny_dir), "draft_min_path_confidence": 0.35,
                                         "draft_min_first_confidence": 0.2, "draft_ngram_first": True}))
    assert (cfg.draft_min_path_confidence, cfg.draft_min_first_confidence, cfg.draft_ngram_first) == (0.35, 0.2, True)
    with pytest.raises(ValueError, match="draft_min_path_confidence=0.3 needs a draft model"):
        speculative_config({"method": "ngram", "draft_min_path_confidence": 0.3})
    with pytest.raises(ValueError, match=r"fields \['draft'\] are unknown; allowed: method, num_speculative_tokens"):
        speculative_config({"draft": "x"})
    with pytest.raises(ValueError, match="is not JSON"):
        speculative_config("ngram")
    with pytest.raises(ValueError, match="num_speculative_tokens='four' is invalid"):
        speculative_config({"num_speculative_tokens": "four"})