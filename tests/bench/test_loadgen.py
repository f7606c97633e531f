"""Workloads, arrivals and the load generator against a fake OpenAI server and the in-process engine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import numpy as np
import pytest
from fastapi import Request  # module level: FastAPI resolves the string annotation of the endpoint from here

from accel.bench.backends import OpenAIBackend
from accel.bench.latency import SLO
from accel.bench.loadgen import BenchConfig, arrival_offsets, run_bench, run_sweep
from accel.bench.workload import LONG_START, BenchRequest, Workload, build_requests, long_tail_lengths


# ---- workload -----------------------------------------------------------------------------------------
class CharTokenizer:
    """One token per character: makes exact token counts checkable without a real tokenizer."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 512 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_workload_is_deterministic_and_seeded():
    w = Workload(num_requests=50, prompt_tokens=(8, 512), output_tokens=(4, 64), seed=3)
    a, b = build_requests(w), build_requests(w)
    assert a == b
    c = build_requests(Workload(num_requests=50, prompt_tokens=(8, 512), output_tokens=(4, 64), seed=4))
    assert [r.prompt_tokens for r in a] != [r.prompt_tokens for r in c]


def test_long_tail_lengths_shape():
    lo, hi, n = 16, 1024, 400
    lens = long_tail_lengths(n, lo, hi, 0.05, np.random.default_rng(0))
    split = lo + LONG_START * (hi - lo)
    assert all(lo <= x <= hi for x in lens)
    assert sum(x >= split for x in lens) == 20  # exactly 5% long
    assert np.median(lens) < (lo + hi) / 4  # log-uniform body: most requests are short
    assert long_tail_lengths(5, 7, 7, 0.5, np.random.default_rng(0)) == [7] * 5


def test_prompts_have_exact_token_counts_with_a_tokenizer():
    texts = [("prose", "the quick brown fox jumps over the lazy dog"), ("code", "def f(x): return x")]
    reqs = build_requests(Workload(num_requests=20, prompt_tokens=(5, 200), output_tokens=(3, 3)),
                          tokenizer=CharTokenizer(), texts=texts)
    for r in reqs:
        assert len(r.prompt_token_ids) == r.prompt_tokens and len(r.prompt) == r.prompt_tokens
        assert r.domain in ("prose", "code") and r.max_tokens == 3


def test_random_token_prompts_stay_in_vocab():
    reqs = build_requests(Workload(num_requests=10, prompt_tokens=(4, 32), output_tokens=(2, 4)), vocab_size=100)
    assert all(len(r.prompt_token_ids) == r.prompt_tokens for r in reqs)
    assert all(3 <= t < 100 for r in reqs for t in r.prompt_token_ids)


@pytest.mark.parametrize("kw,match", [({"num_requests": 0}, "num_requests=0"),
                                      ({"prompt_tokens": (10, 5)}, r"prompt_tokens=\(10, 5\)"),
                                      ({"long_fraction": 1.5}, "long_fraction=1.5")])
def test_bad_workload_is_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        Workload(**kw)


def test_bench_config_from_recipe_workload():
    from accel.bench.loadgen import bench_config_from_recipe
    from accel.recipe import WorkloadConfig

    wc = WorkloadConfig(name="batch16", num_requests=32, prompt_tokens=(16, 512), output_tokens=(16, 128),
                        concurrency=16, seed=5)
    cfg = bench_config_from_recipe(wc, warmup=1)
    assert cfg.concurrency == 16 and cfg.request_rate is None and cfg.warmup == 1
    assert cfg.workload == Workload(name="batch16", num_requests=32, prompt_tokens=(16, 512),
                                    output_tokens=(16, 128), seed=5)
    rated = bench_config_from_recipe(WorkloadConfig(name="r", request_rate=2.5))
    assert rated.request_rate == 2.5 and rated.concurrency is None


# ---- arrivals -----------------------------------------------------------------------------------------
def test_arrivals():
    assert arrival_offsets(3, None) == [0.0, 0.0, 0.0]
    p = arrival_offsets(4000, 10.0, "poisson", seed=1)
    assert p[0] == 0.0 and p == arrival_offsets(4000, 10.0, "poisson", seed=1)
    gaps = np.diff(p)
    assert abs(gaps.mean() - 0.1) < 0.01 and abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential: CV 1
    g = np.diff(arrival_offsets(4000, 10.0, "gamma", burstiness=0.25, seed=1))
    assert abs(g.mean() - 0.1) < 0.015 and g.std() / g.mean() > 1.7  # CV = 1/sqrt(0.25) = 2


@pytest.mark.parametrize("kw,match", [({"arrival": "uniform"}, "arrival='uniform'"),
                                      ({"concurrency": 0}, "concurrency=0"),
                                      ({"request_rate": -1.0}, "request_rate=-1.0"),
                                      ({"burstiness": 0.5}, "needs arrival='gamma'")])
def test_bad_bench_config_is_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kw)


