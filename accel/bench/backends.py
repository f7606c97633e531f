"""Where a load test sends its requests: one async interface, two backends.

`Backend.stream(request)` yields `Chunk`s (arrival time, text delta, token count when known, usage / queue time
when the server reports them) and raises `BenchError(kind)` on failure, so the load generator can count errors by
kind without knowing the transport.

- `OpenAIBackend`: any OpenAI-compatible server (ours, vLLM, llama.cpp server) over HTTP, streaming SSE from
  /v1/completions or /v1/chat/completions, one connection per request. Sends `max_tokens` and `ignore_eos` (vLLM
  and llama.cpp both honour it) so outputs are the asked length; counts output tokens from the usage block when
  the server sends one (`stream_options.include_usage`), else from the streamed chunks.
- `InProcessBackend`: accel's own runtime engine, stepped by a task on the event loop (the thread that built it),
  each step's outputs handed to the waiting coroutines. Queue time is exact (the engine's own timestamps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

from accel.bench.workload import BenchRequest

clock = time.perf_counter  # one clock for every timestamp of a run


@dataclass
class Chunk:
    """One piece of a streamed response. `num_tokens` is None when the transport does not say."""

    t: float
    text: str = ""
    num_tokens: int | None = None
    prompt_tokens: int | None = None  # from a usage block
    completion_tokens: int | None = None  # from a usage block (cumulative)
    queue_time: float | None = None  # seconds, when the server/engine reports it
    finished: bool = False
    carries_token: bool | None = None  # the transport says this chunk holds output (even with empty text)


class BenchError(Exception):
    """A failed request. `kind` is what the report counts: http_<status>, timeout, connection, bad_stream,
    server_error, rejected, engine:<Exception>."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


class Backend(Protocol):
    name: str
    tokenizer: Any  # builds prompts of exact token counts when set
    vocab_size: int | None  # random token-id prompts when there is no tokenizer

    def describe(self) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def stream(self, request: BenchRequest) -> AsyncIterator[Chunk]: ...


