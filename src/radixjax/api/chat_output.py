"""One chat choice's text as OpenAI shapes it: reasoning (api/reasoning.py), then content
and tool calls (api/tool_parser.py), streamed as deltas or whole as a message; both come
from the same parsers, so the streamed deltas assemble into the non-streamed message.

    out = ChoiceOutput(tool_format, reasoning_format)
    out.feed(text) -> [{"reasoning_content": ...}, {"content": ...},
                       {"tool_calls": [{"index", "id", "type", "function": {"name",
                                                                            "arguments": ""}}]},
                       {"tool_calls": [{"index", "function": {"arguments": piece}}]}]
    out.finish(finish_reason) -> (deltas, finish_reason: "tool_calls" when calls were made)
"""

from __future__ import annotations

from typing import Any

from radixjax.api.reasoning import ReasoningFormat, ReasoningParser
from radixjax.api.tool_formats import CallFormat
from radixjax.api.tool_parser import CallArgs, CallStart, Delta, Text, ToolCallParser


class ChoiceOutput:
    def __init__(self, tools: CallFormat | None = None, reasoning: ReasoningFormat | None = None,
                 stream_reasoning: bool = True) -> None:
        self._tools = ToolCallParser(tools) if tools is not None else None
        self._reasoning = ReasoningParser(reasoning) if reasoning is not None else None
        self._stream_reasoning = stream_reasoning
        self._held_reasoning = ""  # not streamed: given whole when the reasoning ends

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self._reasoning is None:
            return self._content(text, final=False)
        thought, said = self._reasoning.feed(text)
        return self._thought(thought, final=self._reasoning.in_content) + self._content(
            said, final=False)

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        deltas = []
        if self._reasoning is not None:
            thought, said = self._reasoning.finish()
            deltas = self._thought(thought, final=True) + self._content(said, final=False)
        deltas += self._content("", final=True)
        if self._tools is not None and self._tools.calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return deltas, finish_reason

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any],
                                                                     str | None]:
        """The whole text -> (the assistant message, the finish reason)."""
        deltas = self.feed(text)
        more, finish_reason = self.finish(finish_reason)
        deltas += more
        content = "".join(d.get("content", "") for d in deltas)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self._reasoning is not None:
            thought = "".join(d.get("reasoning_content", "") for d in deltas)
            message["reasoning_content"] = thought or None
            message["content"] = content.lstrip() if thought else content
        if self._tools is not None and self._tools.calls:
            message["tool_calls"] = [c.as_openai() for c in self._tools.calls]
            if not content.strip():
                message["content"] = None
        return message, finish_reason

    def _thought(self, text: str, final: bool) -> list[dict[str, Any]]:
        if not self._stream_reasoning:
            self._held_reasoning += text
            if not final or not self._held_reasoning:
                return []
            text, self._held_reasoning = self._held_reasoning, ""
        return [{"reasoning_content": text}] if text else []

    def _content(self, text: str, final: bool) -> list[dict[str, Any]]:
        if self._tools is None:
            return [{"content": text}] if text else []
        pieces = self._tools.feed(text) if text else []
        if final:
            pieces += self._tools.finish()
        return _deltas(pieces)


def _deltas(pieces: list[Delta]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in pieces:
        if isinstance(p, Text):
            if out and "content" in out[-1]:
                out[-1]["content"] += p.text
            else:
                out.append({"content": p.text})
        elif isinstance(p, CallStart):
            out.append({"tool_calls": [{"index": p.index, "id": p.id, "type": "function",
                                        "function": {"name": p.name, "arguments": ""}}]})
        elif isinstance(p, CallArgs):
            out.append({"tool_calls": [{"index": p.index,
                                        "function": {"arguments": p.text}}]})
    return out
