"""The load generator behind `accel bench`: send a workload to a backend, measure every streamed response.

Arrivals (seeded):
  fixed concurrency  N requests in flight at any time (a new one starts when one ends); concurrency=None with
                     no rate sends everything at once (offline)
  poisson            gaps between sends ~ Exponential(1 / rate)
  gamma              gaps ~ Gamma(shape=burstiness, scale=1 / (rate * burstiness)): same mean rate, burstier
                     traffic for burstiness < 1 (vLLM's --burstiness); a rate may be capped by a concurrency
Warm-up requests run first, at the same load, and are not measured. A sweep runs the same workload at several
concurrencies (or rates) and finds the knee of throughput vs load (`latency.find_knee`).

Entry points for the CLI: `bench(...)` (flat arguments, builds the backend and the workload) and `run_bench` /
`run_sweep` (a backend and a `BenchConfig`).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accel.bench.backends import Backend, BenchError, InProcessBackend, OpenAIBackend, clock
from accel.bench.latency import (SLO, BenchResult, RequestRecord, SweepResult, find_knee, summarize)
from accel.bench.workload import BenchRequest, Workload, build_requests
from accel.report.environment import machine_info

ARRIVALS = ("poisson", "gamma")
KNEE_RULE = "last load level before one that gains < 10% output throughput while P99 TTFT grows"


@dataclass
class BenchConfig:
    """How to load the backend. `concurrency` and `request_rate` may both be set (rate with a cap)."""

    workload: Workload = field(default_factory=Workload)
    concurrency: int | None = None
    request_rate: float | None = None  # req/s; None = send as fast as the concurrency allows
    arrival: str = "poisson"
    burstiness: float = 1.0
    warmup: int = 2
    slo: SLO = field(default_factory=SLO)
    timeout_s: float = 600.0  # per request
    keep_records: bool = True

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} is invalid; allowed: None or an integer >= 1")
        if self.request_rate is not None and not (self.request_rate > 0 and math.isfinite(self.request_rate)):
            raise ValueError(f"request_rate={self.request_rate} is invalid; allowed: None or a finite number > 0")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival={self.arrival!r} is invalid; allowed: {', '.join(ARRIVALS)}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness={self.burstiness} is invalid; allowed: a number > 0")
        if self.arrival == "poisson" and self.burstiness != 1.0:
            raise ValueError(f"burstiness={self.burstiness} needs arrival='gamma' (poisson is burstiness 1)")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} is invalid; allowed: an integer >= 0")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s} is invalid; allowed: a number of seconds > 0")


def bench_config_from_recipe(wc, warmup: int = 2, slo: SLO | None = None, timeout_s: float = 600.0) -> BenchConfig:
    """A BenchConfig from the recipe's `eval.workloads[i]` (accel.recipe.WorkloadConfig): its concurrency or
    Poisson rate (neither = everything at once), lengths and seed."""
    return BenchConfig(workload=Workload.from_config(wc), concurrency=wc.concurrency, request_rate=wc.request_rate,
                       arrival="poisson", warmup=warmup, slo=slo or SLO(), timeout_s=timeout_s)


def arrival_offsets(n: int, rate: float | None, arrival: str = "poisson", burstiness: float = 1.0,
                    seed: int = 0) -> list[float]:
    """Send times (seconds after the start) of n requests; all zero without a rate. The first is at 0."""
    if rate is None:
        return [0.0] * n
    rng = np.random.default_rng(seed)
    shape = 1.0 if arrival == "poisson" else burstiness  # Exponential(1/rate) == Gamma(1, 1/rate)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    return [0.0] + [float(x) for x in np.cumsum(gaps[:-1])] if n else []


async def measure(backend: Backend, req: BenchRequest, timeout_s: float) -> RequestRecord:
    """Send one request and time its stream; failures become a record with an error kind."""
    start = clock()
    times: list[float] = []
    seen = {"chunk_tokens": 0, "usage_out": None, "usage_in": None, "queue_time": None}
    error = detail = None

    async def consume() -> None:
        async for c in backend.stream(req):
            if c.num_tokens is not None:
                has_tokens = c.num_tokens > 0
            else:
                has_tokens = c.carries_token if c.carries_token is not None else bool(c.text)
            if has_tokens:
                times.append(c.t)
                seen["chunk_tokens"] += c.num_tokens if c.num_tokens is not None else 1
            for key, v in (("usage_out", c.completion_tokens), ("usage_in", c.prompt_tokens),
                           ("queue_time", c.queue_time)):
                if v is not None:
                    seen[key] = v

    try:
        await asyncio.wait_for(consume(), timeout_s)  # wait_for, not asyncio.timeout: Python 3.10 support
    except BenchError as e:
        error, detail = e.kind, e.detail
    except asyncio.TimeoutError:
        error, detail = "timeout", f"no complete response within {timeout_s} s"
    except Exception as e:  # a client-side bug must not kill the whole run; it is counted by kind
        error, detail = f"client:{type(e).__name__}", str(e)
    end = clock()
    out_tokens = seen["usage_out"] if seen["usage_out"] is not None else seen["chunk_tokens"]
    if error is None and out_tokens == 0:
        error, detail = "empty_response", "the stream finished without any output token"
    return RequestRecord(request_id=req.request_id, start=start, end=end,
                         prompt_tokens=seen["usage_in"] if seen["usage_in"] is not None else req.prompt_tokens,
                         output_tokens=out_tokens, chunk_times=times, queue_time=seen["queue_time"], error=error,
                         error_detail=detail, domain=req.domain)


async def _drive(backend: Backend, reqs: list[BenchRequest], cfg: BenchConfig, seed: int, on_done) -> list:
    """Send `reqs` at the configured load; returns their records in request order."""
    offsets = arrival_offsets(len(reqs), cfg.request_rate, cfg.arrival, cfg.burstiness, seed)
    limit = cfg.concurrency or len(reqs) or 1
    sem = asyncio.Semaphore(limit)  # FIFO wake-up, so fixed concurrency = N workers over the queue
    t0 = clock()

    async def one(i: int) -> RequestRecord:
        delay = t0 + offsets[i] - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            rec = await measure(backend, reqs[i], cfg.timeout_s)
        on_done(rec)
        return rec

    return list(await asyncio.gather(*(one(i) for i in range(len(reqs)))))


async def arun_bench(backend: Backend, cfg: BenchConfig, requests: list[BenchRequest] | None = None,
                     progress: bool = True) -> BenchResult:
    """Async `run_bench`: start the backend, warm up, measure, close."""
    source = {"tokenizer": backend.tokenizer, "vocab_size": getattr(backend, "vocab_size", None)}
    if requests is None:
        requests = build_requests(cfg.workload, **source)
    warm = build_requests(Workload(name="warmup", num_requests=cfg.warmup, prompt_tokens=cfg.workload.prompt_tokens,
                                   output_tokens=cfg.workload.output_tokens, seed=cfg.workload.seed + 1),
                          **source) if cfg.warmup else []
    await backend.start()
    try:
        with _Progress(progress, len(requests), len(warm)) as bar:
            if warm:
                await _drive(backend, warm, cfg, cfg.workload.seed + 1, bar.warm_done)
            bar.start_measuring()
            records = await _drive(backend, requests, cfg, cfg.workload.seed, bar.done)
    finally:
        await backend.close()
    config = {**_config_dict(cfg), **backend.describe(), "num_warmup": len(warm)}
    result = summarize(records, config=config, slo=cfg.slo, keep_records=cfg.keep_records)
    result.machine = machine_info()
    return result


def run_bench(backend: Backend, cfg: BenchConfig, requests: list[BenchRequest] | None = None,
              progress: bool = True) -> BenchResult:
    """Run one load test (blocking). `requests` overrides the workload (e.g. a hand-made list)."""
    return run_client(arun_bench(backend, cfg, requests, progress))


def run_client(coro):
    """Run the client's coroutine on uvloop where it is installed: the client shares the CPU with the server it
    measures, and uvloop's C event loop spends less CPU per streamed token."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_sweep(backend: Backend, cfg: BenchConfig, concurrencies: list[int] | None = None,
              rates: list[float] | None = None, requests: list[BenchRequest] | None = None,
              progress: bool = True, min_gain: float = 0.10) -> SweepResult:
    """The same workload at each concurrency (or rate), in increasing load, and the knee of the curve."""
    if (concurrencies is None) == (rates is None):
        raise ValueError("give exactly one of concurrencies=[...] or rates=[...] to sweep over")
    levels = sorted(concurrencies if concurrencies is not None else rates)
    if not levels:
        raise ValueError("the sweep needs at least one concurrency or rate")
    points = []
    for level in levels:
        kw = {"concurrency": int(level)} if concurrencies is not None else {"request_rate": float(level)}
        point_cfg = BenchConfig(**{**_shallow(cfg), **kw})
        points.append(run_bench(backend, point_cfg, requests, progress))
    knee = find_knee([p.output_throughput for p in points],
                     [p.ttft_ms.p99 if p.ttft_ms else None for p in points], min_gain)
    return SweepResult(points=points, knee_index=knee, knee_rule=KNEE_RULE.replace("10%", f"{min_gain:.0%}"))


