"""Turn OpenAI requests into (prompt token ids, SamplingParams) and engine outputs into OpenAI responses.

Pure functions over the protocol models: every check that can reject a request lives here and raises
`APIError` (a 4xx with the offending parameter named), so the handlers in handlers.py stay thin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from accel.runtime.sampling_params import MAX_STOP_STRINGS, SEED_MAX, SEED_MIN, SamplingParams, StructuredOutput
from accel.server.metrics import spec_counters
from accel.speculative.stats import SpecDecodeStats
from accel.server.protocol import (
    MESSAGE_UNSUPPORTED,
    NO_OP,
    UNSUPPORTED,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    PromptTokensDetails,
    SpecDecodeUsage,
    UsageInfo,
    invalid,
)

MAX_N = 16  # choices per request; each is a separate engine request sharing the prompt (prefix cache)
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]; the engine would take more, the API does not


def check_model(requested: str | None, served: list[str]) -> str:
    """The model a request names, or the served one where it names none (vLLM's fallback); 404 for another."""
    if requested is None:
        return served[0]
    if requested not in served:
        raise APIError(404, f"the model {requested!r} does not exist; this server serves {served}",
                       "invalid_request_error", "model")
    return requested


def check_supported(req: CompletionRequest | ChatCompletionRequest) -> None:
    """A 400 naming the first OpenAI field the request sets that this server does not honour (protocol.UNSUPPORTED),
    so that no field is silently ignored."""
    for name in UNSUPPORTED:
        value = getattr(req, name, None)
        if value is not None and value not in NO_OP.get(name, ()):
            raise invalid(f"{name} is not supported by this server yet; omit it", name)
    for i, m in enumerate(getattr(req, "messages", ())):
        for name in MESSAGE_UNSUPPORTED:
            if getattr(m, name) is not None:
                raise invalid(f"messages[{i}].{name}: tool calls are not supported by this server yet; omit it",
                              f"messages.{i}.{name}")


def _check_common(req: CompletionRequest | ChatCompletionRequest) -> None:
    if not 1 <= req.n <= MAX_N:
        raise invalid(f"n={req.n} is invalid; allowed: an integer in [1, {MAX_N}]", "n")
    if req.temperature is not None and not 0.0 <= req.temperature <= MAX_TEMPERATURE:
        raise invalid(f"temperature={req.temperature} is invalid; allowed: a number in [0, {MAX_TEMPERATURE}]",
                      "temperature")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise invalid(f"top_p={req.top_p} is invalid; allowed: a number in (0, 1]", "top_p")
    stops = req.stop_list()
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"{len(stops)} stop strings were given; allowed: at most {MAX_STOP_STRINGS}", "stop")
    if any(s == "" for s in stops):
        raise invalid("stop strings must be non-empty", "stop")
    if req.top_k is not None and req.top_k < -1:
        raise invalid(f"top_k={req.top_k} is invalid; allowed: -1 or 0 (off) or an integer >= 1", "top_k")
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX - (req.n - 1):
        # choice i of n is sampled with seed + i, so the whole range must be a signed 64-bit integer
        raise invalid(f"seed={req.seed} is invalid; allowed: an integer in [{SEED_MIN}, {SEED_MAX - (req.n - 1)}]"
                      + (f" with n={req.n} (choice i uses seed + i)" if req.n > 1 else ""), "seed")


def max_prompt_chars(tokenizer, max_model_len: int) -> int | None:
    """The most characters a prompt can have and still fit the context: no token spells more characters than the
    longest vocabulary entry (a byte-level BPE entry has one character per byte). A longer prompt is refused
    before it is tokenized, which would take seconds for megabytes of text. None without a tokenizer."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    return max_model_len * max(longest, 1)


def _check_prompt_chars(num_chars: int, max_chars: int | None, param: str) -> None:
    if max_chars is not None and num_chars > max_chars:
        raise invalid(f"the {param} has {num_chars} characters, more than any prompt that fits this model's "
                      f"context can have (at most {max_chars}); shorten it", param)


def completion_prompt_ids(req: CompletionRequest, tokenizer, max_chars: int | None = None) -> list[int]:
    """The one prompt of a completion request as token ids (a batch of more than one prompt is a 400)."""
    _check_common(req)
    if req.suffix is not None:
        raise invalid("suffix is not supported by this server", "suffix")
    if req.best_of not in (None, 1):
        raise invalid(f"best_of={req.best_of} is not supported; allowed: 1", "best_of")
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise invalid(f"a batch of {len(prompt)} prompts was sent; allowed: one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt is empty; send at least one character", "prompt")
        if tokenizer is None:
            raise invalid("this model has no tokenizer; send the prompt as a list of token ids", "prompt")
        _check_prompt_chars(len(prompt), max_chars, "prompt")
        try:
            ids = tokenizer.encode(prompt)
        except Exception as e:  # noqa: BLE001 - text the tokenizer cannot take is the client's input
            raise invalid(f"the prompt could not be tokenized: {e}", "prompt") from e
    else:
        ids = list(prompt)
    if not ids:
        raise invalid("prompt is empty; send at least one token", "prompt")
    return ids


def check_message_count(req: ChatCompletionRequest, max_model_len: int) -> None:
    """More messages than the context has tokens cannot fit (a template spends a token or more on each, empty or
    not): refused before templating, whose cost on the tokenizer's thread grows with every message."""
    if len(req.messages) > max_model_len:
        raise invalid(f"{len(req.messages)} messages were sent; allowed: at most {max_model_len}, this model's "
                      "context length in tokens", "messages")


