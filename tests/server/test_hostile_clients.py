"""Careless or hostile clients against a real uvicorn server over the real engine (tiny random model): every bad
request is answered on its own, and never ends, stalls or corrupts another request."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from accel.runtime.engine import Engine
from accel.runtime.sampler import Sampler
from accel.server.app import MAX_BODY_BYTES
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread, wait_until
from tests.server.fake_engine import FakeEngine

MAGIC_SEED = 4242  # a request whose sampling fails inside the engine (a broken logits processor, say)
C, CHAT = "/v1/completions", "/v1/chat/completions"


class FailingSampler(Sampler):
    def __call__(self, logits, params, *args, **kwargs):
        if any(p.seed == MAGIC_SEED for p in params):
            raise RuntimeError("this request's logits processor failed")
        return super().__call__(logits, params, *args, **kwargs)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("hostile") / "tiny", max_position_embeddings=256)
    # one step at a time: bursts of steps finish a tiny model's 48-token streams before a test can see them run
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=16, max_model_len=256, num_scheduler_steps=1)
    engine.runner.sampler = FailingSampler()
    with serve_in_thread(engine, model_name="tiny") as running:
        yield running


def body(**kw):
    return {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 4, **kw}


def stream_text(base_url: str, payload: dict, results: list, i: int) -> None:
    """Run one streaming completion; results[i] = (finish_reason, text, usage tokens, error or None)."""
    text, finish, error = "", None, None
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", C, json={**payload, "stream": True,
                                          "stream_options": {"include_usage": True}}) as r:
            usage = None
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    error = ev["error"]
                    continue
                if ev.get("usage"):
                    usage = ev["usage"]["completion_tokens"]
                for ch in ev["choices"]:
                    text += ch["text"]
                    finish = ch["finish_reason"] or finish
    results[i] = (finish, text, usage, error)


def start_streams(base_url: str, n: int, max_tokens: int = 48):
    results = [None] * n
    threads = [threading.Thread(target=stream_text, args=(base_url, body(max_tokens=max_tokens, temperature=0,
                                                                         ignore_eos=True), results, i))
               for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


@pytest.mark.parametrize("seed,n", [(2**64, 1), (-(2**63) - 1, 1), (10**30, 1), (2**63 - 1, 2)])
def test_out_of_range_seed_is_a_400_naming_seed(tiny, seed, n):
    r = httpx.post(tiny.base_url + C, json=body(seed=seed, n=n, temperature=1.0), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "seed" and "allowed: an integer in [-9223372036854775808" in err["message"]


def test_an_engine_failure_of_one_request_ends_only_that_request(tiny):
    threads, results = start_streams(tiny.base_url, 3)
    assert wait_until(lambda: tiny.engine.has_unfinished(), 10)
    r = httpx.post(tiny.base_url + C, json=body(seed=MAGIC_SEED, temperature=1.0), timeout=30)
    assert r.status_code == 500 and "this request failed" in r.json()["error"]["message"]
    bad = [None]
    stream_text(tiny.base_url, body(seed=MAGIC_SEED, temperature=1.0), bad, 0)
    assert bad[0][3] is not None and "this request failed" in bad[0][3]["message"]
    for t in threads:
        t.join(60)
    assert [res[0] for res in results] == ["length"] * 3 and [res[2] for res in results] == [48] * 3
    assert len({res[1] for res in results}) == 1  # greedy: all three read the same text
    assert all(res[3] is None for res in results)
    assert wait_until(lambda: tiny.engine.kv.num_held_blocks() == 0, 10)


def test_tiny_temperature_is_greedy_and_an_underflowing_penalty_is_a_400(tiny):
    greedy = httpx.post(tiny.base_url + C, json=body(temperature=0, ignore_eos=True, max_tokens=8), timeout=30)
    for t in (1e-300, 5e-324):
        r = httpx.post(tiny.base_url + C, json=body(temperature=t, ignore_eos=True, max_tokens=8), timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    r = httpx.post(tiny.base_url + C, json=body(repetition_penalty=1e-300), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty"


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(tiny):
    prompt = "word " * 780_000  # 3.9 MB: far more characters than 256 tokens can spell
    t0 = time.perf_counter()
    r = httpx.post(tiny.base_url + C, json=body(prompt=prompt), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "characters" in r.text
    assert time.perf_counter() - t0 < 2.0
    r = httpx.post(tiny.base_url + CHAT, json={"model": "tiny", "messages": [{"role": "user", "content": prompt}]},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_tokenizing_runs_off_the_event_loop(tiny, monkeypatch):
    tok = tiny.async_engine.tokenizer
    encode = tok.encode

    def slow_encode(text, *a, **kw):
        if "SLOW" in text:
            time.sleep(2.0)  # stands in for megabytes of text (the Rust tokenizer releases the GIL)
        return encode(text, *a, **kw)

    monkeypatch.setattr(tok, "encode", slow_encode)
    t = threading.Thread(target=httpx.post, args=(tiny.base_url + C,), kwargs={"json": body(prompt="SLOW"),
                                                                              "timeout": 30})
    t.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    assert httpx.get(tiny.base_url + "/health", timeout=10).status_code == 200
    assert time.perf_counter() - t0 < 0.5
    t.join(30)


def _raw(port: int, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head)
    return s


def test_a_half_sent_body_is_answered_408_and_holds_nothing():
    """A client that sends headers and part of its body, then nothing, gets a 408 once the body timeout passes (a
    short one here: the client never sends the rest, so the outcome does not depend on the machine's speed)."""
    with serve_in_thread(FakeEngine(), body_timeout_s=0.3) as running:
        port = int(running.base_url.rsplit(":", 1)[1])
        s = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 100\r\n\r\n{\"model\": ")
        reply = s.recv(65536)
        s.close()
        assert reply.startswith(b"HTTP/1.1 408") and b"timeout_error" in reply, reply[:300]
        assert httpx.get(running.base_url + "/health", timeout=10).status_code == 200


def test_a_chunked_body_over_the_cap_is_refused_while_it_streams_in(tiny):
    port = int(tiny.base_url.rsplit(":", 1)[1])
    s = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * (1 << 20)
    for _ in range(MAX_BODY_BYTES // len(chunk) + 1):  # just past the cap, and never the terminating chunk
        s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    reply = s.recv(65536)
    s.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_a_client_gone_mid_upload_is_one_info_line(tiny, caplog):
    port = int(tiny.base_url.rsplit(":", 1)[1])
    with caplog.at_level(logging.INFO):
        s = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 100000\r\n\r\n{\"model\": ")
        time.sleep(0.2)
        s.close()
        assert wait_until(lambda: any("client disconnected" in r.getMessage() for r in caplog.records), 5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    assert httpx.get(tiny.base_url + "/health", timeout=10).status_code == 200


def test_draining_answers_503_with_retry_after_while_in_flight_requests_finish():
    with serve_in_thread(FakeEngine(step_delay=0.02), drain_timeout_s=10) as running:
        results = [None]
        t = threading.Thread(target=stream_text, args=(running.base_url, {"model": "fake-model", "prompt": "x",
                                                                          "max_tokens": 100}, results, 0))
        t.start()
        assert wait_until(lambda: running.async_engine.num_in_flight == 1, 10)
        running.server.handle_exit(signal.SIGTERM, None)
        time.sleep(0.3)  # uvicorn has begun its shutdown
        r = httpx.post(running.base_url + C, json={"model": "fake-model", "prompt": "x"}, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "service_unavailable"
        assert httpx.get(running.base_url + "/health", timeout=10).status_code == 503
        t.join(30)
        assert results[0][0] == "length" and results[0][2] == 100


def test_docs_and_schema_need_the_key_when_one_is_set():
    with serve_in_thread(FakeEngine(), api_key="sk-k") as running:
        for path in ("/docs", "/redoc"):
            assert httpx.get(running.base_url + path, timeout=10).status_code == 404
        assert httpx.get(running.base_url + "/openapi.json", timeout=10).status_code == 401
        r = httpx.get(running.base_url + "/openapi.json", headers={"Authorization": "Bearer sk-k"}, timeout=10)
        assert r.status_code == 200 and "/v1/completions" in r.json()["paths"]
    with serve_in_thread(FakeEngine()) as running:
        assert httpx.get(running.base_url + "/docs", timeout=10).status_code == 200
        assert httpx.get(running.base_url + "/openapi.json", timeout=10).status_code == 200


def test_the_openai_client_sees_the_same_errors(tiny):
    c = openai.OpenAI(base_url=tiny.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model="tiny", prompt="hi", max_tokens=2, seed=2**64)
    assert ei.value.body["param"] == "seed"
    r = c.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=1e-300)
    assert r.choices[0].finish_reason in ("length", "stop")


def _bad_requests(base_url: str) -> list[int]:
    """One of each kind of bad request; returns their statuses (None for the ones that send no full request)."""
    port = int(base_url.rsplit(":", 1)[1])
    with httpx.Client(base_url=base_url, timeout=30) as http:
        statuses = [http.post(C, json=body(seed=s, temperature=1.0)).status_code
                    for s in (2**64, -(2**63) - 1, 10**30)]
        statuses.append(http.post(C, json=body(seed=2**63 - 1, n=2, temperature=1.0)).status_code)
        statuses.append(http.post(C, json=body(temperature=1e-300)).status_code)
        statuses.append(http.post(C, json=body(repetition_penalty=1e-300)).status_code)
        statuses.append(http.post(C, json=body(prompt="word " * 780_000)).status_code)
        statuses.append(http.post(C, json=body(seed=MAGIC_SEED, temperature=1.0)).status_code)  # fails in the engine
        statuses.append(http.post(C, json=body(stop_token_ids=[10**6], min_tokens=2)).status_code)
        statuses.append(http.post(C, content=b'{"model": "tiny", "prompt": "\xff\xfe"}',
                                        headers={"content-type": "application/json"}).status_code)
    s = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * (1 << 20)
    for _ in range(MAX_BODY_BYTES // len(chunk) + 1):
        s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    statuses.append(int(s.recv(64).split()[1]))
    s.close()
    s = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n{\"mo")
    s.close()
    return statuses


def test_streams_in_flight_finish_normally_while_every_kind_of_bad_request_arrives(tiny, monkeypatch):
    ref = [None]
    stream_text(tiny.base_url, body(max_tokens=200, temperature=0, ignore_eos=True), ref, 0)
    step = tiny.engine.step

    def slow_step():  # >= 1 s for 200 tokens, so the streams are still running when the bad requests arrive
        time.sleep(0.005)
        return step()

    monkeypatch.setattr(tiny.engine, "step", slow_step)
    # one token per step: the bad requests are served between steps (each step holds the event loop), so the streams
    # must take many steps
    monkeypatch.setattr(tiny.engine.config, "num_scheduler_steps", 1)
    threads, results = start_streams(tiny.base_url, 4, max_tokens=200)
    assert wait_until(lambda: tiny.async_engine.num_in_flight == 4, 10)
    statuses = _bad_requests(tiny.base_url)
    still_running = tiny.async_engine.num_in_flight
    for t in threads:
        t.join(120)
    assert statuses == [400, 400, 400, 400, 200, 400, 400, 500, 400, 400, 413], statuses
    assert still_running >= 1, "the streams ended before the bad requests arrived; make them longer"
    assert all(res == ref[0] for res in results), (results, ref)
    assert ref[0][0] == "length" and ref[0][2] == 200
    assert wait_until(lambda: tiny.engine.kv.num_held_blocks() == 0 and tiny.async_engine.num_in_flight == 0, 10)
