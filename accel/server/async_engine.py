"""AsyncEngine: a task on the serving event loop steps the (synchronous) Engine; handlers consume per-request streams.

    HTTP handler (event loop)                        engine task (same event loop, same thread)
    -------------------------                        -----------------------------------------
    add(): admission check, engine.add_request  ──►  step() ─► outputs ─► queue.put_nowait(out) per stream
           async for out in queue  ◄───────────────  await asyncio.sleep(0): the consumers send, then the next step
    client gone / generator closed ── abort ──────►  engine.abort(id) before the next step: blocks freed

Why the loop's own thread and not an engine thread: a step keeps every core busy (its thread team), so the
loop's per-token work cannot overlap it anyway, and handing each step's outputs to another thread cost two
cross-core wake-ups per token; stepping in the loop measured faster over HTTP at batch 1 (paired, per request;
docs/DESIGN.md, Server). The price: the loop answers nothing during a step (at most one step: a decode step, a
prefill chunk at worst). Tokenizing stays on its own thread. torch's OpenMP pool belongs to the thread that
first runs parallel work, so the engine is built on the thread that runs the loop (a second pool made batch-1
steps markedly slower).

Failure policy: add_request errors go back to the one caller (ValueError -> 400, QueueFullError -> 429). A
failure tied to one request (its sampling, verification, detokenization, stop strings) is contained by the
engine: that request finishes with reason "error" and only its stream gets the error. If step() itself raises
(the batch's forward pass), the engine's state for the batch is unknown, so every request inside the engine is
aborted (blocks freed) and told with an error; the loop itself keeps serving new requests.

Shutdown: `begin_shutdown(timeout)` stops admission (503) at once; in-flight requests run on until `timeout`,
then are aborted and told; `shutdown()` waits for that and stops the task.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from accel.runtime.config import RUNTIME_DEFAULTS
from accel.runtime.engine import MAX_BURST_S
from accel.runtime.sampling_params import SamplingParams
from accel.server.metrics import ServerMetrics

log = logging.getLogger("accel.server")


class AdmissionError(Exception):
    """The server refuses a request now (429 overload, 503 shutting down); retry after `retry_after` seconds."""

    def __init__(self, status: int, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class RequestFailed(Exception):
    """A request that was admitted but could not finish (engine error, server shutdown)."""

    def __init__(self, message: str, status: int = 500, type: str = "internal_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type


@dataclass
class AdmissionPolicy:
    """When the server answers 429 instead of queueing (beyond the engine's own `max_waiting`, `RuntimeConfig`).

    kv_pressure_threshold: refuse when KV usage is at least this AND requests are already waiting: the pool is
      the bottleneck, and more waiting requests would only wait longer or preempt running ones.
    """

    kv_pressure_threshold: float = 0.95
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.kv_pressure_threshold <= 1.0:
            raise ValueError(f"kv_pressure_threshold={self.kv_pressure_threshold} is invalid; allowed: (0, 1]")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s={self.retry_after_s} is invalid; allowed: an integer >= 1")


@dataclass
class EngineSnapshot:
    """The engine's counts, read when admission or /metrics asks (on the loop's thread, between steps)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_held_blocks: int = 0
    max_waiting: int = RUNTIME_DEFAULTS["max_waiting"]
    """The engine's `RuntimeConfig.max_waiting`."""


def admission_error(policy: AdmissionPolicy, snap: EngineSnapshot, accepting: bool) -> AdmissionError | None:
    """The admission decision (pure): None to admit, else the 503 / 429 to answer."""
    if not accepting:
        return AdmissionError(503, "shutting_down", "the server is shutting down and accepts no new requests",
                              policy.retry_after_s)
    queued = snap.num_waiting
    if queued >= snap.max_waiting:
        return AdmissionError(429, "queue_full", f"the server is overloaded: {queued} requests waiting "
                              f"(max_waiting={snap.max_waiting}); retry later", policy.retry_after_s)
    if snap.kv_cache_usage >= policy.kv_pressure_threshold and queued > 0:
        return AdmissionError(429, "kv_pressure", f"the server is overloaded: KV cache {snap.kv_cache_usage:.0%} "
                              f"full with {queued} requests waiting; retry later", policy.retry_after_s)
    return None


