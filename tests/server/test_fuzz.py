"""Fuzz the OpenAI endpoints with a seeded generator of malformed requests against a real server over a tiny model.

Every request must be answered (no dropped connection), with a 2xx or an OpenAI-shaped 4xx, never a 5xx nor an
error event inside a 200 stream; afterwards the server is healthy, holds no KV block and still gives the same
greedy text. `malformed_requests(seed, n)` is reusable: run more of them with `ACCEL_FUZZ_N=5000 pytest ...`.
"""

from __future__ import annotations

import collections
import json
import os
import random

import httpx
import pytest

from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from accel.server.app import MAX_BODY_BYTES
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread, wait_until

C, CHAT = "/v1/completions", "/v1/chat/completions"
NUM_REQUESTS = int(os.environ.get("ACCEL_FUZZ_N", "300"))

BIG_INTS = [2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -10**30, 10**400]
FLOATS = [1e308, -1e308, 1e-300, 5e-324, -5e-324, 0.0, -0.0, 1e-6, 2.0000001, 1e5]
# non-standard JSON literals and escapes, inserted as raw text
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", '"\\ud800"', '"\\u0000"', '"a\\u0000b"',
              '"\\udfff\\ud800"', "1.5e-400", "00012", "-", "[]", "{}", "null", "true", '"\\""']
STRINGS = ["", " ", "\x00", "a\x00b", "\u202e\u202d", "\U0001f600" * 50, "x" * 100_000, "<|im_end|>" * 20,
           "\ufeff", "\n" * 1000, "ok"]
FIELDS = {
    C: ["model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stop", "seed", "echo",
        "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
        "stop_token_ids", "priority", "logprobs", "stream_options", "user", "best_of", "suffix"],
    CHAT: ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
           "stop", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty",
           "ignore_eos", "min_tokens", "stop_token_ids", "priority", "logprobs", "top_logprobs", "stream_options"],
}


