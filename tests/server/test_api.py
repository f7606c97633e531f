"""The OpenAI-compatible routes over the fake engine, driven by the real `openai` client and by httpx."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL, serve_in_thread
from tests.server.fake_engine import FakeEngine


def client(running, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url + "/v1", api_key=api_key, max_retries=0, timeout=20)


def sse_events(body: str) -> list[str]:
    return [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]


def test_completion_non_streaming_text_finish_reason_and_usage(fake_server):
    r = client(fake_server).completions.create(model=MODEL, prompt="abc", max_tokens=5)
    assert r.choices[0].text == "Hello"
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 5, 8)
    assert r.model == MODEL and r.object == "text_completion"


def test_completion_streaming_matches_non_streaming_and_ends_with_done(fake_server):
    chunks = list(client(fake_server).completions.create(model=MODEL, prompt="abc", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "Hello wo"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    raw = httpx.post(fake_server.base_url + "/v1/completions",
                     json={"model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": True}, timeout=10)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw.text)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "Hel"


def test_completion_stop_string_truncates_in_both_modes(fake_server):
    c = client(fake_server)
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=20, stop=["wor"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("Hello ", "stop")
    chunks = list(c.completions.create(model=MODEL, prompt="x", max_tokens=20, stop="wor", stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "Hello "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_include_usage_sends_a_usage_chunk_last(fake_server):
    chunks = list(client(fake_server).completions.create(
        model=MODEL, prompt="abcd", max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 4)


def test_chat_uses_the_chat_template_streaming_and_not(fake_server):
    c = client(fake_server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5)
    assert r.choices[0].message.content == "Hello" and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len("<system>be brief<user>hi<assistant>")
    assert r.choices[0].finish_reason == "length"
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=5, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_content_parts_are_joined(fake_server):
    r = client(fake_server).chat.completions.create(
        model=MODEL, max_tokens=1, messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": "b"}]}])
    assert r.usage.prompt_tokens == len("<user>ab<assistant>")


def test_models_health_and_metrics(fake_server):
    models = client(fake_server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(fake_server.base_url + "/health").json() == {"status": "ok"}
    client(fake_server).completions.create(model=MODEL, prompt="abc", max_tokens=5)
    text = httpx.get(fake_server.base_url + "/metrics").text
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}} 1.0' in text
    assert f'vllm:generation_tokens_total{{model_name="{MODEL}"}} 5.0' in text
    assert f'vllm:prompt_tokens_total{{model_name="{MODEL}"}} 3.0' in text
    assert f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}} 1.0' in text
    assert f'vllm:inter_token_latency_seconds_count{{model_name="{MODEL}"}} 4.0' in text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:e2e_request_latency_seconds", "vllm:prefix_cache_queries_total",
                 "vllm:spec_decode_num_drafts_total"):
        assert name in text


def test_priority_reaches_the_engine_only_with_a_key_or_allow_priority(fake_server):
    body = {"model": MODEL, "prompt": "a", "max_tokens": 1, "priority": -3}
    r = httpx.post(fake_server.base_url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"  # any client would jump the queue
    for kw, headers in (({"allow_priority": True}, {}), ({"api_key": API_KEY}, {"authorization": f"Bearer {API_KEY}"})):
        with serve_in_thread(FakeEngine(), **kw) as running:
            r = httpx.post(running.base_url + "/v1/completions", json=body, headers=headers, timeout=10)
            assert r.status_code == 200 and running.engine.added[-1][1] == -3


def test_a_loopback_server_answers_only_its_own_host_and_json_bodies(fake_server):
    """DNS rebinding: a page from another site reaching 127.0.0.1 under its own name sends its own Host (421); a
    cross-site form or text/plain POST is no JSON (415)."""
    url = fake_server.base_url + "/v1/completions"
    body = {"model": MODEL, "prompt": "a", "max_tokens": 1}
    r = httpx.post(url, json=body, headers={"host": "evil.example:8000"}, timeout=10)
    assert r.status_code == 421 and r.json()["error"]["param"] == "Host"
    assert httpx.get(fake_server.base_url + "/metrics", headers={"host": "evil.example"}).status_code == 421
    for host in ("localhost:1234", "127.0.0.1", "[::1]:80"):
        assert httpx.post(url, json=body, headers={"host": host}, timeout=10).status_code == 200
    import json

    r = httpx.post(url, content=json.dumps(body), headers={"content-type": "text/plain"}, timeout=10)
    assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"
    r = httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_metrics_can_be_kept_behind_the_key():
    with serve_in_thread(FakeEngine(), api_key=API_KEY, protect_metrics=True) as running:
        assert httpx.get(running.base_url + "/metrics").status_code == 401
        ok = httpx.get(running.base_url + "/metrics", headers={"authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200 and "vllm:" in ok.text
    with pytest.raises(ValueError, match="protect_metrics needs an api_key"):
        with serve_in_thread(FakeEngine(), protect_metrics=True):
            pass


def test_api_key_is_required_on_v1_but_not_on_health():
    with serve_in_thread(FakeEngine(), api_key=API_KEY) as running:
        with pytest.raises(openai.AuthenticationError):
            client(running, "wrong").completions.create(model=MODEL, prompt="a", max_tokens=1)
        r = httpx.get(running.base_url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert client(running, API_KEY).completions.create(model=MODEL, prompt="a", max_tokens=2).choices[0].text \
            == "He"
        assert httpx.get(running.base_url + "/health").status_code == 200


def test_spec_decode_counters_reach_usage_and_metrics_when_the_engine_reports_them():
    with serve_in_thread(FakeEngine(speculate=True)) as running:
        r = client(running).completions.create(model=MODEL, prompt="abc", max_tokens=3)
        assert r.usage.model_extra["spec_decode"] == {"num_drafts": 3, "num_draft_tokens": 6, "num_accepted_tokens": 3,
                                                      "num_accepted_tokens_per_pos": [3, 0]}
        text = httpx.get(running.base_url + "/metrics").text
        assert f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL}"}} 3.0' in text
        assert f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL}"}} 6.0' in text
        assert f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL}"}} 3.0' in text
        assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}",position="0"}} 3.0' in text


def test_no_spec_decode_block_without_speculation(fake_server):
    r = client(fake_server).completions.create(model=MODEL, prompt="abc", max_tokens=3)
    assert r.usage.model_extra.get("spec_decode") is None


def test_n_choices_non_streaming_and_streaming(fake_server):
    c = client(fake_server)
    r = c.completions.create(model=MODEL, prompt="abc", max_tokens=3, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2] and {ch.text for ch in r.choices} == {"Hel"}
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 9)
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2,
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    for ch in chunks[:-1]:
        texts[ch.choices[0].index] += ch.choices[0].delta.content or ""
    assert texts == {0: "Hell", 1: "Hell"} and chunks[-1].usage.completion_tokens == 8
    assert fake_server.engine.kv.num_held_blocks() == 0


def test_echo_prepends_the_prompt(fake_server):
    c = client(fake_server)
    assert c.completions.create(model=MODEL, prompt="abc", max_tokens=2, echo=True).choices[0].text == "abcHe"
    chunks = list(c.completions.create(model=MODEL, prompt="abc", max_tokens=2, echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "abcHe"
