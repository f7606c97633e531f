"""Tool calls over the real engine (a tiny random Llama; a Hermes / Qwen-style chat template written here): a
required or named call is constrained to the function's schema and comes back as `tool_calls`, streamed or not;
the SDK's round trip renders the call and the tool's answer back through the template."""

from __future__ import annotations

import json

import openai
import pytest

from accel.runtime.engine import Engine
from accel.server.tools import ToolMode, read_reply
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}\nCall one as <tool_call>{\"name\": ..., "
    "\"arguments\": ...}</tool_call>.<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from transformers import AutoTokenizer

    d = save_tiny_model(tmp_path_factory.mktemp("tiny-tools"), max_position_embeddings=2048)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    engine = Engine.from_pretrained(d, num_kv_blocks=512, block_size=16, max_model_len=2048)
    with serve_in_thread(engine, model_name="tiny") as running:
        yield running


def _client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_a_required_call_round_trips_through_the_sdk(served):
    c = _client(served)
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                  max_tokens=60, temperature=0.8, seed=2)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Rome") and args["unit"] in ("C", "F")
    else:
        assert call.function.name == "get_time" and args["zone"] in ("UTC", "CET")
    follow = ASK + [choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}]
    r2 = c.chat.completions.create(model="tiny", messages=follow, tools=[WEATHER, TIME], tool_choice="none",
                                   max_tokens=8, temperature=0)
    assert r2.choices[0].finish_reason == "length" and isinstance(r2.choices[0].message.content, str)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # the call and the answer were rendered


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_function_is_the_one_called(served, stream):
    c = _client(served)
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER, TIME], max_tokens=60, temperature=0.9, seed=5,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    if stream:
        chunks = [ch for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
        calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason]
        assert calls[0].index == 0 and calls[0].id
    else:
        r = c.chat.completions.create(**kw)
        calls, finish = r.choices[0].message.tool_calls, [r.choices[0].finish_reason]
    assert finish == ["tool_calls"] and len(calls) == 1 and calls[0].function.name == "get_time"
    assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")


def test_a_named_function_that_is_not_offered_is_a_400(served):
    with pytest.raises(openai.BadRequestError) as e:
        _client(served).chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=4,
                                                tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice.function.name"


def test_auto_replies_are_read_for_hermes_call_blocks():
    auto = ToolMode("auto")
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}}\n' \
           '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    content, calls = read_reply(auto, text, True)
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome", "unit": "C"}
    assert read_reply(auto, "no call here", True) == ("no call here", [])
    assert read_reply(auto, "<tool_call>{broken</tool_call>", True) == ("<tool_call>{broken</tool_call>", [])
