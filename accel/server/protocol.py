"""OpenAI-compatible request / response models (pydantic), plus vLLM's sampling extensions.

Requests are parsed in strict JSON mode: `"max_tokens": "16"` or `"n": 1.5` is a 400, not a silent coercion.

No field is silently ignored: an unknown field is a 400 naming it and the fields allowed there (pydantic's
`extra="forbid"`), and an OpenAI field this server does not honour yet (`UNSUPPORTED`) is declared so that
`convert.check_supported` refuses it by name with the same status. `model` may be omitted (the served model).

OpenAI's logprobs (completions: `logprobs` k, with `echo` the prompt's too; chat: `logprobs` + `top_logprobs`) are the
raw log-softmax of the model's logits, speculating or not; `logit_bias` ({"token id": [-100, 100]}) is added to
the raw logits of greedy and sampled requests alike; `response_format` (json_object / json_schema) and
`tools` / `tool_choice` are honoured (accel.runtime.structured, accel.server.tools).

vLLM extensions accepted on both endpoints: top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
stop_token_ids, priority (lower value = more important, vLLM's convention), seed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accel.runtime.sampling_params import MAX_STOP_STRINGS


DRAIN_TIMEOUT_S = 30.0  # in-flight requests' time to finish on shutdown (then aborted, and told): `--drain-timeout`

BODY_TIMEOUT_S = 30.0  # a request body must arrive within this, or 408: a half-sent request holds nothing for long

MAX_MESSAGES = 8192
"""Messages per chat request: 8,000 parse quickly; 100,000 empty ones held the event loop in pydantic
(which validates every item before it checks the length), so `app.parse_body` counts them in the raw bytes first."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI + vLLM extensions)."""

    model: str | None = None  # None: the served model, as vLLM does
    temperature: float | None = None  # None: 1.0, OpenAI's default
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int | None = None  # None or -1 (vLLM's "off") disables it
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    priority: int = 0
    logit_bias: dict[str, float] | None = None  # {token id as a string: bias in [-100, 100]}, OpenAI's form

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. One prompt per request: a string or a list of token ids (a list of one is fine)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions; None: the rest of the context
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls, rendered back by the template
    tool_call_id: str | None = None  # a tool message's answer to that call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's `response_format`: text (no constraint), json_object (any JSON object), json_schema (a value of
    the schema; strict or not, the output follows it: the grammar allows nothing else)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions; the prompt is the tokenizer's chat template applied to `messages`."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = None  # None: the rest of the context (OpenAI's behaviour)
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # None: auto with tools
    parallel_tool_calls: bool | None = None  # a reply holds one call or more where the template writes several
    # OpenAI fields declared only to be refused by name while unsupported (convert.check_supported)
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None


# ---- responses ---------------------------------------------------------------------------------------------


class SpecDecodeUsage(BaseModel):
    """Speculative-decoding counters of one request (vLLM metric names); present only when speculating."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: list[int] = Field(default_factory=list)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    spec_decode: SpecDecodeUsage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # vLLM extension: the stop string / token id that ended it


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ResponseFunctionCall(BaseModel):
    name: str | None = None
    arguments: str


class ResponseToolCall(BaseModel):
    index: int | None = None  # streamed deltas only
    id: str | None = None
    type: Literal["function"] | None = "function"
    function: ResponseFunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Any = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "accel"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorInfo


class APIError(Exception):
    """An error answered to the client with an OpenAI-style body; raised anywhere in request handling.

    type follows OpenAI: invalid_request_error (400), authentication_error (401), not_found_error (404),
    rate_limit_error (429), service_unavailable (503), timeout_error (504), internal_error (500).
    """

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param,
                                             code=self.status)).model_dump()


def invalid(message: str, param: str | None = None) -> APIError:
    """A 400 invalid_request_error naming the bad parameter."""
    return APIError(400, message, "invalid_request_error", param)


UNSUPPORTED = ("functions",
               "function_call", "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
               "store", "metadata", "service_tier")
"""OpenAI request fields refused by name when set, except to a value that asks for nothing (`NO_OP`)."""
NO_OP = {"store": (False,), "service_tier": ("auto", "default")}
MESSAGE_UNSUPPORTED: tuple[str, ...] = ()


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


__all__ = [
    "MAX_STOP_STRINGS", "MAX_MESSAGES", "StreamOptions", "CompletionRequest", "ChatMessage", "ChatCompletionRequest",
    "SpecDecodeUsage", "UsageInfo", "PromptTokensDetails", "CompletionChoice", "CompletionResponse",
    "AssistantMessage", "ChatChoice", "ChatCompletionResponse", "DeltaMessage", "ChatStreamChoice",
    "ChatCompletionChunk", "ModelCard", "ModelList", "ErrorInfo", "ErrorResponse", "APIError", "invalid",
    "random_id", "UNSUPPORTED",
]