# ---- a fake OpenAI-compatible server ------------------------------------------------------------------
class FakeServer:
    """Streams `max_tokens` one-token chunks (10 ms apart) plus a usage chunk. The prompt picks a failure:
    'fail' -> HTTP 503, 'bad' -> a non-JSON event, 'cut' -> no [DONE], 'slow' -> waits 3 s before answering."""

    def __init__(self):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, StreamingResponse

        self.bodies: list[dict] = []
        self.inflight = 0
        self.max_inflight = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)

            async def gen():
                for i in range(body["max_tokens"]):
                    await asyncio.sleep(0.01)
                    yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': f'c{i}'}}]})}\n\n"
                yield "data: [DONE]\n\n"  # no usage block: tokens are counted from the chunks

            return StreamingResponse(gen(), media_type="text/event-stream")

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            prompt = body["prompt"]
            if prompt == "fail":
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)

            async def gen():
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
                try:
                    if prompt == "slow":
                        await asyncio.sleep(3.0)
                    for i in range(body["max_tokens"]):
                        await asyncio.sleep(0.01)
                        text = "" if prompt == "empty" else f"t{i} "
                        choice = {"index": 0, "text": text, "finish_reason": None}
                        yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                        if prompt == "bad":
                            yield "data: {not json\n\n"
                            return
                    if prompt == "cut":
                        return
                    closing = {"index": 0, "text": "", "finish_reason": "length"}  # not a token
                    yield f"data: {json.dumps({'choices': [closing]})}\n\n"
                    usage = {"prompt_tokens": 7, "completion_tokens": body["max_tokens"]}
                    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    self.inflight -= 1

            return StreamingResponse(gen(), media_type="text/event-stream")

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def fake_server():
    with FakeServer() as s:
        yield s


def req(i, prompt="ok", n=5):
    return BenchRequest(request_id=f"r{i}", prompt=prompt, prompt_token_ids=None, prompt_tokens=3, max_tokens=n)


def test_loadgen_against_fake_server_counts_errors_by_kind(fake_server):
    reqs = [req(i) for i in range(6)] + [req(6, "fail"), req(7, "bad"), req(8, "cut"), req(9, "slow")]
    cfg = BenchConfig(concurrency=3, warmup=0, timeout_s=1.0, slo=SLO(ttft_ms=2000))
    r = run_bench(OpenAIBackend(fake_server.url, "fake"), cfg, requests=reqs, progress=False)
    assert r.num_completed == 6
    assert r.errors_by_kind == {"bad_stream": 2, "http_503": 1, "timeout": 1}
    by_id = {x.request_id: x for x in r.records}
    assert by_id["r0"].output_tokens == 5 and by_id["r0"].prompt_tokens == 7  # from the usage block
    assert len(by_id["r0"].chunk_times) == 5
    assert r.ttft_ms.min >= 10.0 and r.tpot_ms.min >= 5.0  # 10 ms between chunks on the server
    assert r.goodput == pytest.approx(6 / r.duration_s)
    assert fake_server.max_inflight <= 3
    body = fake_server.bodies[0]
    assert body["ignore_eos"] is True and body["stream"] is True and body["max_tokens"] == 5
    assert r.config["concurrency"] == 3 and r.config["backend"] == "openai"


def test_fixed_concurrency_is_held_and_warmup_is_excluded(fake_server):
    cfg = BenchConfig(workload=Workload(num_requests=8, prompt_tokens=(4, 8), output_tokens=(3, 3)),
                      concurrency=2, warmup=2)
    r = run_bench(OpenAIBackend(fake_server.url, "fake"), cfg, progress=True)
    assert len(fake_server.bodies) == 10  # 2 warm-up + 8 measured
    assert r.num_requests == 8 and r.num_completed == 8 and r.config["num_warmup"] == 2
    assert fake_server.max_inflight == 2
    assert r.total_output_tokens == 24


def test_empty_text_chunks_count_as_tokens_but_the_closing_chunk_does_not(fake_server):
    r = run_bench(OpenAIBackend(fake_server.url, "fake"), BenchConfig(concurrency=1, warmup=0),
                  requests=[req(0, "empty", n=4), req(1, "ok", n=3)], progress=False)
    assert [len(x.chunk_times) for x in r.records] == [4, 3]
    assert [x.output_tokens for x in r.records] == [4, 3]


def test_chat_endpoint_counts_tokens_from_chunks(fake_server):
    r = run_bench(OpenAIBackend(fake_server.url, "fake", endpoint="chat"), BenchConfig(concurrency=2, warmup=0),
                  requests=[req(0, "hi", n=4), req(1, "hi", n=6)], progress=False)
    assert [x.output_tokens for x in r.records] == [4, 6] and r.num_errors == 0
    assert fake_server.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]
    assert r.machine is not None and r.machine["cpu_count"] >= 1  # every result records its machine


def test_connection_error_is_counted():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_bench(OpenAIBackend(f"http://127.0.0.1:{port}", "m"), BenchConfig(concurrency=1, warmup=0),
                  requests=[req(0)], progress=False)
    assert r.errors_by_kind == {"connection": 1} and r.num_completed == 0


