"""AsyncEngine: one background thread drives the (synchronous) Engine; asyncio handlers consume per-request streams.

    HTTP handler (event loop)                        engine thread (the only one touching Engine)
    -------------------------                        --------------------------------------------
    generate(): admission check ── add command ──►   drain commands: add_request / abort
                await add result  ◄── future ──────  step() ─► outputs
                async for out in queue  ◄── loop.call_soon_threadsafe(queue.put_nowait, out)
    client gone / generator closed ── abort cmd ──►  engine.abort(id): blocks freed before the next step

Why a thread and a command queue: Engine is not thread-safe and step() is a long blocking call (a forward
pass); running it in the event loop would stall every connection, and calling add_request from the loop while
step() runs in a worker would race. So all Engine calls happen in one thread, in order.

Failure policy: add_request errors go back to the one caller (ValueError -> 400, QueueFullError -> 429). A
failure tied to one request (its sampling, verification, detokenization, stop strings) is contained by the
engine: that request finishes with reason "error" and only its stream gets the error. If step() itself raises
(the batch's forward pass), the engine's state for the batch is unknown, so every request inside the engine is
aborted (blocks freed) and told with an error; the loop itself keeps serving new requests. A request whose
stream cannot be delivered to (its event loop is gone) is aborted alone.

Shutdown: `begin_shutdown(timeout)` stops admission (503) at once; in-flight requests run on until `timeout`,
then are aborted and told; `shutdown()` waits for that and stops the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from accel.runtime.sampling_params import SamplingParams
from accel.server.metrics import ServerMetrics

log = logging.getLogger("accel.server")
HANDOFF_WAIT_S = 0.02  # the longest a step waits for the event loop to send the previous step's outputs


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
    """When the server answers 429 instead of queueing.

    max_queue: requests accepted but not yet running (the engine's waiting queue + adds in flight). Beyond it,
      queueing only adds latency the client would rather spend retrying elsewhere.
    kv_pressure_threshold: refuse when KV usage is at least this AND requests are already waiting: the pool is
      the bottleneck, and more waiting requests would only wait longer or preempt running ones.
    """

    max_queue: int = 256
    kv_pressure_threshold: float = 0.95
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError(f"max_queue={self.max_queue} is invalid; allowed: an integer >= 1")
        if not 0.0 < self.kv_pressure_threshold <= 1.0:
            raise ValueError(f"kv_pressure_threshold={self.kv_pressure_threshold} is invalid; allowed: (0, 1]")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s={self.retry_after_s} is invalid; allowed: an integer >= 1")


@dataclass
class EngineSnapshot:
    """What the event loop may read about the engine without touching it (written by the engine thread)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_held_blocks: int = 0


def admission_error(policy: AdmissionPolicy, snap: EngineSnapshot, num_pending_adds: int,
                    accepting: bool) -> AdmissionError | None:
    """The admission decision (pure): None to admit, else the 503 / 429 to answer."""
    if not accepting:
        return AdmissionError(503, "shutting_down", "the server is shutting down and accepts no new requests",
                              policy.retry_after_s)
    queued = snap.num_waiting + num_pending_adds
    if queued >= policy.max_queue:
        return AdmissionError(429, "queue_full", f"the server is overloaded: {queued} requests queued "
                              f"(max_queue={policy.max_queue}); retry later", policy.retry_after_s)
    if snap.kv_cache_usage >= policy.kv_pressure_threshold and queued > 0:
        return AdmissionError(429, "kv_pressure", f"the server is overloaded: KV cache {snap.kv_cache_usage:.0%} "
                              f"full with {queued} requests waiting; retry later", policy.retry_after_s)
    return None


class RequestStream:
    """The outputs of one admitted request; iterate it once. Leaving the loop early aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str, stream: _Stream) -> None:
        self.request_id = request_id
        self._engine = engine
        self._stream = stream
        self.finished = False

    async def __aiter__(self) -> AsyncIterator:
        try:
            while True:
                item = await self._stream.queue.get()
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


def _put_all(items: list, loop: asyncio.AbstractEventLoop, sent: threading.Event) -> None:
    """Wake the items' consumers; `sent` is set once they have run (a callback queued behind their wake-ups)."""
    for stream, item in items:
        stream.queue.put_nowait(item)
    loop.call_soon(sent.set)


class _Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()


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


def _resolve(future: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    """Complete an add's future unless its caller already gave up (cancelled: its abort command follows)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _held_blocks(engine) -> int:
    kv = getattr(engine, "kv", None)
    return kv.num_held_blocks() if kv is not None and hasattr(kv, "num_held_blocks") else 0


class AsyncEngine:
    def __init__(self, engine, policy: AdmissionPolicy | None = None, metrics: ServerMetrics | None = None,
                 idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.policy = policy or AdmissionPolicy()
        self.metrics = metrics
        self.max_model_len = max_model_len(engine)
        # a private tokenizer copy for the event loop: HF fast tokenizers may raise "Already borrowed" when one
        # object is used from two threads, and the engine thread detokenizes with the original
        self.tokenizer = copy.deepcopy(engine.tokenizer) if engine.tokenizer is not None else None
        self.snapshot = EngineSnapshot()
        self._idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._num_pending_adds = 0
        self._accepting = True
        self._drain_deadline: float | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._closed = False  # set (under _lock) by the engine thread on exit: no command will be read after
        self._go: threading.Event | None = None  # set by launch(): the thread that built the engine waits on it

    @classmethod
    def launch(cls, build: Callable[[], object], policy: AdmissionPolicy | None = None,
               metrics: ServerMetrics | None = None) -> AsyncEngine:
        """Build the engine on the thread that will step it (its loop begins at `start()`).

        Why: torch's OpenMP pool belongs to the thread that first runs parallel work. Loading the model in the main
        thread and stepping it in another leaves two pools, and with more pool threads than cores libgomp cuts its
        spin-waits short, so every parallel region of a step waits on a futex wake-up: the batch-1 decode step
        measured 30-40% slower (SmolLM2-135M fp32, 2 cores: ~70 -> ~42 tok/s) than with one pool.
        """
        built: dict = {}
        ready, go = threading.Event(), threading.Event()

        def thread_main() -> None:
            try:
                built["engine"] = build()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                built["error"] = e
            ready.set()
            if "error" in built:
                return
            go.wait()
            built["self"]._run()

        thread = threading.Thread(target=thread_main, name="accel-engine-loop", daemon=True)
        thread.start()
        ready.wait()
        if "error" in built:
            raise built["error"]
        self = cls(built["engine"], policy, metrics)
        built["self"] = self
        self._thread, self._go = thread, go
        return self

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._go is not None:  # launched: the engine's own thread is waiting to begin its loop
            self._go.set()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="accel-engine-loop", daemon=True)
            self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def accepting(self) -> bool:
        return self._accepting

    def begin_shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting now; requests still running after `timeout` seconds are aborted and told."""
        self._accepting = False
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + timeout
        self._wakeup.set()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Drain (see begin_shutdown), then stop the engine thread."""
        self.begin_shutdown(timeout)
        deadline = time.monotonic() + timeout + 5.0
        while self.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._stop = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    # ---- requests (event loop side) --------------------------------------------------------------------
    def check_admission(self) -> None:
        """Raise AdmissionError when a new request must be refused now."""
        error = admission_error(self.policy, self.snapshot, self._num_pending_adds,
                                self._accepting and self.is_running)
        if error is not None:
            raise error

    async def add(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                  priority: int = 0) -> RequestStream:
        """Admit one request into the engine; returns its stream once the engine has accepted it.

        Raises AdmissionError (refused now), or what the engine's add_request raised (ValueError for a bad
        request, QueueFullError when its waiting queue is full).
        """
        self.check_admission()
        stream = _Stream(asyncio.get_running_loop())
        added: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise admission_error(self.policy, self.snapshot, 0, accepting=False)
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
            self._num_pending_adds += 1
            # enqueued under the lock, so the engine thread's final drain (after _closed) cannot miss it
            self._commands.put(("add", request_id, (prompt_token_ids, params, priority), added))
        self._wakeup.set()
        try:
            await asyncio.wrap_future(added)
        except BaseException:
            self.abort(request_id)  # cancelled while waiting (client gone): the add may still land
            raise
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

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe; takes effect before the engine's next step)."""
        self._commands.put(("abort", request_id, None, None))
        self._wakeup.set()

    # ---- the engine thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            try:
                self._drain_commands()
                self._enforce_drain_deadline()
                if not self.engine.has_unfinished():
                    self._publish_stats()
                    self._wakeup.wait(self._idle_wait_s)
                    self._wakeup.clear()
                    continue
                self._step_once()
            except Exception:  # noqa: BLE001 - the loop must never die; _step_once already told the requests
                log.exception("engine loop iteration failed; continuing")
        with self._lock:
            self._closed = True
        self._drain_commands()
        self._fail_all(RequestFailed("the server stopped before this request finished", 503, "service_unavailable"))

    def _step_once(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            log.exception("engine.step() raised; aborting the requests in the engine")
            self._fail_all(RequestFailed(f"the engine failed while running this request: {type(e).__name__}: {e}"))
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, object]]] = {}
        for out in outputs:
            if self.metrics is not None:
                self.metrics.observe_output(out)
            with self._lock:
                stream = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
            if stream is not None:
                item = out if getattr(out, "error", None) is None else RequestFailed(
                    f"this request failed in the engine and was ended (other requests were not affected): "
                    f"{out.error}")
                by_loop.setdefault(stream.loop, []).append((stream, item))
        # One wake-up of each event loop per step, not one per request: every call_soon_threadsafe writes the
        # loop's self-pipe and runs a callback, and at 64 streams those wake-ups steal the CPU (and the GIL) from
        # the step the OpenMP threads are waiting on.
        # The next step waits (at most HANDOFF_WAIT_S) until the loop has sent these outputs: on a machine whose
        # cores the OpenMP threads fill, the loop's work otherwise preempts a thread mid-step and the step waits on
        # it (paired batch-1 runs: +2% tok/s at fp32 and INT8; 64 streams unchanged).
        for loop, items in by_loop.items():
            try:
                sent = threading.Event()
                loop.call_soon_threadsafe(_put_all, items, loop, sent)
                sent.wait(HANDOFF_WAIT_S)
            except RuntimeError:  # that event loop is closed: nobody will read these requests
                for stream, out in items:
                    self.engine.abort(out.request_id)
                    with self._lock:
                        self._streams.pop(out.request_id, None)
        self._publish_stats()

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, request_id, payload, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._do_add(request_id, payload, future)
            elif kind == "abort":
                self.engine.abort(request_id)
                with self._lock:
                    self._streams.pop(request_id, None)

    def _do_add(self, request_id: str, payload, future: concurrent.futures.Future) -> None:
        prompt, params, priority = payload
        with self._lock:
            self._num_pending_adds -= 1
            if request_id not in self._streams:  # failed (shutdown) before it was added
                _resolve(future, error=RequestFailed("the server is shutting down", 503, "service_unavailable"))
                return
        try:
            self.engine.add_request(prompt, params, request_id=request_id, priority=priority)
        except Exception as e:  # noqa: BLE001 - goes back to the one caller (400 / 429)
            with self._lock:
                self._streams.pop(request_id, None)
            _resolve(future, error=e)
            return
        _resolve(future, result=request_id)

    def _deliver(self, request_id: str, item, last: bool) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None) if last else self._streams.get(request_id)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody will read this request
            self.engine.abort(request_id)
            with self._lock:
                self._streams.pop(request_id, None)

    def _fail_all(self, error: RequestFailed) -> None:
        with self._lock:
            ids = list(self._streams)
        for rid in ids:
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001
                log.exception("abort(%s) failed", rid)
            self._deliver(rid, error, last=True)
        self._publish_stats()

    def _enforce_drain_deadline(self) -> None:
        if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline and self._streams:
            self._fail_all(RequestFailed("the server is shutting down; this request was aborted before it "
                                         "finished", 503, "service_unavailable"))

    def _publish_stats(self) -> None:
        s = self.engine.stats()
        snap = EngineSnapshot(s.num_running, s.num_waiting, s.kv_cache_usage, _held_blocks(self.engine))
        self.snapshot = snap
        if self.metrics is not None:
            self.metrics.update_engine(snap.num_running, snap.num_waiting, snap.kv_cache_usage,
                                       snap.num_held_blocks, _cumulative_counters(self.engine, s))
