"""Latency statistics of a load test: per-request metrics from timestamps, percentiles, throughput, goodput.

Pure functions over `RequestRecord`s (what the client saw); `summarize` turns a run into a `BenchResult`, which
round-trips through JSON (`to_json` / `from_json`).

Definitions (vLLM's `vllm bench serve`), for one request sent at `start`, whose streamed chunks carrying output
text arrive at t_1 <= t_2 <= ... <= t_k and whose stream ends at `end`:

  TTFT         time to first token  = t_1 - start
  E2E latency  end-to-end latency   = end - start
  TPOT         time per output token (excl. the first) = (E2E - TTFT) / (output tokens - 1); only for > 1 token
  ITL          inter-token latency  = the gaps t_{i+1} - t_i between consecutive chunks (a chunk may carry more
               than one token, e.g. with speculative decoding, so ITL is per chunk, as in vLLM)
  queue time   time from arrival at the server/engine to its first scheduling; only when the engine reports it
  throughput   output tokens / duration and completed requests / duration, where duration runs from the first
               measured request's start to the last measured request's end (warm-up excluded)
  goodput      completed requests per second that met every SLO given (TTFT, TPOT, E2E), as in vLLM
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 95, 99)
SCHEMA_VERSION = 1

DEFINITIONS: dict[str, str] = {
    "TTFT": "time to first token: arrival of the first chunk with output text minus the request's send time",
    "TPOT": "time per output token after the first: (E2E latency - TTFT) / (output tokens - 1), "
            "requests with more than one output token only (vLLM's definition)",
    "ITL": "inter-token latency: gaps between consecutive streamed chunks of a request (a chunk may hold "
           "several tokens, e.g. with speculative decoding)",
    "E2E latency": "end of the response stream minus the request's send time",
    "queue time": "time from arrival at the engine to its first scheduling step (reported by the engine; "
                  "n/a for servers that do not report it)",
    "output throughput": "output tokens of completed requests / duration (first measured send to last "
                         "measured end; warm-up requests excluded)",
    "request throughput": "completed requests / duration",
    "goodput": "completed requests per second that met every SLO given (TTFT, TPOT, E2E), as in vLLM",
    "acceptance rate": "num_accepted_tokens / num_draft_tokens (speculative decoding)",
    "mean acceptance length": "1 + num_accepted_tokens / num_drafts (tokens produced per verification step)",
}


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds on one monotonic clock (any origin).

    `chunk_times` are the arrival times of streamed chunks that carried output text/tokens, in order.
    `error` is None for a completed request, else its kind ("http_503", "timeout", "connection",
    "bad_stream", "engine:ValueError", ...).
    """

    request_id: str
    start: float
    end: float
    prompt_tokens: int
    output_tokens: int
    chunk_times: list[float] = field(default_factory=list)
    queue_time: float | None = None
    error: str | None = None
    error_detail: str | None = None
    domain: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class RequestLatency:
    """The latency metrics of one completed request (seconds); None where undefined."""

    ttft: float | None
    tpot: float | None
    e2e: float
    itl: list[float]
    queue_time: float | None
    output_tokens: int


def request_latency(rec: RequestRecord) -> RequestLatency:
    """TTFT, TPOT (vLLM: (e2e - ttft) / (n - 1)), ITLs and E2E of one request from its timestamps."""
    if rec.end < rec.start:
        raise ValueError(f"request {rec.request_id!r}: end {rec.end} is before start {rec.start}")
    times = rec.chunk_times
    ttft = times[0] - rec.start if times else None
    e2e = rec.end - rec.start
    tpot = None
    if ttft is not None and rec.output_tokens > 1:
        tpot = (e2e - ttft) / (rec.output_tokens - 1)
    itl = [b - a for a, b in zip(times, times[1:])]
    return RequestLatency(ttft=ttft, tpot=tpot, e2e=e2e, itl=itl, queue_time=rec.queue_time,
                          output_tokens=rec.output_tokens)


@dataclass
class Dist:
    """Summary of one latency metric in milliseconds: mean, P50/P95/P99 (numpy 'linear'), min, max, count."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty list is undefined; pass at least one value")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} is invalid; allowed: 0..100")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def dist_ms(values_s: list[float]) -> Dist | None:
    """Summarize seconds as milliseconds; None when there are no values."""
    if not values_s:
        return None
    ms = [v * 1000.0 for v in values_s]
    return Dist(n=len(ms), mean=float(np.mean(ms)), p50=percentile(ms, 50), p95=percentile(ms, 95),
                p99=percentile(ms, 99), min=min(ms), max=max(ms))


@dataclass
class SLO:
    """Service-level objectives for goodput, in milliseconds; None = not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"SLO {name}={v!r} is invalid; allowed: None or a positive number of ms")

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def met(self, lat: RequestLatency) -> bool:
        """True when the request meets every SLO set. A TPOT SLO is met trivially by a one-token reply (no TPOT),
        a TTFT SLO is never met without a first token."""
        if self.ttft_ms is not None and (lat.ttft is None or lat.ttft * 1000.0 > self.ttft_ms):
            return False
        if self.tpot_ms is not None and lat.tpot is not None and lat.tpot * 1000.0 > self.tpot_ms:
            return False
        if self.e2e_ms is not None and lat.e2e * 1000.0 > self.e2e_ms:
            return False
        return True


