"""The ways models write tool calls, and the xgrammar structural tag that constrains each.

A format is a block (`open` ... `close`) holding calls (`begin(name)` arguments `end`),
several calls in one block (Mistral's JSON list, the pythonic list) or one per block
(Hermes' `<tool_call>` ... `</tool_call>`, Llama 3's bare JSON object):

    hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Qwen 2.5/3)
    llama3_json  {"name": "f", "parameters": {...}}                             (Llama 3.1+)
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, {...}]
    pythonic     [f(city="Paris", days=3), g()]                          (Llama 3.2 / 4)

The grammar (a structural tag, grammar/backend.py compiles it): under `required` or a
named function the whole output is calls; under `auto` text is free until the model
writes the format's trigger, and from there the call must be well formed, its name one of
the tools and its arguments valid against that tool's JSON schema. Arguments are JSON
with at most one whitespace character in a row (a small model left free to add spaces can
loop on them); pythonic values are JSON literals (true / false / null included).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixjax.api.tool_spec import Function, ToolRequest

_MAX_SPACES = 1


@dataclass(frozen=True)
class CallFormat:
    name: str
    trigger: str  # text that opens a block (under auto, the grammar takes over from here)
    open: str
    close: str
    begin: str  # before the arguments; {name} is the function's name
    end: str  # after the arguments
    call_sep: str  # between the calls of one block ("" : one call per block)
    block_sep: str  # between blocks
    args_key: str = "arguments"  # JSON formats: the arguments' key in the call object

    @property
    def pythonic(self) -> bool:
        return self.name == "pythonic"

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """Calls (name, arguments as a value) written in this format: an assistant
        turn of the history, for templates that do not render tool calls themselves."""
        def one(name: str, args: Any) -> str:
            if self.pythonic:
                kwargs = ", ".join(f"{k}={json.dumps(v)}" for k, v in (args or {}).items())
                return self.begin.format(name=name) + kwargs + self.end
            return self.begin.format(name=name) + json.dumps(args) + self.end
        if self.call_sep:
            return self.open + self.call_sep.join(one(n, a) for n, a in calls) + self.close
        return self.block_sep.join(self.open + one(n, a) + self.close for n, a in calls)


FORMATS = {f.name: f for f in (
    CallFormat("hermes", "<tool_call>", "<tool_call>\n", "\n</tool_call>",
               '{{"name": "{name}", "arguments": ', "}", "", "\n"),
    CallFormat("llama3_json", '{"name": ', "", "", '{{"name": "{name}", "parameters": ', "}",
               "", "; ", args_key="parameters"),
    CallFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS][", "]",
               '{{"name": "{name}", "arguments": ', "}", ", ", ""),
    CallFormat("pythonic", "[", "[", "]", "{name}(", ")", ", ", ""),
)}


def detect_format(chat_template: str | None) -> CallFormat:
    """The format a model's chat template teaches it; Hermes when the template says
    nothing (the fallback system prompt, api/tool_prompt.py, teaches Hermes)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "<|python_tag|>" in template or '"parameters"' in template:
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]


def structural_tag(fmt: CallFormat, req: ToolRequest) -> dict | None:
    """The structural tag that constrains the output under req.choice, or None (none)."""
    if req.choice == "none":
        return None
    functions = [f for f in req.functions if req.choice != "named" or f.name == req.name]
    one = req.choice == "named" or not req.parallel
    if req.choice == "auto":
        return {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": [fmt.trigger],
            "tags": _block_tags(fmt, functions, one), "stop_after_first": one}}
    if fmt.call_sep:  # required / named: the output is one block of calls
        body = _block_tags(fmt, functions, one)[0]
        return {"type": "structural_tag", "format": body}
    return {"type": "structural_tag", "format": {
        "type": "tags_with_separator", "separator": fmt.block_sep, "at_least_one": True,
        "stop_after_first": one, "tags": _block_tags(fmt, functions, one)}}


def _block_tags(fmt: CallFormat, functions: list[Function], one: bool) -> list[dict]:
    calls = [{"type": "tag", "begin": fmt.begin.format(name=f.name),
              "content": _arguments(fmt, f), "end": fmt.end} for f in functions]
    if not fmt.call_sep:  # one call per block: the block's markers go around each call
        return [dict(c, begin=fmt.open + c["begin"], end=c["end"] + fmt.close) for c in calls]
    return [{"type": "tag", "begin": fmt.open, "end": fmt.close, "content": {
        "type": "tags_with_separator", "separator": fmt.call_sep, "tags": calls,
        "at_least_one": True, "stop_after_first": one}}]


def _arguments(fmt: CallFormat, f: Function) -> dict:
    if not fmt.pythonic:
        return _json(f.parameters)
    return _keyword_args(f.parameters)


def _json(schema: Any) -> dict:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": _MAX_SPACES}


def _keyword_args(schema: dict) -> dict:
    """`a=1, b="x"` for an object schema: its properties in order, the required ones
    always, the others optional, each value a JSON literal of its own schema."""
    props = list((schema.get("properties") or {}).items())
    required = set(schema.get("required") or ())
    if not props:
        return {"type": "const_string", "value": ""}

    def after(i: int) -> list[dict]:  # properties i.. once one was written: ", p=v" each
        out = []
        for name, sub in props[i:]:
            item = {"type": "sequence", "elements": [
                {"type": "const_string", "value": f", {name}="}, _json(sub)]}
            out.append(item if name in required else {"type": "optional", "content": item})
        return out

    def first(i: int) -> dict:  # properties i.. before any was written
        if i == len(props):
            return {"type": "const_string", "value": ""}
        name, sub = props[i]
        here = {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"{name}="}, _json(sub), *after(i + 1)]}
        if name in required:
            return here
        return {"type": "or", "elements": [here, first(i + 1)]}

    return first(0)
