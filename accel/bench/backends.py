"""Where a load test sends its requests: one async interface, two backends.

`Backend.stream(request)` yields `Chunk`s (arrival time, text delta, token count when known, usage / queue time
when the server reports them) and raises `BenchError(kind)` on failure, so the load generator can count errors by
kind without knowing the transport.

- `OpenAIBackend`: any OpenAI-compatible server (ours, vLLM, llama.cpp server) over HTTP, streaming SSE from
  /v1/completions or /v1/chat/completions with aiohttp. Sends `max_tokens` and `ignore_eos` (vLLM and llama.cpp
  both honour it) so outputs are the asked length; counts output tokens from the usage block when the server
  sends one (`stream_options.include_usage`), else from the streamed chunks.
- `InProcessBackend`: accel's own runtime engine, stepped by a task on the event loop (the thread that built it),
  each step's outputs handed to the waiting coroutines. Queue time is exact (the engine's own timestamps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

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
        self.model = model
        self.api_key = api_key
        self.endpoint = endpoint
        self.ignore_eos = ignore_eos
        self.send_token_ids = send_token_ids
        self.timeout_s = timeout_s
        self.extra_body = dict(extra_body or {})
        self.tokenizer = tokenizer
        self.vocab_size = None
        self._client: aiohttp.ClientSession | None = None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.base_url, "model": self.model, "endpoint": self.endpoint,
                "ignore_eos": self.ignore_eos}

    async def start(self) -> None:
        # aiohttp, not httpx: its C parser costs the client ~0.3 ms of CPU per streamed token where httpx (a Python
        # HTTP/1.1 parser) cost ~0.5 ms; a client sharing the server's cores takes that time from the server
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                             connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

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

    async def stream(self, request: BenchRequest) -> AsyncIterator[Chunk]:
        if self._client is None:
            raise RuntimeError("OpenAIBackend.start() must be awaited before stream()")
        path, body = self._body(request)
        done = False
        try:
            async with self._client.post(self.base_url + path, json=body) as resp:
                if resp.status != 200:
                    detail = (await resp.read()).decode("utf-8", "replace")[:300]
                    raise BenchError(f"http_{resp.status}", detail)
                async for raw in resp.content:  # one line at a time
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank lines, comments and `event:` lines of SSE
                    data = line[len(b"data:"):].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    yield self._parse(data)
        except TimeoutError as e:
            raise BenchError("timeout", str(e) or f"no answer within {self.timeout_s} s") from None
        except (aiohttp.ClientError, ValueError) as e:  # ValueError: a line over the reader's limit
            raise BenchError("connection", f"{type(e).__name__}: {e}") from None
        if not done:
            raise BenchError("bad_stream", "the stream ended without 'data: [DONE]'")

    def _parse(self, data: bytes) -> Chunk:
        t = clock()
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


class InProcessBackend:
    """accel's runtime engine in this process (`accel.runtime.engine.Engine`), greedy, ignore_eos.

    The engine steps on the event loop's own thread, one step between the coroutines' turns, not on a thread of its
    own: torch's OpenMP pool belongs to the thread that first runs parallel work (the one that built the engine),
    and a second pool in the process makes every step's parallel regions wait on futex wake-ups (see
    `accel.server.async_engine`): a batch-1 step measured 30-40% slower on another thread.
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
