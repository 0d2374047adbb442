"""OpenAI request parsing and validation: every bad field is an `APIError` (HTTP 4xx with
an OpenAI-style error body), never an exception from deeper down."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from radixjax.api.errors import bad
from radixjax.api.tool_spec import ToolRequest, parse_tools
from radixjax.disagg.bootstrap import FIELDS as BOOTSTRAP_FIELDS
from radixjax.disagg.bootstrap import Bootstrap, BootstrapError, parse_bootstrap
from radixjax.sampling.params import MAX_TOP_LOGPROBS, SamplingParams, SamplingParamsError


@dataclass
class Parsed:
    """A validated generation request."""

    prompt: str | list[int] | None  # completions; None for chat
    messages: list[dict[str, Any]] | None  # chat
    sampling: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    echo: bool = False
    bootstrap: Bootstrap | None = None  # a disaggregated request (disagg/bootstrap.py)
    max_tokens_given: bool = False  # the client named max_tokens (past the context: a 400)
    suffix: str | None = None  # completions: fill in the middle before this text
    tools: ToolRequest | None = None  # chat: the tools the model may call
    separate_reasoning: bool = True  # SGLang's: reasoning_content apart (a reasoning parser)
    stream_reasoning: bool = True  # SGLang's: False gives the reasoning whole when it ends


_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
           "stream", "stream_options", "seed", "frequency_penalty", "presence_penalty",
           "logprobs", "top_logprobs", "user", "ignore_eos", "logit_bias",
           "response_format", "json_schema", "regex", "ebnf",  # these three: SGLang's
           "skip_special_tokens"}
# SGLang's extensions its router fills in, accepted only at their neutral value.
_SGLANG_NEUTRAL = {"continue_final_message", "no_stop_trim", "return_hidden_states"}
_BOOTSTRAP = set(BOOTSTRAP_FIELDS)  # SGLang's router, in PD mode
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice",
                         "parallel_tool_calls", "separate_reasoning", "stream_reasoning"}
MAX_N = 16


def _typed(body: dict, name: str, types: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    kind = "a number" if float in types else f"of type {types[0].__name__}"
    if isinstance(value, bool) and bool not in types:
        raise bad(f"'{name}' must be {kind}", name)
    if not isinstance(value, types):
        raise bad(f"'{name}' must be {kind}, got {type(value).__name__}", name)
    return value


def _in_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise bad(f"'{name}' must be between {lo} and {hi}, got {value}", name)


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for name in _SGLANG_NEUTRAL & set(body):
        if body[name] not in (None, False):
            raise bad(f"'{name}' is not supported", name)
    unknown = sorted(set(body) - allowed - _SGLANG_NEUTRAL - _BOOTSTRAP)
    if unknown:
        raise bad(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    if not isinstance(body.get("model"), str):
        raise bad("'model' is required and must be a string", "model")
    if body.get("best_of") not in (None, 1):
        raise bad("'best_of' other than 1 is not supported", "best_of")


def _sampling(body: dict, max_tokens: int | None, default_max: int) -> tuple[SamplingParams,
                                                                             int, bool]:
    temperature = float(_typed(body, "temperature", (int, float), 1.0))
    _in_range("temperature", temperature, 0.0, 2.0)
    top_p = float(_typed(body, "top_p", (int, float), 1.0))
    _in_range("top_p", top_p, 1e-9, 1.0)
    min_p = float(_typed(body, "min_p", (int, float), 0.0))
    _in_range("min_p", min_p, 0.0, 1.0)
    top_k = _typed(body, "top_k", (int,), -1)
    penalties = {}
    for pen in ("frequency_penalty", "presence_penalty"):
        penalties[pen] = float(_typed(body, pen, (int, float), 0.0))
        _in_range(pen, penalties[pen], -2.0, 2.0)
    n = _typed(body, "n", (int,), 1)
    _in_range("n", n, 1, MAX_N)
    seed = _typed(body, "seed", (int,), None)
    if seed is not None:
        _in_range("seed", seed, 0, 2**31 - 1)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = tuple(stop)
    else:
        raise bad("'stop' must be a string or a list of at most 4 strings", "stop")
    if max_tokens is None:
        max_tokens = default_max
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad("'max_tokens' must be an integer >= 1", "max_tokens")
    stream = _typed(body, "stream", (bool,), False)
    ignore_eos = _typed(body, "ignore_eos", (bool,), False)
    skip_special = _typed(body, "skip_special_tokens", (bool,), True)
    bias = _typed(body, "logit_bias", (dict,), None) or {}
    try:
        sp = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, min_p=min_p, seed=seed, stop=stops,
                            ignore_eos=ignore_eos, skip_special_tokens=skip_special,
                            logit_bias=bias, **penalties, **_grammar(body))
    except SamplingParamsError as e:
        raise bad(str(e), "logit_bias" if "logit_bias" in str(e) else None) from e
    return sp, n, stream


def _grammar(body: dict) -> dict[str, Any]:
    """OpenAI `response_format` (or SGLang's `json_schema` / `regex` / `ebnf` fields) ->
    the grammar fields of SamplingParams."""
    native = {k: body[k] for k in ("json_schema", "regex", "ebnf") if body.get(k) is not None}
    fmt = body.get("response_format")
    if fmt is None or fmt == {"type": "text"}:
        return native
    if native:
        raise bad("give either 'response_format' or one of json_schema / regex / ebnf",
                  "response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":  # any JSON object: extra properties allowed
        return {"json_schema": {"type": "object"}, "json_strict": False}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
            raise bad("'response_format.json_schema' must be an object with a 'schema' object",
                      "response_format")
        strict = spec.get("strict")
        return {"json_schema": spec.get("schema", {}),
                "json_strict": bool(strict) if strict is not None else False}
    raise bad("'response_format.type' must be one of 'text', 'json_object', 'json_schema'",
              "response_format")


def _include_usage(body: dict, stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise bad("'stream_options' must be an object with 'include_usage'", "stream_options")
    if not stream:
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return bool(opts.get("include_usage", False))


def parse_completion(body: Any, default_max: int) -> Parsed:
    _check_fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("'prompt' must not be empty", "prompt")
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = list(prompt)
    else:
        raise bad("'prompt' must be a non-empty string or a list of token ids", "prompt")
    sp, n, stream = _sampling(body, body.get("max_tokens"), default_max)
    logprobs = _typed(body, "logprobs", (int,), None)
    if logprobs is not None:
        _in_range("logprobs", logprobs, 0, 5)
    suffix = _typed(body, "suffix", (str,), None) or None
    if suffix is not None and not isinstance(prompt, str):
        raise bad("'suffix' goes with a text prompt", "suffix")
    echo = _typed(body, "echo", (bool,), False)
    if echo and stream and logprobs is not None:
        raise bad("'echo' with 'logprobs' is served without streaming only", "echo")
    top = logprobs or 0
    sp = _with_logprobs(sp, logprobs is not None, top)
    if echo and logprobs is not None:  # the prompt's own logprobs come back too
        sp = replace(sp, logprob_start_len=0)
    return _with_bootstrap(body, Parsed(prompt, None, sp, n, stream,
                                        _include_usage(body, stream), logprobs is not None,
                                        top, echo,
                                        max_tokens_given=body.get("max_tokens") is not None,
                                        suffix=suffix))


def parse_chat(body: Any, default_max: int) -> Parsed:
    _check_fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    messages = [_message(m, i) for i, m in enumerate(messages)]
    tools = parse_tools(body)
    if tools is not None and tools.calls_allowed and body.get("response_format") not in (
            None, {"type": "text"}):
        raise bad("give either 'tools' or 'response_format'", "response_format")
    reasoning = {k: _typed(body, k, (bool,), True)
                 for k in ("separate_reasoning", "stream_reasoning")}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sp, n, stream = _sampling(body, max_tokens, default_max)
    logprobs = _typed(body, "logprobs", (bool,), False)
    top = _typed(body, "top_logprobs", (int,), 0)
    _in_range("top_logprobs", top, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    sp = _with_logprobs(sp, logprobs, top)
    return _with_bootstrap(body, Parsed(None, messages, sp, n, stream,
                                        _include_usage(body, stream), logprobs, top,
                                        max_tokens_given=max_tokens is not None,
                                        tools=tools, **reasoning))


def _message(m: Any, i: int) -> dict[str, Any]:
    """One chat message, checked: its content as text (text parts joined); an assistant
    turn may carry tool_calls instead of content, a tool turn answers one."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant",
                                                         "developer", "tool"):
        raise bad(f"{where} must be an object with a valid 'role'", "messages")
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise bad(f"{where}.content: only text parts are supported", "messages")
        m = dict(m, content="".join(p["text"] for p in content))
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str)
                and isinstance(c["function"].get("arguments"), str) for c in calls):
            raise bad(f"{where}.tool_calls must be a list of {{\"function\": {{\"name\", "
                      f"\"arguments\"}}}} on an assistant message", "messages")
    if not isinstance(m.get("content"), str) and not (calls and m.get("content") is None):
        raise bad(f"{where}.content must be a string", "messages")
    if m["role"] == "tool" and not isinstance(m.get("tool_call_id", ""), str):
        raise bad(f"{where}.tool_call_id must be a string", "messages")
    return m


def _with_bootstrap(body: dict, parsed: Parsed) -> Parsed:
    try:
        bootstrap = parse_bootstrap(body, 1, False)[0]
    except BootstrapError as e:
        raise bad(str(e)) from e
    if bootstrap is not None and parsed.n > 1:
        raise bad("a disaggregated request takes n = 1", "n")
    return replace(parsed, bootstrap=bootstrap)


def _with_logprobs(sp: SamplingParams, logprobs: bool, top: int) -> SamplingParams:
    from dataclasses import replace

    return replace(sp, logprobs=logprobs, top_logprobs=top)
