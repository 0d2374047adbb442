"""A chat with tools, as the chat template gets it.

A template that reads a `tools` variable (Qwen, Llama 3.1+, Mistral, Hermes ...) gets the
tools there and renders them its own way. A template without one (SmolLM2's plain ChatML)
gets the fallback: a system prompt of ours listing the tools as JSON and showing one call
in the parser's format, so the model writes what the parser and the grammar expect.

History: a template that renders assistant `tool_calls` and `tool` messages itself gets
them as HF templates expect them (arguments as objects); for one that does not, calls
become the assistant's text in the call format and tool results become user turns
wrapped in <tool_response> tags (the fallback prompt says so).
"""

from __future__ import annotations

import json
from typing import Any

from radixjax.api.tool_formats import CallFormat
from radixjax.api.tool_spec import ToolRequest

FALLBACK_SYSTEM = (
    "You can call functions to answer. The functions, with JSON schemas of their "
    "arguments, are listed between <tools> and </tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with the call alone, written like this:\n{example}\n"
    "Use only the functions listed, with arguments that follow their schema. Results come "
    "back between <tool_response> and </tool_response>.")


def template_reads_tools(template: str | None) -> bool:
    return "tools" in (template or "")


def template_reads_tool_calls(template: str | None) -> bool:
    return "tool_calls" in (template or "")


def chat_for_template(messages: list[dict], tools: ToolRequest | None, fmt: CallFormat,
                      template: str | None) -> tuple[list[dict], dict[str, Any]]:
    """(messages, extra apply_chat_template arguments) for this template."""
    messages = _history(messages, fmt, template)
    if tools is None or not tools.calls_allowed:
        return messages, {}
    if template_reads_tools(template):
        return messages, {"tools": [f.as_tool() for f in tools.functions]}
    system = fallback_system(tools, fmt)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{system}")
        return [first, *messages[1:]], {}
    return [{"role": "system", "content": system}, *messages], {}


def fallback_system(tools: ToolRequest, fmt: CallFormat) -> str:
    """Our system prompt for a template without a `tools` variable: the tools as JSON and
    one call shown in `fmt`."""
    return FALLBACK_SYSTEM.format(
        tools="\n".join(json.dumps(f.as_tool()) for f in tools.functions),
        example=fmt.render([("function_name", {"argument": "value"})]))


def _history(messages: list[dict], fmt: CallFormat, template: str | None) -> list[dict]:
    native = template_reads_tool_calls(template)
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and calls:
            pairs = [(c["function"]["name"], _arguments(c["function"]["arguments"]))
                     for c in calls]
            if native:
                m = dict(m, content=m.get("content") or "", tool_calls=[
                    {**c, "function": {"name": n, "arguments": a}}
                    for c, (n, a) in zip(calls, pairs, strict=True)])
            else:
                text = m.get("content") or ""
                m = {"role": "assistant", "content": text + fmt.render(pairs)}
        elif m["role"] == "tool" and not native:
            m = {"role": "user",
                 "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        elif m.get("content") is None:
            m = dict(m, content="")
        out.append(m)
    return out


def _arguments(text: str) -> Any:
    """A call's arguments (JSON text, as OpenAI sends them) as a value."""
    try:
        return json.loads(text)
    except ValueError:
        return text
