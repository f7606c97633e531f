"""Benchmark the OpenAI-compatible server against the in-process engine at the same concurrency.

    .venv/bin/python scripts/bench_server.py [--model smollm2-135m] [--concurrency 64] [--duration 60]
                                             [--max-tokens 64] [--skip-in-process] [--json out.json]

Both phases run a closed loop: `concurrency` clients, each sending its next request as soon as the previous one
ends, for `duration` seconds, then the in-flight requests drain. Requests are completions over varied prompts
(from calibration_data/), with `ignore_eos` so every request generates exactly `max_tokens` tokens in both
phases. Phase 1 drives `Engine` directly in this process; phase 2 starts `accel.server` in a subprocess on
127.0.0.1 and drives it with streaming httpx clients. Printed: TTFT P50/P99, output tokens/s, 5xx / 429 /
transport-error counts, KV blocks still held after drain (from /metrics), and server / in-process tok/s.
TTFT in-process is engine arrival -> first token; over HTTP it is request sent -> first streamed text.

--structured: every request's output follows SCHEMA (a JSON object of string notes, which a model may extend to
max_tokens; at least 64 notes, so it runs to max_tokens): in-process through SamplingParams.structured, over HTTP
as chat completions with a json_schema `response_format`; compare with a run under --chat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from accel.runtime.config import RUNTIME_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
          "required": ["notes"], "additionalProperties": False}


def load_prompts(n: int = 256) -> list[str]:
    """Varied prompts (all domains of calibration_data/), each cut to at most 400 characters."""
    prompts: list[str] = []
    for f in sorted((ROOT / "calibration_data").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            text = rec.get("text") or rec.get("prompt") or ""
            if text:
                prompts.append(text[:400])
    if not prompts:
        prompts = [f"Write a short note about topic number {i}." for i in range(n)]
    step = max(1, len(prompts) // n)
    return prompts[::step][:n]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def engine_kwargs(args) -> dict:
    kw = dict(max_num_seqs=args.concurrency, max_num_batched_tokens=args.max_num_batched_tokens)
    if args.num_threads:
        kw["num_threads"] = args.num_threads
    return kw


# ---- phase 1: in-process ----------------------------------------------------------------------------------

def bench_in_process(args, prompts: list[str]) -> dict:
    from accel.hub import resolve_model
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    engine = Engine.from_pretrained(resolve_model(args.model), **engine_kwargs(args))
    from accel.runtime.sampling_params import StructuredOutput

    structured = StructuredOutput(json_schema=json.dumps(SCHEMA)) if args.structured else None
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, structured=structured)
    engine.generate(prompts[:2], params)  # warm-up
    ttfts: list[float] = []
    tokens = 0
    i = 0
    start = time.monotonic()
    deadline = start + args.duration
    for _ in range(args.concurrency):
        engine.add_request(prompts[i % len(prompts)], params)
        i += 1
    while engine.has_unfinished():
        for out in engine.step():
            if not out.finished:
                continue
            tokens += len(out.token_ids)
            if out.metrics.ttft is not None:
                ttfts.append(out.metrics.ttft)
            if time.monotonic() < deadline:
                engine.add_request(prompts[i % len(prompts)], params)
                i += 1
    elapsed = time.monotonic() - start
    return dict(requests=len(ttfts), tokens=tokens, elapsed_s=elapsed, tok_per_s=tokens / elapsed,
                ttft_p50=pct(ttfts, 50), ttft_p99=pct(ttfts, 99), blocks_held_after=engine.kv.num_held_blocks())


# ---- phase 2: server --------------------------------------------------------------------------------------

def start_server(args, port: int) -> subprocess.Popen:
    code = ("import json,sys; from accel.server.config import ServerConfig; from accel.server.serve import run_server; "
            "run_server(sys.argv[1], ServerConfig(port=int(sys.argv[2]), log_level='warning'), max_waiting=100000, "
            "**json.loads(sys.argv[3]))")
    return subprocess.Popen([sys.executable, "-c", code, args.model, str(port), json.dumps(engine_kwargs(args))],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode}")
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the server was not healthy within {timeout} s")


async def client_loop(http: httpx.AsyncClient, args, prompts: list[str], worker: int, deadline: float,
                      res: dict) -> None:
    i = worker
    while time.monotonic() < deadline:
        payload = {"model": args.model, "prompt": prompts[i % len(prompts)], "max_tokens": args.max_tokens,
                   "temperature": 0.0, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}
        route = "/v1/completions"
        if args.chat or args.structured:
            payload["messages"] = [{"role": "user", "content": payload.pop("prompt")}]
            route = "/v1/chat/completions"
        if args.structured:
            payload["response_format"] = {"type": "json_schema", "json_schema": {"name": "notes", "schema": SCHEMA}}
        i += args.concurrency
        sent = time.monotonic()
        first = None
        try:
            async with http.stream("POST", route, json=payload) as r:
                if r.status_code != 200:
                    await r.aread()
                    res["status"][r.status_code] = res["status"].get(r.status_code, 0) + 1
                    if r.status_code == 429:
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        res["stream_errors"] += 1
                    elif ev.get("usage"):
                        res["tokens"] += ev["usage"]["completion_tokens"]
                    elif first is None and ev["choices"] and (ev["choices"][0].get("text") or
                                                              ev["choices"][0].get("delta", {}).get("content")):
                        first = time.monotonic()
                res["status"][200] = res["status"].get(200, 0) + 1
                if first is not None:
                    res["ttfts"].append(first - sent)
        except httpx.TransportError:
            res["transport_errors"] += 1


def scrape(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


async def bench_server_async(args, prompts: list[str]) -> dict:
    from accel.server.serve import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(args, port)
    try:
        await wait_healthy(base, proc)
        limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency + 8)
        async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(300, connect=30), limits=limits) as http:
            warm = {"model": args.model, "prompt": prompts[0], "max_tokens": args.max_tokens, "temperature": 0.0}
            await http.post("/v1/completions", json=warm)
            res = {"status": {}, "ttfts": [], "tokens": 0, "stream_errors": 0, "transport_errors": 0}
            start = time.monotonic()
            await asyncio.gather(*(client_loop(http, args, prompts, w, start + args.duration, res)
                                   for w in range(args.concurrency)))
            elapsed = time.monotonic() - start
            await asyncio.sleep(0.5)  # let the engine thread publish its idle stats
            metrics = (await http.get("/metrics")).text
        n5xx = sum(v for k, v in res["status"].items() if k >= 500)
        return dict(requests=res["status"].get(200, 0), tokens=res["tokens"], elapsed_s=elapsed,
                    tok_per_s=res["tokens"] / elapsed, ttft_p50=pct(res["ttfts"], 50), ttft_p99=pct(res["ttfts"], 99),
                    status_counts={str(k): v for k, v in res["status"].items()}, num_5xx=n5xx,
                    num_429=res["status"].get(429, 0), stream_errors=res["stream_errors"],
                    transport_errors=res["transport_errors"],
                    blocks_held_after=scrape(metrics, "accel:kv_blocks_held"),
                    running_after=scrape(metrics, "vllm:num_requests_running"),
                    waiting_after=scrape(metrics, "vllm:num_requests_waiting"))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=RUNTIME_DEFAULTS["max_num_batched_tokens"])
    ap.add_argument("--num-threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--structured", action="store_true", help="every output follows SCHEMA (see the docstring)")
    ap.add_argument("--chat", action="store_true", help="HTTP requests as chat completions (--structured's route)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    prompts = load_prompts()
    results = {"config": {k: str(v) for k, v in vars(args).items()}}
    from accel.bench.ledger import Entry, flat_figures

    key = f"server-{Path(args.model).name}" + "".join(f"-{f}" for f in ("structured", "chat") if getattr(args, f))
    with Entry(key, bandwidth_threads=args.num_threads or None) as entry:
        if not args.skip_in_process:
            results["in_process"] = bench_in_process(args, prompts)
            print_phase("in-process", results["in_process"])
        from accel.bench.loadgen import run_client

        results["server"] = run_client(bench_server_async(args, prompts))
        print_phase("server", results["server"])
        if "in_process" in results:
            ratio = results["server"]["tok_per_s"] / results["in_process"]["tok_per_s"]
            results["server_over_in_process"] = ratio
            print(f"server / in-process tokens/s: {ratio:.3f}  (server overhead {100 * (1 - ratio):.1f}%)")
        entry.info = {"model": args.model, "concurrency": args.concurrency, "duration_s": args.duration,
                      "max_tokens": args.max_tokens, "num_threads": args.num_threads, "structured": args.structured,
                      "chat": args.chat}
        # a metric the server did not report reads NaN: no figure
        entry.figures = {k: f for k, f in flat_figures({k: v for k, v in results.items() if k != "config"}).items()
                         if not math.isnan(f["median"])}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def print_phase(name: str, r: dict) -> None:
    extra = ""
    if "num_5xx" in r:
        extra = (f"  5xx={r['num_5xx']} 429={r['num_429']} stream_errors={r['stream_errors']} "
                 f"transport_errors={r['transport_errors']}")
    print(f"[{name}] requests={r['requests']} tokens={r['tokens']} in {r['elapsed_s']:.1f}s -> "
          f"{r['tok_per_s']:.1f} tok/s; TTFT P50={r['ttft_p50'] * 1000:.0f} ms P99={r['ttft_p99'] * 1000:.0f} ms; "
          f"blocks held after drain={r['blocks_held_after']}{extra}", flush=True)


if __name__ == "__main__":
    main()
