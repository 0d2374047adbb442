"""The grammar of a chat request: its tools' structural tag (api/tool_formats.py) or its
response format, applied after the reasoning when the server parses reasoning
(api/reasoning.py). Everything becomes one structural tag when reasoning comes first."""

from __future__ import annotations

import json
from dataclasses import replace

from radixjax.api.openai_protocol import Parsed
from radixjax.api.reasoning import ReasoningFormat, after_reasoning
from radixjax.api.tool_formats import CallFormat, structural_tag
from radixjax.sampling.params import SamplingParams


def constrain_chat(p: Parsed, tools: CallFormat, reasoning: ReasoningFormat | None) -> Parsed:
    sp = p.sampling
    if p.tools is not None and p.tools.calls_allowed:
        inner = structural_tag(tools, p.tools)["format"]
    elif sp.grammar is not None and reasoning is not None:
        inner = _as_format(sp)
    else:
        return p  # no constraint, or a plain grammar with nothing before it
    tag = (after_reasoning(reasoning, inner) if reasoning is not None
           else {"type": "structural_tag", "format": inner})
    return replace(p, sampling=replace(sp, json_schema=None, regex=None, ebnf=None,
                                       structural_tag=json.dumps(tag)))


def _as_format(sp: SamplingParams) -> dict:
    kind, source, _ = sp.grammar
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": json.loads(source),
                "max_whitespace_cnt": 1}
    if kind == "regex":
        return {"type": "regex", "pattern": source}
    return {"type": "grammar", "grammar": source}  # ebnf (chat takes no structural tag)
