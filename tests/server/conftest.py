"""Fixtures: a real uvicorn server on 127.0.0.1 (ephemeral port) in a thread, over a fake or a real engine."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import pytest

from accel.server.async_engine import AdmissionPolicy, AsyncEngine
from accel.server.serve import free_port, make_server
from tests.server.fake_engine import FakeEngine

MODEL = "fake-model"
API_KEY = "sk-test-123"


@dataclass
class Running:
    base_url: str
    async_engine: AsyncEngine
    engine: object
    server: object


@contextlib.contextmanager
def serve_in_thread(engine, model_name: str = MODEL, kv_pressure_threshold: float = 1.0,
                    drain_timeout_s: float = 5.0, **kwargs):
    """Run uvicorn over `engine` in a thread; yields once it accepts connections, stops it (bounded) after."""
    async_engine = AsyncEngine(engine, AdmissionPolicy(kv_pressure_threshold=kv_pressure_threshold))
    port = free_port()
    server = make_server(async_engine, model_name, port=port, drain_timeout_s=drain_timeout_s, **kwargs)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start within 20 s")
        time.sleep(0.01)
    try:
        yield Running(f"http://127.0.0.1:{port}", async_engine, engine, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server thread did not stop"


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll `predicate` until true or `timeout` seconds passed (bounded); returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@pytest.fixture
def fake_server():
    with serve_in_thread(FakeEngine()) as running:
        yield running
