"""Prometheus metrics with vLLM's names (so vLLM dashboards work on accel), on a registry owned by the app.

Nothing touches a Prometheus object per step: a step only adds its outputs' token counts and inter-token gaps to
plain Python buffers (`observe_output`), and `render` (a scrape) folds them into the counters and histograms and
sets the gauges from the engine's stats as of that moment. Why: Python after a decode step runs with cold caches
(the step streamed the weights), and per-step gauge, counter and histogram updates cost a measurable share of a
batch-1 step over HTTP (measured between steps in `accel serve`). Counters that the engine keeps
cumulatively (prefix-cache queries / hits, preemptions) are turned into Prometheus counters by adding the
increase since the last scrape. Speculative-decoding counters appear as soon
as the engine reports them on a finished request (`RequestOutput.spec_decode`, see `spec_counters`).
Names without a vLLM equivalent use the `accel:` prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from accel.speculative.stats import SpecDecodeStats

# vLLM's bucket edges (vllm/v1/metrics/loggers.py), so histograms compare bucket by bucket
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


def spec_counters(output) -> SpecDecodeStats | None:
    """A RequestOutput's speculative-decoding counters, or None when it was not verified against drafts."""
    spec = output.spec_decode
    return spec if spec is not None and spec.num_drafts else None


class ServerMetrics:
    """All server metrics on one registry (a fresh one per app: no process-global state)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        r, lab = self.registry, ["model_name"]

        def gauge(name, doc):
            return Gauge(name, doc, lab, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, lab, registry=r).labels(model_name)

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.kv_blocks_held = gauge("accel:kv_blocks_held", "KV blocks referenced by requests (0 when idle).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens served by the prefix cache.")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted (KV blocks taken back).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.rejected = Counter("accel:num_requests_rejected", "Requests refused at admission, by reason.",
                                ["model_name", "reason"], registry=r)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between consecutive tokens.", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to finish.", LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds", "Arrival to first scheduled.", LATENCY_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", "Mean time per output token.", ITL_BUCKETS)
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Speculative-decoding drafts verified.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                             "Accepted draft tokens by position in the draft.",
                                             ["model_name", "position"], registry=r)
        self._last_cumulative = (0, 0, 0)
        # filled per step, folded into the Prometheus objects at a scrape (or when the gap buffer grows long)
        self._new_tokens = 0
        self._gaps: list[float] = []
        self._finished: list = []

    def update_engine(self, num_running: int, num_waiting: int, kv_usage: float, num_held_blocks: int,
                      cumulative: tuple[int, int, int]) -> None:
        """Gauges from the engine's stats; `cumulative` = (prefix queries, prefix hits, preemptions) so far."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)
        self.kv_blocks_held.set(num_held_blocks)
        deltas = [max(0, now - before) for now, before in zip(cumulative, self._last_cumulative)]
        self._last_cumulative = cumulative
        for c, d in zip((self.prefix_queries, self.prefix_hits, self.preemptions), deltas):
            if d:
                c.inc(d)

    def observe_output(self, out) -> None:
        """Feed one RequestOutput (a step's delta for one request): buffered until the next `flush`."""
        n_new = len(out.new_token_ids)
        if n_new:
            self._new_tokens += n_new
            times = out.metrics.token_times
            # the gaps between this step's tokens and the token before them (none before a request's first token)
            end = len(times)
            self._gaps.extend(times[i] - times[i - 1] for i in range(max(1, end - n_new), end))
        if out.finished:
            self._finished.append(out)
        if len(self._gaps) >= 4096 or len(self._finished) >= 256:  # memory stays bounded if nobody scrapes
            self.flush()

    def flush(self) -> None:
        """Fold the buffered outputs into the Prometheus counters and histograms."""
        if self._new_tokens:
            self.generation_tokens.inc(self._new_tokens)
            self._new_tokens = 0
        for gap in self._gaps:
            self.itl.observe(gap)
        self._gaps.clear()
        finished, self._finished = self._finished, []
        for out in finished:
            self._observe_finished(out)

    def _observe_finished(self, out) -> None:
        m = out.metrics
        self.success.labels(self.model_name, out.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        for hist, value in ((self.ttft, m.ttft), (self.e2e, m.e2e_latency), (self.queue_time, m.queue_time),
                            (self.tpot, m.tpot)):
            if value is not None:
                hist.observe(value)
        spec = spec_counters(out)
        if spec is not None:
            self.spec_drafts.inc(spec.num_drafts)
            self.spec_draft_tokens.inc(spec.num_draft_tokens)
            self.spec_accepted.inc(spec.num_accepted_tokens)
            for pos, n in enumerate(spec.num_accepted_tokens_per_pos):
                self.spec_accepted_per_pos.labels(self.model_name, str(pos)).inc(n)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        self.flush()
        return generate_latest(self.registry)