def measured_duration(records: list[RequestRecord]) -> float:
    """Seconds from the first request's start to the last request's end (0 for no records)."""
    if not records:
        return 0.0
    return max(r.end for r in records) - min(r.start for r in records)


def goodput(records: list[RequestRecord], slo: SLO, duration_s: float) -> float:
    """Completed requests per second that met every SLO (vLLM's goodput)."""
    if duration_s <= 0:
        return 0.0
    good = sum(1 for r in records if r.ok and slo.met(request_latency(r)))
    return good / duration_s


@dataclass
class BenchResult:
    """One load-test run: its configuration, counts, throughput, latency distributions and the raw records."""

    config: dict[str, Any]
    num_requests: int
    num_completed: int
    num_errors: int
    errors_by_kind: dict[str, int]
    duration_s: float
    total_prompt_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: Dist | None
    tpot_ms: Dist | None
    itl_ms: Dist | None
    e2e_ms: Dist | None
    queue_time_ms: Dist | None
    slo: SLO | None = None
    goodput: float | None = None
    records: list[RequestRecord] = field(default_factory=list)
    machine: dict[str, Any] | None = None  # accel.report.machine_info() of the machine that ran the load
    repeats: list[float] | None = None  # output tokens/s of every run of the same requests; this one is the median
    load: list[dict] | None = None  # per run, what else used the machine (accel.bench.probes.CpuLoad.to_dict())
    definitions: dict[str, str] = field(default_factory=lambda: dict(DEFINITIONS))
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchResult:
        d = dict(d)
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_time_ms"):
            d[k] = Dist(**d[k]) if d.get(k) is not None else None
        d["slo"] = SLO(**d["slo"]) if d.get("slo") is not None else None
        d["records"] = [RequestRecord(**r) for r in d.get("records", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        return cls.from_dict(json.loads(text))

    def latencies(self) -> list[RequestLatency]:
        """Per-request metrics of the completed requests (for CDFs)."""
        return [request_latency(r) for r in self.records if r.ok]


def summarize(records: list[RequestRecord], config: dict[str, Any] | None = None, slo: SLO | None = None,
              keep_records: bool = True) -> BenchResult:
    """Aggregate measured (non-warm-up) requests into a BenchResult."""
    ok = [r for r in records if r.ok]
    lats = [request_latency(r) for r in ok]
    duration = measured_duration(records)
    errors = Counter(r.error for r in records if not r.ok)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    slo = slo if slo is not None and slo.is_set else None
    return BenchResult(
        config=dict(config or {}), num_requests=len(records), num_completed=len(ok), num_errors=len(records) - len(ok),
        errors_by_kind=dict(sorted(errors.items())), duration_s=duration,
        total_prompt_tokens=in_tokens, total_output_tokens=out_tokens,
        request_throughput=per_s(len(ok)), output_throughput=per_s(out_tokens),
        total_token_throughput=per_s(in_tokens + out_tokens),
        ttft_ms=dist_ms([x.ttft for x in lats if x.ttft is not None]),
        tpot_ms=dist_ms([x.tpot for x in lats if x.tpot is not None]),
        itl_ms=dist_ms([g for x in lats for g in x.itl]),
        e2e_ms=dist_ms([x.e2e for x in lats]),
        queue_time_ms=dist_ms([x.queue_time for x in lats if x.queue_time is not None]),
        slo=slo, goodput=goodput(records, slo, duration) if slo is not None else None,
        records=list(records) if keep_records else [])


@dataclass
class SweepResult:
    """Throughput vs load: one BenchResult per concurrency (or rate), and the knee if one was found."""

    points: list[BenchResult]
    knee_index: int | None
    knee_rule: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepResult:
        return cls(points=[BenchResult.from_dict(p) for p in d["points"]], knee_index=d["knee_index"],
                   knee_rule=d["knee_rule"])


def find_knee(throughputs: list[float], p99_ttfts: list[float | None], min_gain: float = 0.10) -> int | None:
    """Index of the knee of a throughput-vs-load curve (points in increasing load).

    The knee is the last point worth its load: point i such that going to point i+1 gains less than `min_gain`
    (relative) throughput while P99 TTFT grows. None when every step still pays off (the sweep did not saturate).
    """
    if len(throughputs) != len(p99_ttfts):
        raise ValueError(f"got {len(throughputs)} throughputs and {len(p99_ttfts)} P99 TTFTs; they must pair up")
    for i in range(len(throughputs) - 1):
        a, b = throughputs[i], throughputs[i + 1]
        gain = (b - a) / a if a > 0 else math.inf
        ta, tb = p99_ttfts[i], p99_ttfts[i + 1]
        ttft_grows = ta is not None and tb is not None and tb > ta
        if gain < min_gain and ttft_grows:
            return i
    return None


def throughput_spread(values: list[float]) -> float:
    """(max - min) / mean of repeated throughput measurements: the run-to-run spread (0.05 = 5%)."""
    if len(values) < 2:
        raise ValueError(f"a spread needs at least two measurements, got {len(values)}")
    mean = sum(values) / len(values)
    if mean <= 0:
        raise ValueError(f"throughputs {values} have a non-positive mean; the spread is undefined")
    return (max(values) - min(values)) / mean
