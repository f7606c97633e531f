"""The FastAPI app: OpenAI-compatible routes over an AsyncEngine, errors always as OpenAI-style 4xx bodies.

Routes: POST /v1/completions, POST /v1/chat/completions (both stream as server-sent events ending in
`data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM names).
With an API key, /v1/* and /openapi.json need `Authorization: Bearer <key>` (401 otherwise) and the interactive
/docs and /redoc pages are off (a browser page cannot send the key when it fetches the schema); /health and
/metrics stay open for probes and scrapers, as in vLLM.

Request bodies are parsed by hand (bytes -> strict UTF-8 -> strict pydantic JSON) rather than by FastAPI's
body injection, so malformed JSON, wrong types and invalid UTF-8 all become the same 400 body naming the bad
parameter, and nothing reaches a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from accel.server.async_engine import AsyncEngine
from accel.server.handlers import CLIENT_CLOSED, OpenAIHandlers
from accel.server.metrics import ServerMetrics
from accel.server.protocol import (
    BODY_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    APIError,
    MAX_MESSAGES,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    invalid,
)

log = logging.getLogger("accel.server")

MAX_BODY_BYTES = 4 << 20  # far above any prompt that fits a context; tokenizing more would stall the event loop

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                503: "service_unavailable"}


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _clean_loc(loc) -> str | None:
    # pydantic adds the union member tried ('str', 'list[int]') to the location; the client knows no such thing
    parts = [str(p) for p in loc if isinstance(p, int) or ("[" not in p and p not in _UNION_TAGS)]
    return ".".join(parts) or None


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def describe_validation_errors(errors: list[dict]) -> tuple[str | None, str]:
    """(param, message) for the first bad parameter; the alternatives of a union are listed together."""
    param = _clean_loc(errors[0]["loc"])
    msgs = list(dict.fromkeys(err["msg"] for err in errors if _clean_loc(err["loc"]) == param))
    others = sorted({p for p in (_clean_loc(err["loc"]) for err in errors) if p != param} - {None})
    if errors[0]["type"] == "missing":
        message = f"{param}: this field is required"
    elif errors[0]["type"] == "extra_forbidden":
        message = f"{param}: unknown field; this server honours or refuses every field it knows, and not this one"
    else:
        message = f"{param or 'body'}: {errors[0].get('input')!r:.80} is invalid: " + "; or ".join(msgs)
    if others:
        message += f" (also invalid: {', '.join(others)})"
    return param, message


async def read_body(request: Request) -> bytes:
    """The body, refused with a 413 as soon as it passes MAX_BODY_BYTES: by its Content-Length before any byte
    is read, and while it streams in otherwise (a chunked body declares no length)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body has {declared} bytes; allowed: at most {MAX_BODY_BYTES}")
    chunks, size = [], 0
    timeout_s = getattr(request.app.state, "body_timeout_s", BODY_TIMEOUT_S)
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise APIError(413, f"the request body has more than {MAX_BODY_BYTES} bytes; allowed: at most "
                                        f"{MAX_BODY_BYTES}")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", "timeout_error") from None
    return b"".join(chunks)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class LoopbackHostOnly:
    """ASGI middleware: a server bound to loopback answers only requests addressed to loopback, so a page a browser
    loaded from another site cannot reach it by pointing its own DNS name at 127.0.0.1 (DNS rebinding); 421
    otherwise. Plain ASGI (not BaseHTTPMiddleware, which would sit between a stream and its client's disconnect)."""

    def __init__(self, app, bind_host: str) -> None:
        self.app, self.bind_host = app, bind_host

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.bind_host in LOOPBACK_HOSTS:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host[1:host.find("]")] if host.startswith("[") else \
                host.rsplit(":", 1)[0] if host.count(":") == 1 else host
            if name not in LOOPBACK_HOSTS:
                e = APIError(421, f"this server is bound to {self.bind_host} and answers requests for it only; the "
                                  f"Host header says {host!r}", "invalid_request_error", "Host")
                await _error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def parse_body(request: Request, model_cls):
    """Read and validate a JSON body into `model_cls`; every failure is a 400 naming what was wrong (a body that is
    not declared JSON: 415, as a browser's cross-site form or text/plain POST is)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise APIError(415, f"the request body must be JSON, sent with 'Content-Type: application/json'; got "
                            f"{ctype or 'no content type'!r}", "invalid_request_error", "Content-Type")
    raw = await read_body(request)
    if not raw.strip():
        raise invalid("the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"the request body is not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})") from e
    roles = raw.count(b'"role"') if model_cls is ChatCompletionRequest else 0  # C speed, even over 4 MiB
    if roles > MAX_MESSAGES:
        raise invalid(f"{roles} messages were sent; allowed: at most {MAX_MESSAGES}", "messages")
    try:
        req = model_cls.model_validate_json(text)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "json_invalid":
            raise invalid(f"the request body is not valid JSON: {err['msg']}") from e
        param, message = describe_validation_errors(e.errors())
        raise invalid(message, param) from e
    return req


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as an OpenAI-style body: our APIErrors, FastAPI's validation errors, unknown routes
    and methods (404 / 405), and, for a bug, a 500 that still has the OpenAI shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return _error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        errs = list(e.errors())
        param, message = describe_validation_errors(errs) if errs else (None, "invalid request")
        return _error_response(invalid(message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return _error_response(APIError(e.status_code, str(e.detail), _ERROR_TYPES.get(e.status_code, "error"),
                                        headers=dict(e.headers or {})))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect):  # a normal event: one line, no traceback
        log.info("client disconnected while sending its request to %s", request.url.path)
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):  # a bug; still an OpenAI-shaped body
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(APIError(500, f"internal error: {type(e).__name__}", "internal_error"))


def build_app(async_engine: AsyncEngine, model_name: str, api_key: str | None = None,
              kv_pressure_threshold: float | None = None, served_model_names: list[str] | None = None,
              drain_timeout_s: float = DRAIN_TIMEOUT_S, bind_host: str = "127.0.0.1", allow_priority: bool = False,
              protect_metrics: bool = False, body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
    """The app over a (not necessarily started) AsyncEngine; the app's lifespan starts and drains it.

    kv_pressure_threshold overrides the engine's AdmissionPolicy when given.
    served_model_names: names accepted in `model` (default: [model_name]).
    bind_host: on loopback, requests addressed to another host are refused (`check_host`).
    allow_priority: honour a request's `priority` without an API key (with one, a key holder may set it).
    protect_metrics: /metrics needs the API key too.
    """
    if protect_metrics and api_key is None:
        raise ValueError("protect_metrics needs an api_key: without one /metrics has nothing to check")
    if kv_pressure_threshold is not None:  # re-validated
        async_engine.policy = dataclasses.replace(async_engine.policy, kv_pressure_threshold=kv_pressure_threshold)
    names = list(served_model_names or [model_name])
    metrics = async_engine.metrics or ServerMetrics(model_name)
    async_engine.metrics = metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        yield
        await async_engine.shutdown(drain_timeout_s)
        handlers.close()

    # With a key, the schema needs it too, and the interactive pages are off: a browser page cannot send the key
    # when it fetches the schema, so they would only show an error.
    open_docs = {} if api_key is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="accel OpenAI-compatible server", lifespan=lifespan, **open_docs)
    app.state.async_engine = async_engine
    app.state.body_timeout_s = body_timeout_s
    app.state.metrics = metrics

    install_error_handlers(app)

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'",
                           "authentication_error", headers={"WWW-Authenticate": "Bearer"})

    handlers = OpenAIHandlers(async_engine, metrics, names)

    if api_key is not None:
        @app.get("/openapi.json", include_in_schema=False)
        async def openapi_schema(request: Request):
            check_auth(request)
            return JSONResponse(app.openapi())

    app.add_middleware(LoopbackHostOnly, bind_host=bind_host)

    def check_priority(req) -> None:
        if req.priority != 0 and api_key is None and not allow_priority:
            raise invalid(f"priority={req.priority} is honoured only on a server with an API key or started with "
                          "--allow-priority (any client could jump the queue); omit it", "priority")

    @app.get("/health")
    async def health():
        if not async_engine.accepting or not async_engine.is_running:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics(request: Request):
        if protect_metrics:
            check_auth(request)
        async_engine.refresh()  # the gauges as of now (this is the loop's thread: between steps)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        return ModelList(data=[ModelCard(id=n, max_model_len=async_engine.max_model_len) for n in names])

    async def answer(request: Request, model_cls, handle):
        """A generation request: authenticated, its body parsed as `model_cls` and checked, then `handle`d."""
        check_auth(request)
        req = await parse_body(request, model_cls)
        check_priority(req)
        return await handle(req, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, CompletionRequest, handlers.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, ChatCompletionRequest, handlers.chat)

    return app
