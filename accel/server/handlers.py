"""The OpenAI endpoints' request handling: validate, admit into the AsyncEngine, answer (JSON or SSE stream).

A request is fully validated (schema, model, prompt, context length, sampling values) BEFORE admission, so a
bad request is a 400 even when the server is overloaded. Streaming responses start only after the engine has
accepted the request, so a refusal is still a proper 429 / 503 status, not an error inside a 200 stream.
A client that disconnects is noticed by Starlette (streams) or by a watcher on the connection (non-streaming);
either way the request is aborted and its KV blocks are freed before the engine's next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from accel.runtime.scheduler import QueueFullError
from accel.server import convert
from accel.server.async_engine import AdmissionError, AsyncEngine, RequestFailed, RequestStream
from accel.server.metrics import ServerMetrics
from accel.server.protocol import (
    APIError,
    AssistantMessage,
    ResponseFunctionCall,
    ResponseToolCall,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    invalid,
    random_id,
)

ADMISSION_ERROR_TYPES = {429: "rate_limit_error", 503: "service_unavailable"}
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show what happened


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client has gone (after the body was read, receive() only yields http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, object]]:
    """(choice index, RequestOutput) from n streams as they come; leaving early aborts every unfinished one."""
    if len(streams) == 1:  # the common case: no pump tasks
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].abort()  # no-op when finished; closing this generator must not wait for GC to abort
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                q.put_nowait((i, out))
        except RequestFailed as e:
            q.put_nowait((i, e))
        q.put_nowait((i, None))  # this choice is done

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await q.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()  # no-op for a finished stream


async def collect(streams: list[RequestStream], request: Request) -> list | None:
    """Run a non-streaming request's n choices to their end (last output of each, by index); abort them all
    and return None if the client disconnects first."""

    async def consume():
        last: dict[int, object] = {}
        async for i, out in merged(streams):
            last[i] = out
        return [last[i] for i in range(len(streams))]

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if consumer in done:
        try:
            return consumer.result()
        except RequestFailed as e:
            raise APIError(e.status, e.message, e.type) from e
    consumer.cancel()
    for s in streams:
        s.abort()
    return None


async def _sse_with_errors(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The events, an error event if the request failed mid-way, then `[DONE]` (as vLLM does)."""
    try:
        async for e in events:
            yield e
    except RequestFailed as e:
        yield convert.sse(APIError(e.status, e.message, e.type).body())
    yield convert.SSE_DONE