def open_backend(url: str | None = None, model: str | None = None, engine=None, api_key: str | None = None,
                 endpoint: str = "completions", tokenizer: str | None = None, timeout_s: float = 600.0,
                 **engine_kwargs) -> Backend:
    """A backend from CLI-style arguments: `url` -> OpenAIBackend(url, model); else `engine`, else an in-process
    engine loaded from `model` (a registry name or an HF folder). `tokenizer` (a path or name) lets an HTTP
    benchmark cut prompts of exact token counts."""
    if url is not None:
        tok = None
        if tokenizer is not None:
            from accel.tokenizer import load_tokenizer

            tok = load_tokenizer(_resolve(tokenizer))
        return OpenAIBackend(url, model or "", api_key=api_key, endpoint=endpoint, timeout_s=timeout_s, tokenizer=tok)
    if engine is None:
        if model is None:
            raise ValueError("give url=... (an OpenAI-compatible server) or model=... (run the engine in-process)")
        from accel.runtime.engine import Engine

        engine = Engine.from_pretrained(_resolve(model), **engine_kwargs)
    return InProcessBackend(engine)


def bench(url: str | None = None, model: str | None = None, concurrency: int | None = None,
          rate: float | None = None, arrival: str = "poisson", burstiness: float = 1.0, num_requests: int = 32,
          prompt_tokens: tuple[int, int] = (16, 1024), output_tokens: tuple[int, int] = (16, 256), warmup: int = 2,
          slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None, seed: int = 0,
          sweep: list[int] | None = None, out: str | Path | None = None, api_key: str | None = None,
          endpoint: str = "completions", tokenizer: str | None = None, timeout_s: float = 600.0,
          progress: bool = True) -> BenchResult | SweepResult:
    """`accel bench` with flat arguments: one run, or a sweep over `sweep` concurrencies; writes `out` as JSON."""
    backend = open_backend(url=url, model=model, api_key=api_key, endpoint=endpoint, tokenizer=tokenizer,
                           timeout_s=timeout_s)
    cfg = BenchConfig(workload=Workload(num_requests=num_requests, prompt_tokens=tuple(prompt_tokens),
                                        output_tokens=tuple(output_tokens), seed=seed),
                      concurrency=concurrency, request_rate=rate, arrival=arrival, burstiness=burstiness,
                      warmup=warmup, slo=SLO(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms), timeout_s=timeout_s)
    result = run_sweep(backend, cfg, concurrencies=sweep, progress=progress) if sweep else \
        run_bench(backend, cfg, progress=progress)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(result.to_json())
    return result


