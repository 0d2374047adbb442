"""The reasoning parser: <think> ... </think> apart from the content, whole or streamed in
any pieces (markers split across pieces included), for both formats."""

from __future__ import annotations

import pytest

from radixjax.api.chat_output import ChoiceOutput
from radixjax.api.reasoning import REASONING_FORMATS, ReasoningParser
from radixjax.api.tool_formats import FORMATS

R1, QWEN3 = REASONING_FORMATS["deepseek-r1"], REASONING_FORMATS["qwen3"]


def split(fmt, text: str, step: int) -> tuple[str, str]:
    parser, thought, said = ReasoningParser(fmt), "", ""
    for i in range(0, len(text), step):
        t, s = parser.feed(text[i:i + step])
        thought, said = thought + t, said + s
    t, s = parser.finish()
    return thought + t, said + s


@pytest.mark.parametrize("fmt, text, want", [
    (R1, "Let me think.</think>The answer is 4.", ("Let me think.", "The answer is 4.")),
    (R1, "<think>Hmm</think>4", ("Hmm", "4")),
    (R1, "still thinking when cut", ("still thinking when cut", "")),
    (QWEN3, "<think>\nHmm.\n</think>\n\n4", ("\nHmm.\n", "\n\n4")),
    (QWEN3, "4, without thinking", ("", "4, without thinking")),
    (QWEN3, "<thinking is a word", ("", "<thinking is a word")),
    (QWEN3, "a </think> in the content", ("", "a </think> in the content")),
])
def test_reasoning_splits_whole_and_streamed_alike(fmt, text, want) -> None:
    for step in (1, 2, 5, len(text)):
        assert split(fmt, text, step) == want, step


def test_the_message_and_the_deltas_agree_with_tools_after_reasoning() -> None:
    text = ('I should call it.</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}'
            '\n</tool_call>')
    message, finish = ChoiceOutput(FORMATS["hermes"], R1).message(text, "stop")
    assert finish == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] == "I should call it."
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    out, deltas = ChoiceOutput(FORMATS["hermes"], R1), []
    for i in range(0, len(text), 3):
        deltas += out.feed(text[i:i + 3])
    deltas += out.finish("stop")[0]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "I should call it."
    assert "".join(c["function"]["arguments"] for d in deltas
                   for c in d.get("tool_calls", [])) == '{"a": 1}'


def test_reasoning_not_streamed_comes_whole_when_it_ends() -> None:
    out = ChoiceOutput(None, R1, stream_reasoning=False)
    assert out.feed("one ") == [] and out.feed("two</thi") == []
    assert out.feed("nk>done") == [{"reasoning_content": "one two"}, {"content": "done"}]
