"""Disconnects, overload, engine failures and shutdown: every request is answered or refused, no block leaks."""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from accel.server.async_engine import AdmissionPolicy, EngineSnapshot, admission_error
from tests.server.conftest import MODEL, serve_in_thread, wait_until
from tests.server.fake_engine import FakeEngine


def body(**kw):
    return {"model": MODEL, "prompt": "a", **kw}


def drained(running) -> bool:
    return (running.engine.kv.num_held_blocks() == 0 and not running.engine.has_unfinished()
            and running.async_engine.num_in_flight == 0)


# ---- admission policy (pure) -----------------------------------------------------------------------------

@pytest.mark.parametrize("snap,accepting,expected", [
    (EngineSnapshot(2, 0, 0.50), True, None),
    (EngineSnapshot(2, 0, 0.99), True, None),  # KV full but nobody waiting: the batch is just busy
    (EngineSnapshot(2, 1, 0.96), True, (429, "kv_pressure")),
    (EngineSnapshot(2, 1, 0.94), True, None),
    (EngineSnapshot(2, 4, 0.10, max_waiting=4), True, (429, "queue_full")),
    (EngineSnapshot(2, 3, 0.10, max_waiting=4), True, None),
    (EngineSnapshot(0, 0, 0.00), False, (503, "shutting_down")),
])
def test_admission_decision(snap, accepting, expected):
    policy = AdmissionPolicy(kv_pressure_threshold=0.95, retry_after_s=2)
    err = admission_error(policy, snap, accepting)
    assert (None if err is None else (err.status, err.reason)) == expected
    if err is not None:
        assert err.retry_after == 2


@pytest.mark.parametrize("kw", [dict(kv_pressure_threshold=0.0), dict(retry_after_s=0)])
def test_admission_policy_rejects_bad_values(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        AdmissionPolicy(**kw)


# ---- disconnects -----------------------------------------------------------------------------------------

def test_streaming_client_disconnect_aborts_and_frees_blocks():
    with serve_in_thread(FakeEngine(step_delay=0.01)) as running:
        with httpx.Client(base_url=running.base_url, timeout=10) as http:
            with http.stream("POST", "/v1/completions", json=body(max_tokens=120, stream=True)) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                assert running.engine.kv.num_held_blocks() > 0
            # leaving the block closes the connection mid-stream
        assert wait_until(lambda: drained(running), timeout=5)
        assert len(running.engine.aborted) == 1
        assert running.engine.num_steps < 120  # stopped early, not run to max_tokens


def test_non_streaming_client_timeout_aborts_and_frees_blocks():
    with serve_in_thread(FakeEngine(step_delay=0.01)) as running:
        with httpx.Client(base_url=running.base_url, timeout=0.3) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/completions", json=body(max_tokens=120))
        assert wait_until(lambda: drained(running), timeout=5)
        assert len(running.engine.aborted) == 1


# ---- overload ---------------------------------------------------------------------------------------------

def test_overload_every_request_answered_or_refused_none_lost():
    n = 40
    with serve_in_thread(FakeEngine(step_delay=0.005, max_num_seqs=2, max_waiting=3)) as running:
        with httpx.Client(base_url=running.base_url, timeout=20,
                          limits=httpx.Limits(max_connections=n)) as http:
            with ThreadPoolExecutor(n) as pool:
                results = list(pool.map(lambda i: http.post("/v1/completions", json=body(max_tokens=10)), range(n)))
        statuses = [r.status_code for r in results]
        assert len(statuses) == n and set(statuses) <= {200, 429}
        assert statuses.count(200) >= 1 and statuses.count(429) >= 1
        for r in results:
            if r.status_code == 200:
                assert r.json()["choices"][0]["text"] == "Hello worl"
            else:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "rate_limit_error"
        assert wait_until(lambda: drained(running), timeout=5)
        metrics = httpx.get(running.base_url + "/metrics").text
        assert (f'accel:num_requests_rejected_total{{model_name="{MODEL}",reason="queue_full"}} '
                f'{float(statuses.count(429))}') in metrics


def test_the_engines_max_waiting_is_the_servers_queue_limit_and_its_own_refusal_a_429_too():
    with serve_in_thread(FakeEngine(max_waiting=0)) as running:  # admission reads the engine's max_waiting
        r = httpx.post(running.base_url + "/v1/completions", json=body(max_tokens=2), timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "0 requests waiting (max_waiting=0)" in r.json()["error"]["message"]
    from accel.runtime.scheduler import QueueFullError

    def full(*args, **kwargs):
        raise QueueFullError("request rejected: the waiting queue is full")

    engine = FakeEngine()
    engine.add_request = full  # the queue filled between admission and add
    with serve_in_thread(engine) as running:
        r = httpx.post(running.base_url + "/v1/completions", json=body(max_tokens=2), timeout=10)
        assert r.status_code == 429 and "waiting queue is full" in r.json()["error"]["message"]


# ---- engine failures --------------------------------------------------------------------------------------

def test_engine_step_failure_is_reported_and_the_loop_survives():
    with serve_in_thread(FakeEngine()) as running:
        with httpx.Client(base_url=running.base_url, timeout=10) as http:
            r = http.post("/v1/completions", json=body(prompt="BOOM", max_tokens=3))
            assert r.status_code == 500
            assert "BOOM" in r.json()["error"]["message"] and r.json()["error"]["type"] == "internal_error"
            r = http.post("/v1/completions", json=body(prompt="BOOM", max_tokens=3, stream=True))
            events = [e for e in r.text.split("\n\n") if e.startswith("data: ")]
            assert "BOOM" in json.loads(events[-2][6:])["error"]["message"] and events[-1] == "data: [DONE]"
            r = http.post("/v1/completions", json=body(max_tokens=3))
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hel"
        assert drained(running)


# ---- shutdown ---------------------------------------------------------------------------------------------

def _stream_in_thread(base_url: str, payload: dict) -> tuple[threading.Thread, list[str]]:
    events: list[str] = []

    def run():
        with httpx.Client(base_url=base_url, timeout=20) as http:
            with http.stream("POST", "/v1/completions", json=payload) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])

    t = threading.Thread(target=run)
    t.start()
    return t, events