def _resolve(name: str) -> str:
    if Path(name).exists():
        return name
    from accel.hub import resolve_model

    return str(resolve_model(name))


def _shallow(cfg: BenchConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["workload"]["prompt_tokens"] = list(cfg.workload.prompt_tokens)
    d["workload"]["output_tokens"] = list(cfg.workload.output_tokens)
    return d


class _Progress:
    """A rich progress bar (requests done, errors, output tokens/s so far); a no-op when disabled."""

    def __init__(self, enabled: bool, total: int, warm_total: int) -> None:
        self.enabled = enabled
        self.total = total
        self.warm_total = warm_total
        self.errors = 0
        self.tokens = 0
        self.t0 = clock()

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
            self._p.__enter__()
            self._task = self._p.add_task("warm-up" if self.warm_total else "bench",
                                          total=self.warm_total or self.total, info="")
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._p.__exit__(*exc)

    def warm_done(self, rec: RequestRecord) -> None:
        if self.enabled:
            self._p.advance(self._task)

    def start_measuring(self) -> None:
        self.t0 = clock()
        if self.enabled:
            self._p.reset(self._task, total=self.total, description="bench", info="")

    def done(self, rec: RequestRecord) -> None:
        self.errors += not rec.ok
        self.tokens += rec.output_tokens if rec.ok else 0
        if self.enabled:
            rate = self.tokens / max(clock() - self.t0, 1e-9)
            self._p.update(self._task, advance=1, info=f"{rate:.1f} tok/s, {self.errors} errors")