def _valid(route: str, rng: random.Random) -> dict:
    base = {"model": "tiny", "max_tokens": rng.randint(1, 4), "stream": rng.random() < 0.3}
    if route == C:
        return {**base, "prompt": rng.choice(["The quick brown fox", [5, 6, 7], ["a b c"], [[9, 10]]])}
    return {**base, "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def _wrong_value(rng: random.Random):
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(BIG_INTS)
    if kind == 1:
        return rng.choice(FLOATS)
    if kind == 2:
        return rng.choice(STRINGS)
    if kind == 3:
        return [rng.choice(BIG_INTS + FLOATS + STRINGS) for _ in range(rng.randint(0, 40))]
    if kind == 4:
        return {rng.choice(STRINGS)[:20]: rng.choice(BIG_INTS)}
    if kind == 5:
        return rng.choice([True, False, None])
    if kind == 6:
        return rng.randint(-5, 70)
    return [[[["deep"]]]]


def _messages(rng: random.Random):
    role = rng.choice(["user", "system", "assistant", "tool", "developer", "robot", "", 5, None])
    content = rng.choice([_wrong_value(rng), [{"type": "text", "text": rng.choice(STRINGS)}],
                          [{"type": "image_url", "image_url": {"url": "x"}}], "hi"])
    return [{"role": role, "content": content}] * rng.randint(0, 3)


def malformed_requests(seed: int, n: int):
    """n (route, body bytes) pairs; a seeded mix of wrong types, extreme numbers, unicode/NUL, invalid UTF-8,
    non-standard JSON, truncated/garbage/nested/oversized bodies, and odd but valid requests."""
    rng = random.Random(seed)
    for _ in range(n):
        route = rng.choice([C, CHAT])
        req = _valid(route, rng)
        kind = rng.randrange(10)
        if kind <= 3:  # one to three fields given wrong or extreme values
            for field in rng.sample(FIELDS[route], rng.randint(1, 3)):
                req[field] = _messages(rng) if field == "messages" and rng.random() < 0.5 else _wrong_value(rng)
            yield route, json.dumps(req).encode()
        elif kind == 4:  # a non-standard literal or escape as some field's raw text
            field = rng.choice(FIELDS[route])
            text = json.dumps({**req, field: "@@"}).replace('"@@"', rng.choice(RAW_VALUES))
            yield route, text.encode()
        elif kind == 5:  # invalid UTF-8 inside a string value
            junk = bytes(rng.choice([0x80, 0xC0, 0xFF, 0xFE, 0xED]) for _ in range(rng.randint(1, 6)))
            yield route, json.dumps({**req, "stop": "@@"}).encode().replace(b"@@", junk)
        elif kind == 6:  # truncated, garbage, not an object, empty
            full = json.dumps(req).encode()
            yield route, rng.choice([full[: rng.randrange(len(full))], bytes(rng.randrange(256) for _ in range(64)),
                                     b"[1, 2]", b"", b"null", b'"str"', b"{" * 10])
        elif kind == 7:  # deeply nested
            depth = rng.choice([100, 1000, 20000])
            yield route, json.dumps(req).encode()[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
        elif kind == 8:  # oversized (sometimes just over the cap)
            size = rng.choice([MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 4096])
            yield route, json.dumps({**req, "user": "u" * size}).encode()
        else:  # odd but valid: extreme-but-allowed sampling, many stops, n > 1, seeds at the range ends
            req.update(temperature=rng.choice([0, 1e-300, 1e-5, 2.0]), top_p=rng.choice([1e-30, 0.5, 1.0]),
                       top_k=rng.choice([-1, 0, 1, 10**6]), min_p=rng.choice([0.0, 1e-30, 1.0]),
                       repetition_penalty=rng.choice([0.01, 1.0, 10.0]), n=rng.randint(1, 3),
                       seed=rng.choice([None, -(2**63), 2**63 - 3]), stop=["a" * 1024, "\x00", "\U0001f600"],
                       stop_token_ids=rng.choice([[], [0, 1, 2], [319]]), min_tokens=rng.randint(0, 1),
                       presence_penalty=rng.choice([-2, 2]), priority=rng.choice([-(2**62), 0, 2**62]))
            yield route, json.dumps(req).encode()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny", max_position_embeddings=256)
    engine = Engine.from_pretrained(path, num_kv_blocks=256, block_size=16, max_model_len=256, max_waiting=512)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    expected = engine.generate("The quick brown fox", greedy)[0].text  # before the server owns the engine
    with serve_in_thread(engine, model_name="tiny") as running:
        running.expected_text = expected
        yield running


def _check_answer(r: httpx.Response, body: bytes) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300], body[:300])
    if r.status_code >= 400:
        if r.status_code == 499:  # never for a client that stays connected
            raise AssertionError(body[:300])
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "data: [DONE]", r.text[-300:]
        assert not any('"error"' in e[:20] for e in events), (r.text[:500], body[:300])


def test_fuzzed_requests_never_5xx_nor_drop_and_the_server_stays_healthy(tiny, capsys):
    statuses: collections.Counter = collections.Counter()
    with httpx.Client(base_url=tiny.base_url, timeout=60) as http:
        for route, body in malformed_requests(seed=1234, n=NUM_REQUESTS):
            r = http.post(route, content=body, headers={"content-type": "application/json"})
            _check_answer(r, body)
            statuses[r.status_code] += 1
        assert http.get("/health").status_code == 200
        ok = http.post(C, json={"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0,
                                "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == tiny.expected_text
    assert wait_until(lambda: tiny.engine.kv.num_held_blocks() == 0 and tiny.async_engine.num_in_flight == 0, 10)
    assert sum(statuses.values()) == NUM_REQUESTS and statuses[200] > 0 and statuses[400] > 0
    with capsys.disabled():
        print(f"\nfuzz: {NUM_REQUESTS} requests, statuses {dict(sorted(statuses.items()))}")
