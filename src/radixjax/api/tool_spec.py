"""OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, validated into a ToolRequest;
each bad field is a 400 naming it.

    tools:        [{"type": "function", "function": {"name", "description"?,
                                                    "parameters"?, "strict"?}}]
    tool_choice:  "none" | "auto" (the default with tools) | "required"
                  | {"type": "function", "function": {"name": ...}}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from radixjax.api.errors import bad

MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict  # a JSON schema (an empty object schema when not given)

    def as_tool(self) -> dict:
        """The OpenAI tool object (what chat templates and the fallback prompt show)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolRequest:
    functions: tuple[Function, ...]
    choice: Literal["none", "auto", "required", "named"]
    name: str | None  # the named function
    parallel: bool  # more than one call in a turn

    @property
    def calls_allowed(self) -> bool:
        return self.choice != "none"


def parse_tools(body: dict) -> ToolRequest | None:
    """None when the request has no tools (a tool_choice without them is a 400)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("'tool_choice' is only allowed when 'tools' are specified",
                      "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    functions = tuple(_function(t, i) for i, t in enumerate(tools))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise bad("'tools' names a function twice", "tools")
    if not functions:
        if choice not in (None, "none", "auto"):
            raise bad("'tool_choice' needs at least one tool", "tool_choice")
        return None
    if choice is None or choice in ("none", "auto", "required"):
        return ToolRequest(functions, choice or "auto", None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(
            choice.get("function"), dict) and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
        if name not in names:
            raise bad(f"'tool_choice' names the function '{name}', which is not in 'tools'",
                      "tool_choice")
        return ToolRequest(functions, "named", name, parallel)
    raise bad("'tool_choice' must be 'none', 'auto', 'required' or "
              "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


def _function(tool: Any, i: int) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(
            tool.get("function"), dict):
        raise bad(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}",
                  where)
    fn = tool["function"]
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise bad(f"'{where}.function' has unknown fields: {', '.join(sorted(unknown))}",
                  f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad(f"'{where}.function.name' must be 1-64 letters, digits, '_' or '-'",
                  f"{where}.function.name")
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise bad(f"'{where}.function.description' must be a string",
                  f"{where}.function.description")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise bad(f"'{where}.function.parameters' must be a JSON schema of an object",
                  f"{where}.function.parameters")
    if not isinstance(fn.get("strict", False), bool | None):
        raise bad(f"'{where}.function.strict' must be a boolean", f"{where}.function.strict")
    try:
        json.dumps(params)
    except (TypeError, ValueError) as e:
        raise bad(f"'{where}.function.parameters': {e}", f"{where}.function.parameters") from e
    return Function(name, description, params)
