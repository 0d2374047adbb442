"""The program's expressions: what `s += ...` takes. Plain frozen values; the program
state (lang/state.py) interprets them in order.

    "text"                    appended as is
    gen(name, ...)            the model continues the text (stored as s[name])
    select(name, choices)     the most likely choice is appended (lang/choices.py)
    user(expr) / system / assistant
                              a chat turn: the role's markers around expr
    [expr, ...], a + b        in order (a Seq)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Union

from radixjax.api.errors import APIError
from radixjax.api.tool_formats import FORMATS, structural_tag
from radixjax.api.tool_prompt import fallback_system
from radixjax.api.tool_spec import parse_tools
from radixjax.lang.choices import ChoiceMethod, token_length_normalized

# A gen's dtype: the regex its text must match (the grammar ends the text there); a
# leading space is allowed, as the model writes one after "A:" (int(" 4") still parses).
DTYPE_REGEX = {
    "int": r" ?-?[0-9]{1,18}",
    "float": r" ?-?[0-9]{1,15}(\.[0-9]{1,15})?",
    "bool": r" ?(True|False)",
    "str": r' ?"[^"\\\n]{0,256}"',
}
SAMPLING_NAMES = ("max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p",
                  "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
                  "regex", "json_schema", "seed")
LOGPROB_NAMES = ("return_logprob", "logprob_start_len", "top_logprobs_num",
                 "return_text_in_logprobs")


class Node:
    """An expression; `+` with text or another expression makes a Seq (in order)."""

    def __add__(self, other: Any) -> Seq:
        return Seq((*_parts(self), *_parts(other)))

    def __radd__(self, other: Any) -> Seq:
        return Seq((*_parts(other), *_parts(self)))


def _parts(x: Any) -> tuple:
    if isinstance(x, Seq):
        return x.parts
    if isinstance(x, str | Node):
        return (x,)
    if isinstance(x, list | tuple):
        return tuple(p for item in x for p in _parts(item))
    raise TypeError(f"cannot add a {type(x).__name__} to a program expression")


@dataclass(frozen=True)
class Seq(Node):
    parts: tuple  # of str and Node, run in order


@dataclass(frozen=True)
class Gen(Node):
    name: str | None
    sampling: dict[str, Any]  # SGLang's sampling_params names; None: the run's default
    logprobs: dict[str, Any] = field(default_factory=dict)  # LOGPROB_NAMES given
    tool_format: str | None = None  # with tools: the calls are parsed into the meta info


@dataclass(frozen=True)
class Select(Node):
    name: str | None
    choices: tuple[str, ...]
    method: ChoiceMethod = token_length_normalized


@dataclass(frozen=True)
class RoleBegin(Node):
    role: str


@dataclass(frozen=True)
class RoleEnd(Node):
    role: str


Expr = Union[str, Node, list]  # noqa: UP007 (a runtime alias)


def gen(name: str | None = None, max_tokens: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None, min_p: float | None = None,
        frequency_penalty: float | None = None, presence_penalty: float | None = None,
        ignore_eos: bool | None = None, regex: str | None = None,
        json_schema: str | dict | None = None, dtype: type | str | None = None,
        choices: list[str] | None = None, choices_method: ChoiceMethod | None = None,
        seed: int | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, tools: list[dict] | None = None,
        tool_choice: str | dict = "auto", parallel_tool_calls: bool = True,
        tool_format: str = "hermes") -> Gen | Select:
    """The model continues the program's text; the result is `s[name]`. With `choices`,
    a `select`. dtype (int, float, bool, str or their names) constrains the text to that
    type's literal (s[name] is still the text, as in SGLang). With `tools` (OpenAI's
    tool objects; tell the model about them first, e.g. `system(tools_prompt(tools))`),
    the calls it writes in `tool_format` are constrained as on the server (a call names a
    tool, its arguments follow the schema; `tool_choice` as OpenAI's) and parsed into
    `s.get_meta_info(name)["tool_calls"]` (OpenAI's shape)."""
    if choices is not None:
        return select(name, choices, choices_method or token_length_normalized)
    if dtype is not None:
        key = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", "")
        if key not in DTYPE_REGEX:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEX)}, got {dtype!r}")
        regex = DTYPE_REGEX[key]
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)
    given = dict(max_new_tokens=max_tokens, stop=stop, stop_token_ids=stop_token_ids,
                 temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                 frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                 ignore_eos=ignore_eos, regex=regex, json_schema=json_schema, seed=seed,
                 structural_tag=_tools_tag(tools, tool_choice, parallel_tool_calls,
                                           tool_format))
    logprobs = dict(return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                    top_logprobs_num=top_logprobs_num,
                    return_text_in_logprobs=return_text_in_logprobs)
    return Gen(name, given, {k: v for k, v in logprobs.items() if v is not None},
               tool_format if tools else None)


def _tools_tag(tools: list[dict] | None, choice: str | dict, parallel: bool,
               fmt: str) -> str | None:
    """The structural tag that constrains the calls, as JSON text (None: no tools)."""
    if not tools:
        return None
    if fmt not in FORMATS:
        raise ValueError(f"tool_format must be one of {sorted(FORMATS)}, got {fmt!r}")
    try:
        req = parse_tools({"tools": tools, "tool_choice": choice,
                           "parallel_tool_calls": parallel})
    except APIError as e:
        raise ValueError(e.message) from None
    tag = structural_tag(FORMATS[fmt], req) if req is not None else None
    return json.dumps(tag) if tag is not None else None


def tools_prompt(tools: list[dict], tool_format: str = "hermes") -> str:
    """The text that tells a model about `tools` and how to call them (the server's
    fallback system prompt, api/tool_prompt.py), for `system(...)`."""
    return fallback_system(parse_tools({"tools": tools}), FORMATS[tool_format])


def gen_int(name: str | None = None, **kwargs: Any) -> Gen:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Gen:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None,
           choices_method: ChoiceMethod = token_length_normalized,
           temperature: float = 0.0) -> Select:
    """Append the choice the model finds most likely after the text (scored by
    `choices_method` from prompt logprobs); the result is `s[name]`."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select needs a list of non-empty strings")
    if temperature > 1e-5:
        raise ValueError("select picks by likelihood: temperature must be 0")
    return Select(name, tuple(choices), choices_method)


def _role(role: str, expr: Expr | None) -> Seq:
    return Seq((RoleBegin(role), *(() if expr is None else _parts(expr)), RoleEnd(role)))


def system(expr: Expr | None = None) -> Seq:
    return _role("system", expr)


def user(expr: Expr | None = None) -> Seq:
    return _role("user", expr)


def assistant(expr: Expr | None = None) -> Seq:
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
