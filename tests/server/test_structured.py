"""Structured outputs through the OpenAI API over the real engine (a tiny random Llama and tokenizer built here):
whatever the model would say, the reply parses and validates, in a batch beside unconstrained requests that stay
as they are alone; the openai SDK's `parse` returns the pydantic object."""

from __future__ import annotations

import json
import threading
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams, StructuredOutput
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread


class Verdict(BaseModel):
    ok: bool
    color: Literal["red", "green", "blue"]
    size: Literal["small", "large"]


SCHEMA = {"type": "object", "properties": {"name": {"enum": ["fox", "dog"]}, "quick": {"type": "boolean"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "quick", "tags"], "additionalProperties": False}
MSGS = [{"role": "user", "content": "Describe the fox as JSON."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = save_tiny_model(tmp_path_factory.mktemp("tiny-structured"))
    engine = Engine.from_pretrained(d, num_kv_blocks=128, block_size=16, max_model_len=256)
    plain = engine.generate("The quick brown fox", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    with serve_in_thread(engine, model_name="tiny") as running:
        running.plain = plain
        yield running


def _client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_the_sdks_parse_returns_the_pydantic_object(served):
    r = _client(served).chat.completions.parse(model="tiny", messages=MSGS, response_format=Verdict, max_tokens=60,
                                               temperature=0.7, seed=3)
    msg = r.choices[0].message
    assert isinstance(msg.parsed, Verdict) and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_and_json_object_replies_parse_and_validate(served, stream):
    import jsonschema

    c = _client(served)
    for fmt in ({"type": "json_schema", "json_schema": {"name": "fox", "schema": SCHEMA, "strict": True}},
                {"type": "json_object"}):
        kw = dict(model="tiny", messages=MSGS, max_tokens=120, temperature=0.9, seed=1, response_format=fmt)
        if stream:
            chunks = list(c.chat.completions.create(stream=True, **kw))
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        else:
            r = c.chat.completions.create(**kw)
            text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
        if fmt["type"] == "json_schema":  # bounded: it always ends within max_tokens
            assert finish == ["stop"]
            jsonschema.validate(json.loads(text), SCHEMA)
        elif finish == ["stop"]:  # any object: a random model's string may run out of tokens first
            assert isinstance(json.loads(text), dict)
        else:
            assert finish == ["length"] and text.startswith("{")


def test_constrained_and_free_requests_share_a_batch_and_the_free_ones_are_unchanged(served):
    c = _client(served)
    results: dict = {}

    def free(i):
        results[("free", i)] = c.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=12,
                                                    temperature=0, extra_body={"ignore_eos": True}).choices[0].text

    def constrained(i):
        r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=120, temperature=0.8, seed=i,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": "fox", "schema": SCHEMA}})
        results[("json", i)] = r.choices[0].message.content

    threads = [threading.Thread(target=f, args=(i,)) for i in range(4) for f in (free, constrained)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[("free", i)] == served.plain.text for i in range(4))
    assert all(isinstance(json.loads(results[("json", i)]), dict) for i in range(4))


def test_a_schema_the_grammar_engine_cannot_compile_is_a_400(served):
    with pytest.raises(openai.BadRequestError) as e:
        _client(served).chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert e.value.body["param"] == "response_format"


def test_structured_output_rejects_a_schema_that_is_not_an_object():
    with pytest.raises(ValueError, match="must be a JSON object"):
        StructuredOutput(json_schema="[1, 2]")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutput()