MAX_UNREAD_OUTPUTS = 4096
"""Outputs (about tokens) a stream may hold unread: a client that reads nothing has its request cancelled, not its
generation run on with every output buffered."""


class RequestStream:
    """The outputs of one admitted request; iterate it once. Leaving the loop early aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str, queue: asyncio.Queue) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue = queue
        self.finished = False

    async def __aiter__(self) -> AsyncIterator:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
                if self.finished:
                    return
        finally:
            if not self.finished:
                self._engine.abort(self.request_id)

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


def max_model_len(engine) -> int:
    """The engine's context length (prompt + output tokens of one request)."""
    n = getattr(engine, "max_model_len", None)
    if n is None:
        n = engine.scheduler.config.max_model_len
    return int(n)


def _cumulative_counters(engine, stats) -> tuple[int, int, int]:
    """(prefix-cache queried tokens, hit tokens, preemptions) so far; zeros where the engine has none."""
    kv = getattr(engine, "kv", None)
    return (int(getattr(kv, "num_queried_tokens", 0)), int(getattr(kv, "num_hit_tokens", 0)),
            int(getattr(stats, "num_preemptions", 0)))


def _held_blocks(engine) -> int:
    kv = getattr(engine, "kv", None)
    return kv.num_held_blocks() if kv is not None and hasattr(kv, "num_held_blocks") else 0


