"""Tool calls out of a model's text, incrementally: fed the text as it streams, it gives
content pieces, each call's opening (index, id, name) and its arguments in pieces; the
non-streamed response runs the same parser over the whole text, so both assemble into
the same calls.

    parser = ToolCallParser(FORMATS["hermes"])
    parser.feed('Sure.<tool_call>\\n{"name": "f", "arguments": {"a"')
        -> [Text("Sure."), CallStart(0, "call_...", "f"), CallArgs(0, '{"a"')]
    parser.feed(': 1}}\\n</tool_call>') -> [CallArgs(0, ': 1}')]
    parser.finish() -> []        parser.calls -> [ToolCall(0, "call_...", "f", '{"a": 1}')]

Text that opens like a call but is not one (a trigger the header does not follow, e.g. a
`[` in pythonic prose) stays content. Arguments are the JSON text the model wrote (the
grammar keeps it valid); pythonic keyword arguments come back as a JSON object.
"""

from __future__ import annotations

import ast
import json
import uuid
from dataclasses import dataclass
from typing import Any

import regex

from radixjax.api.tool_formats import CallFormat


@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    text: str


Delta = Text | CallStart | CallArgs


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def _loose(literal: str) -> str:
    """A regex for `literal` where each run of whitespace may be any whitespace."""
    parts = regex.split(r"\s+", literal)
    return r"\s*".join(regex.escape(p) for p in parts)


def _patterns(fmt: CallFormat) -> tuple[Any, Any, Any]:
    """(block opening with the first call's header, a further call's header in the same
    block, the end of a call and what follows it)."""
    if fmt.pythonic:
        header = r"\s*(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)\("
        end = r"\s*"
    else:
        header = (r"\s*\{\s*\"name\"\s*:\s*\"(?P<name>[^\"]{1,64})\"\s*,\s*"
                  r"\"(?:arguments|parameters)\"\s*:\s*")
        end = r"\s*\}\s*"
    sep = _loose(fmt.call_sep.strip()) if fmt.call_sep else None
    close = _loose(fmt.close.strip()) if fmt.close.strip() else ""
    after = f"(?:(?P<sep>{sep})|(?P<close>{close}))" if sep else f"(?P<close>{close})"
    return (regex.compile(_loose(fmt.open.strip()) + header),
            regex.compile((sep or r"(?!)") + header), regex.compile(end + after))


class ToolCallParser:
    def __init__(self, fmt: CallFormat) -> None:
        self.fmt = fmt
        self._open, self._next, self._end = _patterns(fmt)
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._state = "text"  # text | header | args | end
        self._first_header = True
        self._sent_args = 0  # characters of the current call's arguments given out
        self._held_space = ""  # whitespace after a call, kept unless text follows

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Delta]:
        """The end of the text: what was held back, as what it turned out to be."""
        out: list[Delta] = []
        while self._step(out, final=True):
            pass
        # what is left: arguments cut off (max_tokens), or a further call's header cut off
        if self._state == "args" and self._buf[self._sent_args:]:
            out.append(self._args(self._buf[self._sent_args:]))
        self._buf = ""
        return [d for d in out if not isinstance(d, Text) or d.text]

    def _text(self, out: list[Delta], text: str) -> None:
        if self.calls and not text.strip(_SPACE + self.fmt.block_sep):  # between calls
            self._held_space += text
            return
        out.append(Text(self._held_space + text))
        self._held_space = ""

    def _args(self, text: str) -> CallArgs:
        call = self.calls[-1]
        call.arguments += text
        return CallArgs(call.index, text)

    def _step(self, out: list[Delta], final: bool) -> bool:
        """Consume what can be decided from the buffer; True to go on."""
        buf = self._buf
        if self._state == "text":
            k = buf.find(self.fmt.trigger)
            if k < 0:
                keep = 0 if final else partial_suffix(buf, self.fmt.trigger)
                if len(buf) > keep:
                    self._text(out, buf[:len(buf) - keep])
                    self._buf = buf[len(buf) - keep:]
                return False
            if k:
                self._text(out, buf[:k])
            self._buf, self._state, self._first_header = buf[k:], "header", True
            return True
        if self._state == "header":
            pattern = self._open if self._first_header else self._next
            m = pattern.match(buf, partial=True)
            if m is not None and m.partial:  # a header, not whole yet
                if not final:
                    return False
                if self.calls:  # a further call cut off in its header (max_tokens)
                    self._buf = ""
                    return False
                m = None
            if m is None:
                if self._first_header:  # not a call after all: the trigger is text
                    n = len(self.fmt.trigger)
                    self._text(out, buf[:n])
                    self._buf, self._state = buf[n:], "text"
                    return True
                self._state = "text"  # what follows the separator is not a call
                return True
            call = ToolCall(len(self.calls), "call_" + uuid.uuid4().hex[:24], m["name"])
            self.calls.append(call)
            out.append(CallStart(call.index, call.id, call.name))
            self._buf, self._state, self._sent_args = buf[m.end():], "args", 0
            return True
        if self._state == "args":
            if not self._sent_args:  # the header's trailing whitespace, seen late
                buf = self._buf = buf.lstrip()
            end = self._pythonic_end(buf) if self.fmt.pythonic else _json_end(buf)
            if end is None:
                if not self.fmt.pythonic and buf.strip():  # all of it is argument text
                    out.append(self._args(buf[self._sent_args:]))
                    self._sent_args = len(buf)
                return False
            if self.fmt.pythonic:
                out.append(self._args(_kwargs_json(buf[:end])))
                end += 1  # the ")"
            elif end > self._sent_args:
                out.append(self._args(buf[self._sent_args:end]))
            self._buf, self._state = buf[end:], "end"
            return True
        # "end": the call's closing, then another call of the block or the block's close
        m = self._end.match(buf, partial=not final)
        if m is None:
            self._state = "text"  # malformed closing: what follows is text
            return True
        if m.partial:
            return False
        self._buf = buf[m.end():]
        self._state = "header" if m.groupdict().get("sep") else "text"
        self._first_header = False
        if self._state == "header":  # the separator is part of the next header's match
            self._buf = buf[m.start("sep"):]
        return True

    @staticmethod
    def _pythonic_end(buf: str) -> int | None:
        """Index of the `)` closing the keyword arguments, or None (not yet)."""
        depth, quote, escaped = 0, None, False
        for i, c in enumerate(buf):
            if quote:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    return i if c == ")" else None
                depth -= 1
        return None


_SPACE = " \t\r\n"


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _json_end(buf: str) -> int | None:
    """End index of the JSON value at the start of buf (after whitespace), or None while
    it is incomplete. A bare number is complete only once something follows it."""
    start = len(buf) - len(buf.lstrip())
    try:
        _, end = json.JSONDecoder().raw_decode(buf, start)
    except json.JSONDecodeError:
        return None
    if end == len(buf) and buf[start] not in "{[\"":
        return None
    return end


_LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False,
             "None": None}


def _kwargs_json(text: str) -> str:
    """`a=1, b="x"` -> '{"a": 1, "b": "x"}' (values: Python or JSON literals)."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        args = {kw.arg: _literal(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError):
        return json.dumps({"_unparsed": text})
    return json.dumps(args, ensure_ascii=False)


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _LITERALS:
        return _LITERALS[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def split_calls(fmt: CallFormat, text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole text -> (its content, None when only calls; the calls)."""
    parser = ToolCallParser(fmt)
    deltas = parser.feed(text) + parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, Text))
    if parser.calls and not content.strip():
        return None, parser.calls
    return content, parser.calls
