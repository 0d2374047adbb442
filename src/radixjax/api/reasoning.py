"""Reasoning out of a model's text (`--reasoning-parser`), incrementally: what the model
writes between <think> and </think> is `reasoning_content`, the rest `content`.

    deepseek-r1  the prompt opens the reasoning (its template ends with "<think>\\n"): the
                 output starts inside it; a leading "<think>" is dropped if written
    qwen3        reasoning only when the output opens with "<think>" (thinking may be off)

Markers split across pieces are held back until they are whole. The grammar side: a
request's constraint (tools, a response format) applies after the reasoning, see
`after_reasoning`.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixjax.api.tool_parser import partial_suffix

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    starts_inside: bool  # the prompt opened the reasoning


REASONING_FORMATS = {f.name: f for f in (ReasoningFormat("deepseek-r1", True),
                                         ReasoningFormat("qwen3", False))}


class ReasoningParser:
    def __init__(self, fmt: ReasoningFormat) -> None:
        self._state = "start"  # start | reasoning | content
        self._inside = fmt.starts_inside
        self._buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """-> (reasoning piece, content piece)."""
        self._buf += text
        reasoning = content = ""
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(START):
                self._buf, self._state = head[len(START):], "reasoning"
            elif START.startswith(head) and not final:
                return "", ""  # maybe the marker, not whole yet
            else:
                self._state = "reasoning" if self._inside else "content"
        if self._state == "reasoning":
            k = self._buf.find(END)
            if k < 0:
                keep = 0 if final else partial_suffix(self._buf, END)
                reasoning = self._buf[:len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep:]
                return reasoning, ""
            reasoning, self._buf = self._buf[:k], self._buf[k + len(END):]
            self._state = "content"
        if self._state == "content":
            content, self._buf = self._buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)

    @property
    def in_content(self) -> bool:
        return self._state == "content"


def after_reasoning(fmt: ReasoningFormat, constraint: dict | None) -> dict:
    """A structural tag: free reasoning up to </think>, then `constraint` (a structural
    tag's format, or None: free text)."""
    think = {"type": "tag", "begin": "" if fmt.starts_inside else START,
             "content": {"type": "any_text"}, "end": END}
    if not fmt.starts_inside:  # thinking may be off: the block is optional
        think = {"type": "optional", "content": think}
    rest = constraint or {"type": "any_text"}
    return {"type": "structural_tag", "format": {"type": "sequence",
                                                 "elements": [think, rest]}}
