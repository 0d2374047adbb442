"""The structural tag of each tool-call format, compiled for the default model's
tokenizer: what the format renders is accepted, arguments off their schema or an unknown
function are not, and under `auto` free text is accepted until the trigger."""

from __future__ import annotations

import json

import pytest

from radixjax.api.tool_formats import FORMATS, structural_tag
from radixjax.api.tool_spec import parse_tools
from radixjax.grammar.backend import GrammarBackend

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture(scope="module")
def backend(smollm2):
    return GrammarBackend(smollm2.tokenizer, smollm2.cfg.vocab_size,
                          (smollm2.tokenizer.eos_token_id,))


def accepts(backend, tok, choice, fmt, text: str, end: bool = True) -> bool:
    req = parse_tools({"tools": TOOLS, "tool_choice": choice})
    compiled = backend.compile(("structural_tag", json.dumps(structural_tag(fmt, req)), True))
    m = backend.matcher(compiled)
    ok = all(m.accept(t) for t in tok(text, add_special_tokens=False).input_ids)
    return ok and (not end or m.accept(tok.eos_token_id))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_accepts_its_calls_and_refuses_bad_ones(backend, smollm2, name) -> None:
    fmt, tok = FORMATS[name], smollm2.tokenizer
    good = fmt.render([("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {})])
    one = fmt.render([("get_weather", {"city": "Paris", "days": 3})])
    assert accepts(backend, tok, "required", fmt, good)
    assert accepts(backend, tok, "auto", fmt, "Let me look. " + one)
    assert accepts(backend, tok, "auto", fmt, "No call needed.")
    assert not accepts(backend, tok, "required", fmt, "No call needed.")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert accepts(backend, tok, named, fmt, one)
    assert not accepts(backend, tok, named, fmt, good, end=False)  # a second call
    for bad in ({"city": "Paris", "unit": "kelvin"}, {"unit": "c"}, {"city": 3},
                {"city": "Paris", "days": 8}):
        assert not accepts(backend, tok, "required", fmt,
                           fmt.render([("get_weather", bad)]), end=False), bad
    assert not accepts(backend, tok, "required", fmt, fmt.render([("nope", {})]), end=False)


def test_a_constraint_applies_after_the_reasoning(backend, smollm2) -> None:
    from radixjax.api.chat_constraint import constrain_chat
    from radixjax.api.openai_protocol import parse_chat
    from radixjax.api.reasoning import REASONING_FORMATS

    tok = smollm2.tokenizer

    def accepts(body: dict, reasoning: str, text: str) -> bool:
        p = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]} | body,
                       16)
        p = constrain_chat(p, FORMATS["hermes"], REASONING_FORMATS[reasoning])
        m = backend.matcher(backend.compile(p.sampling.grammar))
        ids = tok(text, add_special_tokens=False).input_ids
        return all(m.accept(t) for t in ids) and m.accept(tok.eos_token_id)

    fmt = {"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}}}}
    assert accepts(fmt, "deepseek-r1", 'Free < thoughts {.</think>{"a": "x"}')
    assert not accepts(fmt, "deepseek-r1", "Free thoughts.</think>not json")
    assert not accepts(fmt, "deepseek-r1", '{"a": "x"}')  # the reasoning must end first
    assert accepts(fmt, "qwen3", '<think>hm</think>{"a": "y"}')
    assert accepts(fmt, "qwen3", '{"a": "y"}')  # thinking off
    call = FORMATS["hermes"].render([("get_time", {})])
    tools = {"tools": TOOLS, "tool_choice": "required"}
    assert accepts(tools, "deepseek-r1", "I need the time.</think>" + call)
    assert not accepts(tools, "deepseek-r1", "I need the time.</think>It is noon.")