def _text(events: list[str]) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and "choices" in e)


def test_shutdown_refuses_new_requests_and_lets_in_flight_finish():
    with serve_in_thread(FakeEngine(step_delay=0.01), drain_timeout_s=10) as running:
        t, events = _stream_in_thread(running.base_url, body(max_tokens=40, stream=True))
        assert wait_until(lambda: len(events) >= 2)
        running.async_engine.begin_shutdown(timeout=10)
        r = httpx.post(running.base_url + "/v1/completions", json=body(max_tokens=2), timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "service_unavailable"
        assert httpx.get(running.base_url + "/health").status_code == 503
        t.join(timeout=10)
        assert not t.is_alive()
        assert _text(events) == ("Hello world" * 4)[:40]
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length" and events[-1] == "[DONE]"
        assert drained(running)


def test_shutdown_deadline_aborts_in_flight_and_tells_them():
    with serve_in_thread(FakeEngine(step_delay=0.02), drain_timeout_s=10) as running:
        t, events = _stream_in_thread(running.base_url, body(max_tokens=120, stream=True))
        assert wait_until(lambda: len(events) >= 2)
        running.async_engine.begin_shutdown(timeout=0.1)
        t.join(timeout=10)
        assert not t.is_alive()
        assert json.loads(events[-2])["error"]["type"] == "service_unavailable" and events[-1] == "[DONE]"
        assert len(_text(events)) < 120
        assert wait_until(lambda: drained(running))


def test_signal_drains_in_flight_then_the_server_stops():
    with serve_in_thread(FakeEngine(step_delay=0.01), drain_timeout_s=10) as running:
        t, events = _stream_in_thread(running.base_url, body(max_tokens=30, stream=True))
        assert wait_until(lambda: len(events) >= 2)
        running.server.handle_exit(signal.SIGINT, None)
        assert not running.async_engine.accepting
        t.join(timeout=15)
        assert _text(events) == ("Hello world" * 3)[:30] and events[-1] == "[DONE]"
        assert wait_until(lambda: not running.async_engine.is_running, timeout=15)
        assert drained(running)


def test_n_choices_are_all_or_none_a_refusal_aborts_the_admitted_ones():
    engine = FakeEngine(max_num_seqs=0, max_waiting=1)  # nothing runs: the first choice waits, the second is refused
    with serve_in_thread(engine) as running:
        r = httpx.post(running.base_url + "/v1/completions", json=body(max_tokens=2, n=2), timeout=10)
        assert r.status_code == 429
        assert wait_until(lambda: not engine.has_unfinished())
        assert len(engine.aborted) == 1 and engine.aborted[0].endswith("-0")


def test_streaming_disconnect_with_n_choices_aborts_them_all():
    with serve_in_thread(FakeEngine(step_delay=0.01)) as running:
        with httpx.Client(base_url=running.base_url, timeout=10) as http:
            with http.stream("POST", "/v1/completions", json=body(max_tokens=120, n=3, stream=True)) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
        assert wait_until(lambda: drained(running), timeout=5)
        assert len(running.engine.aborted) == 3
