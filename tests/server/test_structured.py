"""Structured output over HTTP: OpenAI `response_format` (json_schema with strict,
json_object) through the official client, streamed and not; SGLang-style `regex` /
`ebnf` fields on the OpenAI and native endpoints; a schema, regex or grammar that does not
compile is a 400 carrying the compiler's message, and the server keeps serving."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL, wait_idle

CITY = {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20},
                       "population": {"type": "integer", "minimum": 0},
                       "country": {"enum": ["France", "Germany", "Spain"]}},
        "required": ["city", "population", "country"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe the capital of France as JSON."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


def test_response_format_json_schema_strict_and_streamed(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt,
                                       max_tokens=64, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt,
                                            max_tokens=64, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content


def test_response_format_json_object_and_sampled_n(client) -> None:
    """Greedy: a whole JSON object. Sampled, n = 3: each choice a whole object, or one
    cut at max_tokens (the model may wander on inside a string or an array)."""
    fmt = {"type": "json_object"}
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=96,
                                       temperature=0, response_format=fmt)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=96, n=3, seed=5,
                                       temperature=0.9, response_format=fmt)
    assert len(r.choices) == 3
    for choice in r.choices:
        text = choice.message.content
        if choice.finish_reason == "length":
            assert text.lstrip().startswith("{"), text
        else:
            assert choice.finish_reason == "stop" and isinstance(json.loads(text), dict), text


def test_regex_and_ebnf_fields(server, client) -> None:
    r = client.completions.create(model=MODEL, prompt="My phone number is", max_tokens=24,
                                  temperature=0, extra_body={"regex": r"\(\d{3}\) \d{3}-\d{4}"})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].text)
    body = {"text": "Is water wet? Answer:", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ebnf": 'root ::= " yes" | " no"'}}
    out = httpx.post(server + "/generate", json=body, timeout=120).json()
    assert out["text"] in (" yes", " no")


@pytest.mark.parametrize("extra, words", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "bogus"),
    ({"regex": "a(b"}, "parenthesis"),
    ({"ebnf": "root ::= undefined_rule"}, "undefined_rule"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": "nope"}}, "json_schema"),
    ({"regex": "a", "response_format": {"type": "json_object"}}, "either"),
], ids=["schema", "regex", "ebnf", "unknown-type", "not-an-object", "two-grammars"])
def test_bad_grammar_is_a_400(server, extra, words) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8} | extra
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"


def test_still_serves_after_bad_grammars(server, client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].message.content
    stats = wait_idle(server)
    assert stats["kv_held"] == 0
