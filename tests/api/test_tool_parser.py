"""The tool-call parser of each format: whole text and the same text streamed in pieces
give the same content and calls; text that only looks like a call stays content."""

from __future__ import annotations

import json

import pytest

from radixjax.api.tool_formats import FORMATS
from radixjax.api.tool_parser import CallArgs, CallStart, Text, ToolCallParser, split_calls

CASES = {
    "hermes": ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": '
               '"get_time", "arguments": {}}\n</tool_call>'),
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}'
                   '; {"name": "get_time", "parameters": {}}',
    "mistral": 'I will check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '
               '"Paris", "days": [1, 2]}}, {"name": "get_time", "arguments": {}}]',
    "pythonic": 'I will check.[get_weather(city="Paris", days=[1, 2]), get_time()]',
}
WANT = [("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {})]


def stream(fmt, text: str, step: int) -> tuple[str, list[tuple[str, str]]]:
    """Feed `text` in pieces of `step` characters; assemble as the openai SDK does."""
    parser = ToolCallParser(fmt)
    deltas = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i:i + step])
    deltas += parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, Text))
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, CallStart):
            assert d.index == len(calls)  # opened in order, each once
            calls[d.index] = [d.name, ""]
        elif isinstance(d, CallArgs):
            calls[d.index][1] += d.text
    return content, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_calls_parse_whole_and_streamed_alike(name: str) -> None:
    fmt, text = FORMATS[name], CASES[name]
    content, calls = split_calls(fmt, text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == WANT
    expected = None if name == "llama3_json" else "I will check."
    assert (content.strip() if content else content) == expected
    for step in (1, 3, 7, len(text)):
        s_content, s_calls = stream(fmt, text, step)
        assert s_calls == [(c.name, c.arguments) for c in calls], step
        assert s_content.strip() == (expected or ""), step


@pytest.mark.parametrize("name, text", [
    ("hermes", "I use <tool_call> tags like this <tool_call>oops"),
    ("pythonic", "Lists look like [1, 2] and [a, b]."),
    ("llama3_json", 'A JSON object: {"name": "Bob", "age": 3}'),
    ("mistral", "no calls here"),
])
def test_text_that_only_looks_like_a_call_stays_content(name: str, text: str) -> None:
    content, calls = split_calls(FORMATS[name], text)
    assert calls == [] and content == text
    for step in (1, 4):
        assert stream(FORMATS[name], text, step) == (text, [])


def test_arguments_stream_before_the_call_ends() -> None:
    parser = ToolCallParser(FORMATS["hermes"])
    out = parser.feed('<tool_call>\n{"name": "f", "arguments": {"q": "long')
    assert [type(d) for d in out] == [CallStart, CallArgs] and out[1].text == '{"q": "long'
    assert parser.feed(' text"}}\n</tool_call>') == [CallArgs(0, ' text"}')]


def test_a_call_cut_off_keeps_its_partial_arguments() -> None:
    content, calls = split_calls(FORMATS["hermes"], '<tool_call>\n{"name": "f", '
                                 '"arguments": {"q": "cut')
    assert content is None and calls[0].arguments == '{"q": "cut'


def test_render_is_what_the_parser_reads() -> None:
    for fmt in FORMATS.values():
        text = fmt.render(WANT)
        _, calls = split_calls(fmt, text)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == WANT, fmt.name


def test_a_further_call_cut_off_in_its_header_is_dropped() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\n<tool_call>\n{"na'
    assert [(c.name, c.arguments) for c in split_calls(FORMATS["hermes"], text)[1]] == [
        ("f", "{}")]
    assert split_calls(FORMATS["hermes"], text)[0] is None


@pytest.mark.parametrize("template, name", [
    ("{{ '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
    ('<tool_call>\\n{"name": ..., "parameters": ...}', "hermes"),
    ('{{- "<|python_tag|>" }}{"name": ..., "parameters": ...}', "llama3_json"),
    ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "hermes"),
    (None, "hermes"),
])
def test_the_format_is_read_off_the_template(template, name) -> None:
    from radixjax.api.tool_formats import detect_format

    assert detect_format(template).name == name