class AsyncEngine:
    def __init__(self, engine, policy: AdmissionPolicy | None = None, metrics: ServerMetrics | None = None,
                 idle_wait_s: float = 0.05, max_unread: int | None = None) -> None:
        """engine: an Engine built on the thread that will run the event loop (see the module docstring).
        max_unread: outputs a stream may hold unread before its request is cancelled (MAX_UNREAD_OUTPUTS)."""
        self.engine = engine
        self.max_unread = MAX_UNREAD_OUTPUTS if max_unread is None else max_unread
        # the loop answers nothing while a step runs: bursts of steps are kept short for arrivals and streams
        engine.max_burst_s = MAX_BURST_S
        self.policy = policy or AdmissionPolicy()
        self.metrics = metrics
        self.max_model_len = max_model_len(engine)
        # a private tokenizer copy for the tokenizer thread: HF fast tokenizers may raise "Already borrowed" when
        # one object is used from two threads, and the engine detokenizes with the original
        self.tokenizer = copy.deepcopy(engine.tokenizer) if engine.tokenizer is not None else None
        self.snapshot = EngineSnapshot()
        self._idle_wait_s = idle_wait_s
        self._aborts: queue.SimpleQueue = queue.SimpleQueue()  # abort() may come from any thread
        self._streams: dict[str, asyncio.Queue] = {}
        self._accepting = True
        self._drain_deadline: float | None = None
        self._stop = False
        self._closed = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe; takes effect before the engine's next step)."""
        self._aborts.put(request_id)
        self._wake()

    def _wake(self) -> None:
        loop, wakeup = self._loop, self._wakeup
        if loop is None or wakeup is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wakeup.set()
        else:
            loop.call_soon_threadsafe(wakeup.set)

    # ---- the engine task -------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stop:
            try:
                self._drain_aborts()
                self._enforce_drain_deadline()
                if not self.engine.has_unfinished():
                    self._wakeup.clear()
                    if self._aborts.empty() and not self._stop:
                        try:
                            await asyncio.wait_for(self._wakeup.wait(), self._idle_wait_s)
                        except TimeoutError:
                            pass
                    continue
                self._step_once()
            except Exception:  # noqa: BLE001 - the loop must never die; _step_once already told the requests
                log.exception("engine loop iteration failed; continuing")
            # Two turns of the loop before the next step: in the first, the consumers woken by this step send their
            # outputs and wait on their queues again; in the second, a client's disconnect can land. Starlette
            # cancels a stream whose client left through anyio, which skips a task whose wait has already been
            # answered: with one turn, every retry found the next output already put and the stream never ended.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        self._closed = True
        self._drain_aborts()
        self._fail_all(RequestFailed("the server stopped before this request finished", 503, "service_unavailable"))

    def _step_once(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            log.exception("engine.step() raised; aborting the requests in the engine")
            self._fail_all(RequestFailed(f"the engine failed while running this request: {type(e).__name__}: {e}"))
            return
        for out in outputs:
            if self.metrics is not None:
                self.metrics.observe_output(out)
            stream = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
            if stream is not None and not out.finished and stream.qsize() >= self.max_unread:
                # its client reads nothing (a stream blocked on a full socket): generation stops, buffering too
                self.engine.abort(out.request_id)
                self._streams.pop(out.request_id, None)
                stream.put_nowait(RequestFailed(f"the client read none of this request's last {self.max_unread} "
                                                "outputs; it was cancelled", 408, "timeout_error"))
            elif stream is not None:
                stream.put_nowait(out if getattr(out, "error", None) is None else RequestFailed(
                    f"this request failed in the engine and was ended (other requests were not affected): "
                    f"{out.error}"))

    def _drain_aborts(self) -> None:
        while True:
            try:
                request_id = self._aborts.get_nowait()
            except queue.Empty:
                return
            self.engine.abort(request_id)
            self._streams.pop(request_id, None)

    def _fail_all(self, error: RequestFailed) -> None:
        for rid in list(self._streams):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001
                log.exception("abort(%s) failed", rid)
            self._streams.pop(rid).put_nowait(error)

    def _enforce_drain_deadline(self) -> None:
        if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline and self._streams:
            self._fail_all(RequestFailed("the server is shutting down; this request was aborted before it "
                                         "finished", 503, "service_unavailable"))

    def refresh(self) -> EngineSnapshot:
        """Read the engine's counts now (the loop's thread only: between steps) into `snapshot` and the gauges.
        Not done per step: admission and /metrics read them when they need them."""
        s = self.engine.stats()
        snap = EngineSnapshot(s.num_running, s.num_waiting, s.kv_cache_usage, _held_blocks(self.engine),
                              self.engine.max_waiting)
        self.snapshot = snap
        if self.metrics is not None:
            self.metrics.update_engine(snap.num_running, snap.num_waiting, snap.kv_cache_usage,
                                       snap.num_held_blocks, _cumulative_counters(self.engine, s))
        return snap

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Begin stepping on the running event loop (call it from that loop, e.g. the app's lifespan)."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._wakeup = asyncio.Event()
            self._task = self._loop.create_task(self._run(), name="accel-engine")

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def accepting(self) -> bool:
        return self._accepting

    def begin_shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting now; requests still running after `timeout` seconds are aborted and told."""
        self._accepting = False
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + timeout
        self._wake()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Drain (see begin_shutdown), then stop the engine task."""
        self.begin_shutdown(timeout)
        deadline = time.monotonic() + timeout + 5.0
        while self.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._stop = True
        self._wake()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=10.0)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ---- requests --------------------------------------------------------------------------------------
    def check_admission(self) -> None:
        """Raise AdmissionError when a new request must be refused now."""
        error = admission_error(self.policy, self.refresh(), self._accepting and self.is_running)
        if error is not None:
            raise error

    async def add(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                  priority: int = 0) -> RequestStream:
        """Admit one request into the engine; returns its stream.

        Raises AdmissionError (refused now), or what the engine's add_request raised (ValueError for a bad
        request, QueueFullError when its waiting queue is full).
        """
        self.check_admission()
        if self._closed:
            raise admission_error(self.policy, self.snapshot, accepting=False)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        # between steps (this is the loop's thread), so the engine may be touched directly
        self.engine.add_request(prompt_token_ids, params, request_id=request_id, priority=priority)
        stream = self._streams[request_id] = asyncio.Queue()
        self._wakeup.set()
        return RequestStream(self, request_id, stream)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                       priority: int = 0) -> AsyncIterator:
        """`add` then yield the request's outputs until it finishes (closing early aborts it)."""
        stream = await self.add(prompt_token_ids, params, request_id, priority)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()  # no-op when finished
