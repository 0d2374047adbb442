"""Tool calling through the real server with the openai client (SmolLM2, whose plain
ChatML template gets the fallback tools prompt and the Hermes format): two-turn agent
loops under required, a named function and auto, streamed and not; the SDK's stream
helper assembles our deltas into the calls of the non-streamed response; every call
parses and validates against its schema; bad tools bodies are 400s naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "The weather in a city"}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME,
                                           "description": "The local time in a city"}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)


def valid_calls(message) -> list:
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments),
                            SCHEMAS[call.function.name])
    return message.tool_calls


def finish_turn(client, call, **kw) -> str:
    """The second turn: the call and its result in the history, the answer in text."""
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                       max_tokens=24, temperature=0, **kw)
    choice = r.choices[0]
    assert choice.message.content and not choice.message.tool_calls, choice
    assert choice.finish_reason in ("stop", "length")
    return choice.message.content


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_a_two_turn_agent_loop_streamed_and_not(client, choice) -> None:
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
              max_tokens=60, parallel_tool_calls=False)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = valid_calls(r.choices[0].message)
    assert len(calls) == 1 and r.choices[0].message.content is None
    if choice == NAMED:
        assert calls[0].function.name == "get_time"
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in valid_calls(streamed.message)] \
        == [(c.function.name, c.function.arguments) for c in calls]
    finish_turn(client, calls[0], tool_choice="auto")
    finish_turn(client, calls[0], tool_choice="none")


def past_call(city: str, i: int) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}]}


def test_auto_answers_in_text_or_calls_validly(client) -> None:
    """Asked plainly, SmolLM2 answers in text; after a history of calls (rendered into
    its template as the Hermes format) it calls under auto, and the call validates."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       temperature=0, max_tokens=24)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")
    history = [{"role": "user", "content": "Weather in London?"}, past_call("London", 1),
               {"role": "user", "content": "Weather in Rome?"}, past_call("Rome", 2),
               {"role": "user", "content": "Weather in Paris?"}]
    for sampling in ({"temperature": 0}, {"seed": 1}, {"seed": 2, "top_p": 0.9}):
        kw = dict(model=MODEL, messages=history, tools=TOOLS, max_tokens=60,
                  parallel_tool_calls=False, **sampling)
        r = client.chat.completions.create(**kw)
        if r.choices[0].finish_reason != "tool_calls":  # sampled, it may answer in text
            assert "temperature" not in sampling and not r.choices[0].message.tool_calls
            continue
        call = valid_calls(r.choices[0].message)[0]
        with client.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            streamed = valid_calls(stream.get_final_completion().choices[0].message)
        assert (streamed[0].function.name, streamed[0].function.arguments) == (
            call.function.name, call.function.arguments)
    finish_turn(client, call)


def test_parallel_calls_and_n_choices(client) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather and time in Oslo?"}],
        tools=TOOLS, tool_choice="required", max_tokens=120, n=3, seed=7)
    counts = []
    for choice in r.choices:
        if choice.finish_reason == "tool_calls":
            counts.append(len(valid_calls(choice.message)))
        else:  # out of tokens while calling again and again: the last call is cut off
            assert choice.finish_reason == "length"
            calls = choice.message.tool_calls
            choice.message.tool_calls = calls[:-1]
            counts.append(len(valid_calls(choice.message)) + 1)
    assert max(counts) > 1, counts  # parallel calls are allowed by default
    single = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather and time in Oslo?"}],
        tools=TOOLS, tool_choice="required", max_tokens=120, n=3, seed=7,
        parallel_tool_calls=False)
    assert all(len(valid_calls(c.message)) == 1 and c.finish_reason == "tool_calls"
               for c in single.choices)


@pytest.mark.parametrize("patch, field", [
    ({"tools": {"name": "x"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "str"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"x": 1}]}]},
     "messages"),
])
def test_bad_tools_bodies_are_400s_naming_the_field(server, patch, field) -> None:
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4} | patch
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_a_schema_xgrammar_cannot_compile_is_a_400(server) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}}}]
    r = httpx.post(server + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": ASK, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 400, r.text