def chat_prompt_ids(req: ChatCompletionRequest, tokenizer, max_chars: int | None = None) -> list[int]:
    """The chat template of the tokenizer applied to the messages, with the assistant's turn opened."""
    _check_common(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise invalid("this model has no chat template; use /v1/completions", "messages")
    from accel.server.tools import template_messages, template_tools

    messages = template_messages(req)
    _check_prompt_chars(sum(len(m["content"]) for m in messages) + len(json.dumps(template_tools(req) or [])),
                        max_chars, "messages")
    try:
        text = tokenizer.apply_chat_template(messages, tools=template_tools(req), tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - jinja raises for conversations the template refuses
        raise invalid(f"the chat template rejected these messages: {e}", "messages") from e
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise invalid("the messages render to an empty prompt", "messages")
    return ids


def resolve_max_tokens(requested: int | None, num_prompt_tokens: int, max_model_len: int,
                       param: str = "max_tokens") -> int:
    """max_tokens checked against the context: None means the rest of it (vLLM / OpenAI chat behaviour)."""
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise invalid(f"this model's maximum context length is {max_model_len} tokens, but the prompt has "
                      f"{num_prompt_tokens} tokens; shorten the prompt", "prompt")
    if requested is None:
        return room
    if requested < 1:
        raise invalid(f"{param}={requested} is invalid; allowed: an integer >= 1", param)
    if requested > room:
        raise invalid(f"this model's maximum context length is {max_model_len} tokens; you requested "
                      f"{num_prompt_tokens + requested} ({num_prompt_tokens} in the prompt, {requested} in the "
                      f"completion); lower {param} to at most {room}", param)
    return requested


_PARAM_RE = re.compile(r"sampling parameter (\w+)=")


def structured_output(req: CompletionRequest | ChatCompletionRequest) -> StructuredOutput | None:
    """The output constraint `response_format` asks for (None: text); a 400 naming it where it is malformed."""
    fmt = getattr(req, "response_format", None)
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise invalid("response_format.json_schema is for type json_schema", "response_format.json_schema")
        return None
    if fmt.type == "json_object":
        return StructuredOutput(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise invalid("response_format type json_schema needs json_schema.schema (a JSON schema object)",
                      "response_format.json_schema")
    return StructuredOutput(json_schema=json.dumps(fmt.json_schema.schema_))


def logit_bias(req: CompletionRequest | ChatCompletionRequest) -> dict[int, float]:
    """OpenAI's `logit_bias` ({"token id": bias}) as {int: float}; a key that is not a token id is a 400 (the
    values and the ids' range are the engine's checks: SamplingParams, Engine.add_request)."""
    out: dict[int, float] = {}
    for key, bias in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise invalid(f"logit_bias key {key!r} is invalid; allowed: a token id written as a decimal integer "
                          f"string (\"50256\")", "logit_bias")
        out[int(key)] = bias
    return out


def logprobs_wanted(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """SamplingParams.logprobs of a request: None (none), or the number of alternatives beside the sampled token
    (completions: `logprobs`; chat: `top_logprobs` when `logprobs` is true)."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def _token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token's own text (a token that is part of a UTF-8 character decodes to U+FFFD, as in vLLM)."""
    if tokenizer is None:
        return [f"<{t}>" for t in ids]
    return [tokenizer.decode([t]) for t in ids]


def completion_logprobs(tokenizer, ids: list[int], logprobs: list[float], top: list | None,
                        offset: int) -> dict:
    """The legacy completions `logprobs` object of tokens `ids`: tokens, token_logprobs, top_logprobs (each
    position's alternatives and the sampled token, as vLLM gives them), text_offset (from `offset`)."""
    texts = _token_texts(tokenizer, ids)
    offsets = []
    for t in texts:
        offsets.append(offset)
        offset += len(t)
    tops = []
    for j, alts in enumerate(top if top is not None else [[] for _ in ids]):
        alt_texts = _token_texts(tokenizer, [a for a, _ in alts])
        tops.append({**dict(zip(alt_texts, (lp for _, lp in alts))), texts[j]: logprobs[j]})
    return {"tokens": texts, "token_logprobs": list(logprobs), "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, ids: list[int], logprobs: list[float], top: list | None) -> dict:
    """The chat `logprobs` object of tokens `ids`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    texts = _token_texts(tokenizer, ids)
    content = []
    for j, (text, lp) in enumerate(zip(texts, logprobs)):
        alts = top[j] if top is not None else []
        alt_texts = _token_texts(tokenizer, [a for a, _ in alts])
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")),
                        "top_logprobs": [{"token": t, "logprob": a_lp, "bytes": list(t.encode("utf-8"))}
                                         for t, (_, a_lp) in zip(alt_texts, alts)]})
    return {"content": content}


def prompt_logprobs(tokenizer, out) -> dict:
    """The completions `logprobs` object of an echoed prompt: its first token has none (nothing predicts it)."""
    ids = out.prompt_token_ids
    lps = [0.0 if x is None else x for x in out.prompt_logprobs]
    top = out.prompt_top_logprobs
    obj = completion_logprobs(tokenizer, ids, lps, None if top is None else [t or [] for t in top], 0)
    obj["token_logprobs"][0] = None
    obj["top_logprobs"][0] = None
    return obj


def join_logprobs(first: dict, then: dict) -> dict:
    """Two completions `logprobs` objects one after the other (the echoed prompt's, the completion's)."""
    return {k: first[k] + then[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def new_logprobs(out, reported: int) -> tuple[list[int], list[float], list | None]:
    """The tokens of an engine output after the first `reported`, with their logprobs and alternatives."""
    top = out.top_logprobs[reported:] if out.top_logprobs is not None else None
    return out.token_ids[reported:], (out.logprobs or [])[reported:], top


def sampling_params(req: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    """SamplingParams from the request; the engine's own validation errors become 400s naming the field."""
    top_k = None if req.top_k in (None, 0, -1) else req.top_k
    bias = logit_bias(req)
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=top_k, min_p=req.min_p,
            repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, seed=req.seed, stop=req.stop_list(),
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, min_tokens=req.min_tokens,
            logit_bias=bias, logprobs=logprobs_wanted(req),
            prompt_logprobs=req.logprobs if isinstance(req, CompletionRequest) and req.echo else None,
            structured=structured_output(req))
    except ValueError as e:
        m = _PARAM_RE.search(str(e))
        param = m.group(1) if m else None
        if param == "logprobs" and isinstance(req, ChatCompletionRequest):  # the chat API's name for the count
            param = "top_logprobs"
        raise invalid(str(e), param) from e


def usage(outs: list) -> UsageInfo:
    """The usage block over the last outputs of a request's n choices (one prompt, counted once), with the
    summed spec-decode counters when speculating."""
    n_prompt = len(outs[0].prompt_token_ids)
    n_out = sum(len(o.token_ids) for o in outs)
    specs = [s for s in (spec_counters(o) for o in outs) if s is not None]
    spec = SpecDecodeUsage(**sum(specs, SpecDecodeStats()).counters()) if specs else None
    return UsageInfo(
        prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=getattr(outs[0], "num_cached_tokens", 0) or 0),
        spec_decode=spec)


def sse(data) -> str:
    """One server-sent event carrying a pydantic model or a dict as JSON."""
    payload = data.model_dump_json(exclude_none=False) if hasattr(data, "model_dump_json") else json.dumps(data)
    return f"data: {payload}\n\n"


SSE_DONE = "data: [DONE]\n\n"

_MARK = "accel-sse-text-field"


def sse_text_template(build: Callable[[str], object]) -> Callable[[str], str]:
    """`lambda text: sse(build(text))` for a chunk builder whose chunks differ only in one text field, made fast.

    The event is rendered by pydantic once, with a marker as the text, and each token's text is spliced into it
    (json.dumps of one string). Why: building and dumping the pydantic models for every token costs far more than
    the splice, and more still right after a decode step, whose weight stream leaves the caches cold."""
    head, mark, tail = sse(build(_MARK)).partition(json.dumps(_MARK))
    if not mark or _MARK in head or _MARK in tail:  # the marker spelled elsewhere too (a model name): no splicing
        return lambda text: sse(build(text))
    return lambda text: head + json.dumps(text, ensure_ascii=False) + tail
