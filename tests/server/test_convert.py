"""The SSE event fast path: a chunk rendered once and each token's text spliced in reads back as pydantic's."""

from __future__ import annotations

import json

import pytest

from accel.server import convert
from accel.server.protocol import ChatCompletionChunk, ChatStreamChoice, CompletionChoice, CompletionResponse, \
    DeltaMessage


def chat(model: str):
    return lambda text: ChatCompletionChunk(id="chatcmpl-1", created=5, model=model, choices=[
        ChatStreamChoice(index=2, delta=DeltaMessage(content=text))])


def completion(text: str):
    return CompletionResponse(id="cmpl-1", created=5, model="m", choices=[CompletionChoice(index=0, text=text)])


@pytest.mark.parametrize("text", [" the", "", 'q"uote \\ back\nslash\ttab \x01 \x7f', "é 中文 🙂", "accel-sse-text"])
@pytest.mark.parametrize("build", [chat("m"), completion])
def test_spliced_events_read_back_as_pydantic_renders_them(build, text):
    event = convert.sse_text_template(build)(text)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[6:]) == json.loads(convert.sse(build(text))[6:])


def test_a_model_name_that_spells_the_marker_falls_back_to_rendering_every_chunk():
    build = chat(convert._MARK)
    event = convert.sse_text_template(build)("x")
    assert event == convert.sse(build("x"))
    assert json.loads(event[6:])["model"] == convert._MARK
