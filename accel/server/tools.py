"""Tool calls: OpenAI's `tools` / `tool_choice` through the model's own chat template.

- The tools and the conversation's earlier calls (`tool_calls`, `tool` messages) are rendered by the chat template,
  as transformers' `apply_chat_template(tools=...)` does; a template that never reads `tools` refuses them (400).
- `tool_choice` "required" or a named function: the reply is constrained (`runtime.structured`) to one call,
  `{"name": ..., "arguments": {...}}`, its arguments to the function's parameters schema, and returned as
  `tool_calls` (vLLM's way for forced calls, whatever the model's own call syntax).
- "auto" (the default with tools): the model decides; its reply is read for `<tool_call>{"name", "arguments"}
  </tool_call>` blocks, the syntax of the Hermes / Qwen templates, which is required of the template (others would
  have their calls returned as text: refused instead). "none": the tools are shown, no call is read.
Calls found make `finish_reason` "tool_calls"; a streamed reply sends them as one delta when the reply ends.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from accel.server.protocol import ChatCompletionRequest, invalid

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.S)


@dataclass(frozen=True)
class ToolMode:
    """How a chat request's reply is read: "forced" (one constrained call, `schema`), "auto" (Hermes blocks), or
    "none" (text)."""

    kind: str
    schema: dict | None = None


def template_tools(req: ChatCompletionRequest) -> list[dict] | None:
    """The request's tools as chat templates take them (OpenAI's shape)."""
    if not req.tools:
        return None
    return [{"type": "function", "function": t.function.model_dump(exclude_none=True)} for t in req.tools]


def template_messages(req: ChatCompletionRequest) -> list[dict]:
    """The messages as chat templates take them: text content, an assistant's calls with their arguments as objects
    (Hermes / Qwen templates write `arguments | tojson`), a tool message's call id."""
    out = []
    for i, m in enumerate(req.messages):
        msg: dict = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                try:
                    args = json.loads(c.function.arguments)
                except ValueError:
                    raise invalid(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON",
                                  f"messages.{i}.tool_calls.{j}.function.arguments") from None
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            msg["tool_calls"] = calls
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def tool_mode(req: ChatCompletionRequest, chat_template: str | None) -> ToolMode:
    """How this request's reply is read; a 400 for a choice the request or the template cannot honour."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise invalid(f"tool_choice {_name(choice)!r} needs tools", "tool_choice")
        if req.parallel_tool_calls is not None:
            raise invalid("parallel_tool_calls needs tools", "parallel_tool_calls")
        return ToolMode("none")
    if "tools" not in (chat_template or ""):
        raise invalid("this model's chat template has no tool support (it never reads `tools`); omit tools",
                      "tools")
    names = [t.function.name for t in req.tools]
    if len(set(names)) != len(names):
        raise invalid(f"tools name a function twice: {names}", "tools")
    if choice == "none":
        return ToolMode("none")
    if choice in (None, "auto"):
        if CALL_OPEN not in (chat_template or ""):
            raise invalid("tool_choice auto reads the model's calls as <tool_call> blocks, which this chat "
                          "template does not write; use tool_choice required or a named function", "tool_choice")
        if req.response_format is not None and req.response_format.type != "text":
            raise invalid("response_format and tools with tool_choice auto cannot both hold", "response_format")
        return ToolMode("auto")
    if req.response_format is not None and req.response_format.type != "text":
        raise invalid("response_format and a required tool call cannot both hold", "response_format")
    tools = req.tools if choice == "required" else [t for t in req.tools if t.function.name == choice.function.name]
    if not tools:
        raise invalid(f"tool_choice names {choice.function.name!r}, which is not among tools {names}",
                      "tool_choice.function.name")
    options = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                 "arguments": t.function.parameters or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return ToolMode("forced", options[0] if len(options) == 1 else {"anyOf": options})


def _name(choice) -> str:
    return choice if isinstance(choice, str) else f"function {choice.function.name}"


def _call(name: str, arguments) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def read_reply(mode: ToolMode, text: str, finished_by_stop: bool) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a reply under `mode`. A forced call cut off by max_tokens stays text."""
    if mode.kind == "forced" and finished_by_stop:
        value = json.loads(text)
        return None, [_call(value["name"], value["arguments"])]
    if mode.kind != "auto" or CALL_OPEN not in text:
        return text, []
    calls = []
    for block in _CALL_RE.findall(text):
        try:
            value = json.loads(block)
            calls.append(_call(value["name"], value.get("arguments", {})))
        except (ValueError, KeyError, TypeError):
            return text, []  # not a well-formed call: the reply stays text
    content = text[:text.index(CALL_OPEN)].strip()
    return (content or None), calls