def _base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url={url!r} is invalid; allowed: an http(s) URL such as http://127.0.0.1:8000")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class OpenAIBackend:
    """An OpenAI-compatible server. `endpoint` is 'completions' or 'chat'."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, endpoint: str = "completions",
                 ignore_eos: bool = True, send_token_ids: bool = False, timeout_s: float = 600.0,
                 extra_body: dict[str, Any] | None = None, tokenizer=None) -> None:
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint={endpoint!r} is invalid; allowed: 'completions', 'chat'")
        if not model:
            raise ValueError("model is required for an OpenAI-compatible server (the name it serves)")
        self.base_url = _base_url(base_url)
        url = urlsplit(self.base_url)
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.model = model
        self.api_key = api_key
        self.endpoint = endpoint
        self.ignore_eos = ignore_eos
        self.send_token_ids = send_token_ids
        self.timeout_s = timeout_s
        self.extra_body = dict(extra_body or {})
        self.tokenizer = tokenizer
        self.vocab_size = None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.base_url, "model": self.model, "endpoint": self.endpoint,
                "ignore_eos": self.ignore_eos}

    async def start(self) -> None:
        pass  # nothing shared between requests: each opens and closes its own connection

    async def close(self) -> None:
        pass

    def _body(self, req: BenchRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": req.max_tokens, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
            path = "/v1/chat/completions"
        else:
            use_ids = self.send_token_ids and req.prompt_token_ids is not None
            body["prompt"] = list(req.prompt_token_ids) if use_ids else req.prompt
            path = "/v1/completions"
        body.update(self.extra_body)
        return path, body

    def _request_bytes(self, path: str, body: dict[str, Any]) -> bytes:
        payload = json.dumps(body).encode()
        head = [f"POST {self._prefix}{path} HTTP/1.1", f"Host: {self._host}:{self._port}",
                "Content-Type: application/json", "Accept: text/event-stream", f"Content-Length: {len(payload)}",
                "Connection: close"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    async def stream(self, request: BenchRequest) -> AsyncIterator[Chunk]:
        """The response's events with their arrival times. They are yielded once the response has ended: the
        client records (time, bytes) as they arrive and parses afterwards, so a client sharing the server's CPU
        does as little as it can while the server works."""
        path, body = self._body(request)
        loop = asyncio.get_running_loop()
        proto = _StreamProtocol(self._request_bytes(path, body), loop.create_future())
        transport = None
        try:
            transport, _ = await loop.create_connection(
                lambda: proto, self._host, self._port, ssl=self._ssl,
                server_hostname=self._host if self._ssl else None)
            await asyncio.wait_for(proto.done, self.timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise BenchError("timeout", f"no complete response within {self.timeout_s} s") from None
        except OSError as e:  # refused, reset, unreachable; ssl.SSLError is an OSError too
            raise BenchError("connection", f"{type(e).__name__}: {e}") from None
        finally:
            if transport is not None:
                transport.close()
        if proto.status != 200:
            detail = b"".join(part for _, part in proto.parts).decode("utf-8", "replace")[:300]
            raise BenchError(f"http_{proto.status}", detail)
        done = False
        for t, data in _sse_events(proto.parts):
            if data == b"[DONE]":
                done = True
                break
            yield self._parse(data, t)
        if not done:
            raise BenchError("bad_stream", "the stream ended without 'data: [DONE]'")

    def _parse(self, data: bytes, t: float) -> Chunk:
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise BenchError("bad_stream", f"not JSON: {data[:100]!r}") from None
        if not isinstance(obj, dict):
            raise BenchError("bad_stream", f"not a JSON object: {data[:100]!r}")
        if "error" in obj:
            raise BenchError("server_error", json.dumps(obj["error"])[:300])
        text = ""
        carries = False
        choices = obj.get("choices") or []
        if choices and isinstance(choices[0], dict):
            c = choices[0]
            if self.endpoint == "completions":
                text = c.get("text") or ""
                # vLLM streams one chunk per step; its text can be empty (a partial UTF-8 character held back,
                # or a model without a tokenizer), so a choice counts unless it is only the closing chunk
                carries = "text" in c and (bool(text) or c.get("finish_reason") is None)
            else:
                text = (c.get("delta") or {}).get("content") or ""
                carries = bool(text)  # the first chat chunk often carries only the role
        usage = obj.get("usage") or {}
        return Chunk(t=t, text=text, prompt_tokens=usage.get("prompt_tokens"),
                     completion_tokens=usage.get("completion_tokens"), carries_token=carries)


class _StreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 request on its own connection; the response body kept as (arrival time, bytes) pieces.

    By hand on asyncio's protocol callbacks (httptools, llhttp, parses the HTTP) rather than through aiohttp: the
    client shares the CPU with the server it measures, and aiohttp's stream reader and async line iteration cost
    several times the client CPU per streamed token."""

    def __init__(self, request: bytes, done: asyncio.Future) -> None:
        self.request = request
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.parts: list[tuple[float, bytes]] = []
        self.status: int | None = None
        self._t = 0.0

    def connection_made(self, transport) -> None:
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self._t = clock()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._finish(ConnectionError(f"bad HTTP response: {e}"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.parts.append((self._t, bytes(body)))

    def on_message_complete(self) -> None:
        self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # a body delimited by the connection's end is complete here; the SSE check then asks for its [DONE]
        self._finish(None if self.status is not None else ConnectionError(f"closed before a response: {exc}"))

    def _finish(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)


def _sse_events(parts: list[tuple[float, bytes]]) -> Iterator[tuple[float, bytes]]:
    """The `data:` payloads of an SSE body, each with the arrival time of the piece that completed its line."""
    buf = b""
    for t, part in parts:
        buf += part
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):  # blank lines, comments and `event:` lines of SSE are skipped
                yield t, line[len(b"data:"):].strip()


class InProcessBackend:
    """accel's runtime engine in this process (`accel.runtime.engine.Engine`), greedy, ignore_eos.

    The engine steps on the event loop's own thread, one step between the coroutines' turns, not on a thread of its
    own: torch's OpenMP pool belongs to the thread that first runs parallel work (the one that built the engine),
    and a second pool in the process makes every step's parallel regions wait on futex wake-ups (see
    `accel.server.async_engine`): a batch-1 step on another thread is measurably slower.
    """

    name = "in-process"

    def __init__(self, engine, reset_prefix_cache: bool = True) -> None:
        self.engine = engine
        # a repeated run (a sweep point, a repeatability check) sends the same prompts again: without a reset
        # their prefills would hit the prefix cache of the previous run and the runs would not be comparable
        self.reset_prefix_cache = reset_prefix_cache
        self.tokenizer = getattr(engine, "tokenizer", None)
        # without a tokenizer the workload sends random token ids from the model's vocabulary
        self.vocab_size = None if self.tokenizer is not None else engine.model.config.vocab_size
        self._subs: dict[str, asyncio.Queue] = {}
        self._task: asyncio.Task | None = None
        self._work: asyncio.Event | None = None
        self._next = 0

    def describe(self) -> dict[str, Any]:
        cfg = getattr(self.engine, "config", None)
        return {"backend": self.name, "model": getattr(cfg, "model", None),
                "engine_config": _public_fields(cfg)}

    async def start(self) -> None:
        if self.reset_prefix_cache:
            reset = getattr(self.engine, "reset_prefix_cache", None) or \
                getattr(getattr(getattr(self.engine, "kv", None), "pool", None), "reset_prefix_cache", None)
            if reset is not None:
                reset()  # no request is in flight between runs, so no block is in use
        self._work = asyncio.Event()
        self._task = asyncio.ensure_future(self._steps())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for rid in list(self._subs):
            self.engine.abort(rid)
        self._subs.clear()

    async def stream(self, request: BenchRequest) -> AsyncIterator[Chunk]:
        if self._task is None:
            raise RuntimeError("InProcessBackend.start() must be awaited before stream()")
        from accel.runtime.sampling_params import SamplingParams

        q: asyncio.Queue = asyncio.Queue()
        self._next += 1
        rid = f"{request.request_id}#{self._next}"  # unique even when a workload is replayed
        prompt = list(request.prompt_token_ids) if request.prompt_token_ids is not None else request.prompt
        try:
            params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)
            self.engine.add_request(prompt, params, request_id=rid)
        except Exception as e:  # noqa: BLE001 - a refused request is counted, not raised to the benchmark
            kind = "rejected" if type(e).__name__ == "QueueFullError" else f"engine:{type(e).__name__}"
            raise BenchError(kind, str(e)) from None
        self._subs[rid] = q
        self._work.set()
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished and self._subs.pop(rid, None) is not None:
                self.engine.abort(rid)

    async def _steps(self) -> None:
        eng = self.engine
        while True:
            if not eng.has_unfinished():
                self._work.clear()
                await self._work.wait()
                continue
            try:
                outs = eng.step()  # blocks the loop for one step; the coroutines consume its outputs after
            except Exception as e:  # noqa: BLE001 - a broken engine fails every request in flight, not the benchmark
                for rid, q in self._subs.items():
                    eng.abort(rid)
                    q.put_nowait(BenchError(f"engine:{type(e).__name__}", str(e)))
                self._subs.clear()
                continue
            t = clock()
            for o in outs:
                q = self._subs.get(o.request_id)
                if q is None:
                    continue
                qt = o.metrics.queue_time if o.finished else None
                q.put_nowait(Chunk(t=t, text=o.text_delta, num_tokens=len(o.new_token_ids),
                                   prompt_tokens=len(o.prompt_token_ids), completion_tokens=len(o.token_ids),
                                   queue_time=qt, finished=o.finished))
                if o.finished:
                    del self._subs[o.request_id]
            await asyncio.sleep(0)  # the consumers' turn


def _public_fields(obj) -> dict[str, Any] | None:
    if obj is None:
        return None
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is None:
        return None
    out = {}
    for k in fields:
        v = getattr(obj, k)
        if isinstance(v, (int, float, str, bool, type(None))):
            out[k] = v
        elif isinstance(v, dict):
            out[k] = f"<{len(v)} entries>"  # e.g. a quant plan: recorded in full elsewhere in the report
        else:
            out[k] = repr(v)
    return out