def test_sse_events_take_the_arrival_time_of_the_piece_that_completes_them():
    from accel.bench.backends import _sse_events

    parts = [(1.0, b'data: {"a"'), (2.0, b': 1}\n\n: a comment\n'), (3.0, b"event: x\ndata: [DONE]\n\n")]
    assert list(_sse_events(parts)) == [(2.0, b'{"a": 1}'), (3.0, b"[DONE]")]


def test_the_url_path_prefix_and_api_key_reach_the_request_line():
    b = OpenAIBackend("http://example.org:8080/proxy/v1/", "m", api_key="k", endpoint="chat")
    raw = b._request_bytes("/v1/chat/completions", {"x": 1})
    head, body = raw.split(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /proxy/v1/chat/completions HTTP/1.1" and "Host: example.org:8080" in lines
    assert "Authorization: Bearer k" in lines and f"Content-Length: {len(body)}" in lines and json.loads(body) == {"x": 1}


def test_sweep_runs_each_concurrency_on_the_same_requests(fake_server):
    reqs = [req(i, n=4) for i in range(4)]
    s = run_sweep(OpenAIBackend(fake_server.url, "fake"), BenchConfig(warmup=0), concurrencies=[2, 1],
                  requests=reqs, progress=False)
    assert [p.config["concurrency"] for p in s.points] == [1, 2]
    assert all(p.num_completed == 4 for p in s.points)
    with pytest.raises(ValueError, match="exactly one"):
        run_sweep(OpenAIBackend(fake_server.url, "fake"), BenchConfig(), requests=reqs)


def test_rate_limited_arrivals_spread_the_sends(fake_server):
    reqs = [req(i, n=1) for i in range(5)]
    cfg = BenchConfig(request_rate=20.0, warmup=0)  # mean gap 50 ms -> about 200 ms for 5 requests
    r = run_bench(OpenAIBackend(fake_server.url, "fake"), cfg, requests=reqs, progress=False)
    starts = sorted(x.start for x in r.records)
    expected = arrival_offsets(5, 20.0, seed=0)
    assert starts[-1] - starts[0] >= expected[-1] - 0.005


# ---- in-process engine ----------------------------------------------------------------------------------
def test_in_process_engine_bench(tmp_path):
    from accel.bench.backends import InProcessBackend
    from accel.runtime.engine import Engine
    from tests.conftest import make_tiny_llama

    make_tiny_llama().save_pretrained(tmp_path)
    engine = Engine.from_pretrained(tmp_path, num_kv_blocks=128, block_size=16)
    cfg = BenchConfig(workload=Workload(num_requests=6, prompt_tokens=(4, 40), output_tokens=(3, 9)),
                      concurrency=3, warmup=1)
    r = run_bench(InProcessBackend(engine), cfg, progress=False)
    planned = build_requests(cfg.workload, vocab_size=256)
    assert r.num_completed == 6 and r.errors_by_kind == {}
    assert [x.output_tokens for x in r.records] == [p.max_tokens for p in planned]  # ignore_eos: exact lengths
    assert [x.prompt_tokens for x in r.records] == [p.prompt_tokens for p in planned]
    assert r.queue_time_ms is not None and r.queue_time_ms.n == 6
    assert not engine.has_unfinished()


def test_repeated_in_process_runs_do_not_share_the_prefix_cache(tmp_path):
    from accel.bench.backends import InProcessBackend
    from accel.runtime.engine import Engine
    from tests.conftest import make_tiny_llama

    make_tiny_llama().save_pretrained(tmp_path)
    engine = Engine.from_pretrained(tmp_path, num_kv_blocks=64, block_size=4, enable_prefix_caching=True)
    cfg = BenchConfig(workload=Workload(num_requests=3, prompt_tokens=(20, 30), output_tokens=(2, 2)),
                      concurrency=1, warmup=0)
    for reset, hits in ((True, 0), (False, 1)):
        engine.kv.num_hit_tokens = 0
        for _ in range(2):
            run_bench(InProcessBackend(engine, reset_prefix_cache=reset), cfg, progress=False)
        assert (engine.kv.num_hit_tokens > 0) == bool(hits)


@pytest.mark.integration
def test_in_process_bench_on_the_real_model(real_model_path):
    from accel.bench.backends import InProcessBackend
    from accel.runtime.engine import Engine

    engine = Engine.from_pretrained(real_model_path, num_kv_blocks=64, block_size=16)
    cfg = BenchConfig(workload=Workload(num_requests=2, prompt_tokens=(16, 40), output_tokens=(4, 6)),
                      concurrency=2, warmup=0)
    r = run_bench(InProcessBackend(engine), cfg, progress=False)
    planned = build_requests(cfg.workload, tokenizer=engine.tokenizer)
    assert r.errors_by_kind == {} and r.num_completed == 2
    assert [x.prompt_tokens for x in r.records] == [p.prompt_tokens for p in planned]  # exact token windows
    assert [x.output_tokens for x in r.records] == [p.max_tokens for p in planned]  # ignore_eos
    assert all(p.prompt.strip() and p.domain for p in planned)  # real text from the project's data, with its domain


def test_the_client_runs_on_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")
    from accel.bench.loadgen import run_client

    async def loop_module():
        return type(asyncio.get_running_loop()).__module__

    assert run_client(loop_module()).startswith("uvloop")