class OpenAIHandlers:
    """/v1/completions and /v1/chat/completions over one AsyncEngine."""

    def __init__(self, async_engine: AsyncEngine, metrics: ServerMetrics, served_model_names: list[str]) -> None:
        self.engine = async_engine
        self.metrics = metrics
        self.names = served_model_names
        # Tokenizing (and rendering chat templates) runs on one worker thread, never on the event loop: a long
        # prompt would stall every stream and /health meanwhile (the Rust tokenizer releases the GIL). One worker,
        # because a tokenizer object must not be used from two threads at once.
        self._tokenizer_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="accel-tokenize")
        self._max_prompt_chars = convert.max_prompt_chars(async_engine.tokenizer, async_engine.max_model_len)

    def close(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    def _compile_grammar(self, spec) -> None:
        """Compile a structured output's grammar into the engine's cache (on the tokenizer thread, with its copy)."""
        compiler = getattr(self.engine.engine, "grammar_compiler", None)
        if compiler is None:
            raise ValueError("structured output is not supported by this engine")
        compiler(self.engine.tokenizer).compile(spec)

    async def _on_tokenizer_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

    async def _final_logprobs(self, outs: list, params, to_logprobs, *args) -> list:
        """Each finished choice's logprobs as `to_logprobs(tokenizer, <its tokens' logprobs>, *args)` makes them, on
        the tokenizer thread; a None each when the request asked for none."""
        if params.logprobs is None:
            return [None] * len(outs)
        tok = self.engine.tokenizer
        return [await self._on_tokenizer_thread(to_logprobs, tok, *convert.new_logprobs(o, 0), *args) for o in outs]

    async def admit(self, ids: list[int], params, request_id: str, priority: int) -> RequestStream:
        """Into the engine, or an APIError: 429/503 with Retry-After when refused, 400 for the engine's checks."""
        retry = {"Retry-After": str(self.engine.policy.retry_after_s)}
        try:
            return await self.engine.add(ids, params, request_id, priority)
        except AdmissionError as e:
            self.metrics.reject(e.reason)
            raise APIError(e.status, e.message, ADMISSION_ERROR_TYPES[e.status],
                           headers={"Retry-After": str(e.retry_after)}) from e
        except QueueFullError as e:
            self.metrics.reject("queue_full")
            raise APIError(429, str(e), "rate_limit_error", headers=retry) from e
        except RequestFailed as e:
            raise APIError(e.status, e.message, e.type, headers=retry) from e
        except ValueError as e:  # the engine's own checks (token ids, KV capacity)
            raise invalid(str(e), _engine_error_param(str(e))) from e

    async def admit_n(self, ids: list[int], params, request_id: str, priority: int, n: int) -> list[RequestStream]:
        """n engine requests for the n choices (all or none: a refusal aborts the ones already admitted).

        With a seed, choice i uses seed + i, so the choices differ yet the request stays reproducible.
        """
        streams: list[RequestStream] = []
        try:
            for i in range(n):
                p = params if n == 1 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
                streams.append(await self.admit(ids, p, request_id if n == 1 else f"{request_id}-{i}", priority))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    # ---- /v1/completions -----------------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, request: Request):
        model = convert.check_model(req.model, self.names)
        convert.check_supported(req)  # before any tokenizing
        ids = await self._on_tokenizer_thread(convert.completion_prompt_ids, req, self.engine.tokenizer,
                                              self._max_prompt_chars)
        params = convert.sampling_params(
            req, convert.resolve_max_tokens(req.max_tokens, len(ids), self.engine.max_model_len))
        echo = ""
        if req.echo and self.engine.tokenizer is not None:
            echo = await self._on_tokenizer_thread(self.engine.tokenizer.decode, ids)
        rid = random_id("cmpl")
        streams = await self.admit_n(ids, params, rid, req.priority, req.n)
        created = int(time.time())
        tok = self.engine.tokenizer

        def chunk(choices: list[CompletionChoice], usage=None) -> CompletionResponse:
            return CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)

        def choice(i: int, text: str, out=None, logprobs=None) -> CompletionChoice:
            done = out is not None and out.finished
            return CompletionChoice(index=i, text=text, logprobs=logprobs,
                                    finish_reason=out.finish_reason if done else None,
                                    stop_reason=out.stop_reason if done else None)

        if req.stream:
            texts = [convert.sse_text_template(lambda text, i=i: chunk([choice(i, text)])) for i in range(req.n)]

            async def events():
                last: dict[int, object] = {}
                reported, offsets = [0] * req.n, [len(echo)] * req.n
                scored = params.prompt_logprobs is not None  # the echo goes out with its logprobs, once computed
                for i in range(req.n if echo and not scored else 0):
                    yield texts[i](echo)
                async for i, out in merged(streams):
                    if scored and i not in last:
                        lp = await self._on_tokenizer_thread(convert.prompt_logprobs, tok, out)
                        yield convert.sse(chunk([choice(i, echo, None, lp)]))
                    last[i] = out
                    lp = None
                    if params.logprobs is not None and len(out.token_ids) > reported[i]:
                        lp = await self._on_tokenizer_thread(
                            convert.completion_logprobs, tok, *convert.new_logprobs(out, reported[i]), offsets[i])
                        reported[i] = len(out.token_ids)
                        offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                    if out.finished or lp is not None:
                        yield convert.sse(chunk([choice(i, out.text_delta, out, lp)]))
                    elif out.text_delta:
                        yield texts[i](out.text_delta)
                if _include_usage(req) and len(last) == req.n:
                    yield convert.sse(chunk([], usage=convert.usage(list(last.values()))))

            return StreamingResponse(_sse_with_errors(events()), media_type="text/event-stream")

        outs = await collect(streams, request)
        if outs is None:
            return Response(status_code=CLIENT_CLOSED)
        lps = await self._final_logprobs(outs, params, convert.completion_logprobs, len(echo))
        if params.logprobs is not None and params.prompt_logprobs is not None:
            lps = [convert.join_logprobs(await self._on_tokenizer_thread(convert.prompt_logprobs, tok, o), lp)
                   for o, lp in zip(outs, lps)]
        return chunk([choice(i, echo + o.text, o, lp) for i, (o, lp) in enumerate(zip(outs, lps))],
                     usage=convert.usage(outs))

    # ---- /v1/chat/completions ------------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest, request: Request):
        from accel.runtime.sampling_params import StructuredOutput
        from accel.server import tools

        model = convert.check_model(req.model, self.names)
        convert.check_supported(req)  # before any tokenizing
        mode = tools.tool_mode(req, getattr(self.engine.tokenizer, "chat_template", None))
        convert.check_message_count(req, self.engine.max_model_len)
        ids = await self._on_tokenizer_thread(convert.chat_prompt_ids, req, self.engine.tokenizer,
                                              self._max_prompt_chars)
        requested, param = ((req.max_completion_tokens, "max_completion_tokens")
                            if req.max_completion_tokens is not None else (req.max_tokens, "max_tokens"))
        params = convert.sampling_params(
            req, convert.resolve_max_tokens(requested, len(ids), self.engine.max_model_len, param))
        if mode.kind == "forced":  # one call, its arguments to the function's schema
            params = dataclasses.replace(params, structured=StructuredOutput(json_schema=json.dumps(mode.schema)))
        if params.structured is not None:  # compiled here, off the engine's loop; the engine's compile is a hit
            try:
                await self._on_tokenizer_thread(self._compile_grammar, params.structured)
            except ValueError as e:
                raise invalid(str(e), "response_format") from e
        rid = random_id("chatcmpl")
        streams = await self.admit_n(ids, params, rid, req.priority, req.n)
        created = int(time.time())

        tok = self.engine.tokenizer
        if req.stream:
            def chunk(i: int | None, delta: DeltaMessage | None = None, finish_reason=None,
                      usage=None, logprobs=None) -> ChatCompletionChunk:
                choices = [] if i is None else [ChatStreamChoice(index=i, delta=delta, finish_reason=finish_reason,
                                                                 logprobs=logprobs)]
                return ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, usage=usage)

            texts = [convert.sse_text_template(lambda text, i=i: chunk(i, DeltaMessage(content=text)))
                     for i in range(req.n)]

            async def events():
                last: dict[int, object] = {}
                reported = [0] * req.n
                for i in range(req.n):
                    yield convert.sse(chunk(i, DeltaMessage(role="assistant", content="")))
                held = mode.kind != "none"  # a reply that may be a call is read whole, then sent
                async for i, out in merged(streams):
                    last[i] = out
                    delta = "" if held else out.text_delta
                    if params.logprobs is not None and len(out.token_ids) > reported[i]:
                        lp = await self._on_tokenizer_thread(convert.chat_logprobs, tok,
                                                             *convert.new_logprobs(out, reported[i]))
                        reported[i] = len(out.token_ids)
                        yield convert.sse(chunk(i, DeltaMessage(content=delta), logprobs=lp))
                    elif delta:
                        yield texts[i](delta)
                    if out.finished:
                        finish = out.finish_reason
                        if held:
                            content, calls = tools.read_reply(mode, out.text, out.finish_reason == "stop")
                            if calls:
                                finish = "tool_calls"
                                yield convert.sse(chunk(i, DeltaMessage(tool_calls=_tool_calls(calls, deltas=True))))
                            elif content:
                                yield texts[i](content)
                        yield convert.sse(chunk(i, DeltaMessage(), finish))
                if _include_usage(req) and len(last) == req.n:
                    yield convert.sse(chunk(None, usage=convert.usage(list(last.values()))))

            return StreamingResponse(_sse_with_errors(events()), media_type="text/event-stream")

        outs = await collect(streams, request)
        if outs is None:
            return Response(status_code=CLIENT_CLOSED)
        lps = await self._final_logprobs(outs, params, convert.chat_logprobs)
        choices = []
        for i, (o, lp) in enumerate(zip(outs, lps)):
            content, calls = tools.read_reply(mode, o.text, o.finish_reason == "stop")
            choices.append(ChatChoice(index=i, message=AssistantMessage(content=content,
                                                                        tool_calls=_tool_calls(calls) or None),
                                      logprobs=lp, finish_reason="tool_calls" if calls else o.finish_reason,
                                      stop_reason=o.stop_reason))
        return ChatCompletionResponse(id=rid, created=created, model=model, usage=convert.usage(outs),
                                      choices=choices)


def _tool_calls(calls: list[dict], deltas: bool = False) -> list[ResponseToolCall]:
    return [ResponseToolCall(index=j if deltas else None, id=c["id"], type="function",
                             function=ResponseFunctionCall(**c["function"])) for j, c in enumerate(calls)]


def _engine_error_param(message: str) -> str:
    """The request field an engine ValueError is about (its messages name the field first, or max_tokens)."""
    for field in ("stop_token_ids", "logit_bias"):
        if message.startswith(field):
            return field
    if message.startswith("structured output"):
        return "response_format"
    return "max_tokens" if "max_tokens" in message else "prompt"


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)
