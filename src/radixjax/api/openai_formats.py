"""OpenAI response and stream-chunk bodies."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from radixjax.api.chat_output import ChoiceOutput
from radixjax.api.openai_protocol import Parsed
from radixjax.engine.output import GenerateOutput, StreamChunk


def usage(outs: list[GenerateOutput]) -> dict[str, Any]:
    prompt = outs[0].prompt_tokens
    completion = sum(o.completion_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": outs[0].cached_tokens}}


def _piece(tok: Any, token: int) -> str:
    return tok.decode([token]) if tok is not None else str(token)


def chat_logprobs(tok: Any, ids: list[int], lps: list[float],
                  tops: list[list[tuple[int, float]]], p: Parsed) -> dict | None:
    if not p.logprobs:
        return None
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps, strict=False)):
        s = _piece(tok, t)
        entry = {"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
        if p.top_logprobs and i < len(tops):
            entry["top_logprobs"] = [
                {"token": _piece(tok, tt), "logprob": tl, "bytes": list(_piece(tok, tt).encode())}
                for tt, tl in tops[i]]
        content.append(entry)
    return {"content": content}


def completion_logprobs(tok: Any, ids: list[int], lps: list[float],
                        tops: list[list[tuple[int, float]]], p: Parsed) -> dict | None:
    if not p.logprobs:
        return None
    tokens = [_piece(tok, t) for t in ids]
    offsets, pos = [], 0
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    top = [{_piece(tok, tt): tl for tt, tl in row} for row in tops] if p.top_logprobs else None
    return {"tokens": tokens, "token_logprobs": lps[: len(tokens)], "top_logprobs": top,
            "text_offset": offsets}


def completion_response(model: str, outs: list[GenerateOutput], tok: Any, p: Parsed,
                        prompt_ids: list[int] = ()) -> dict:
    """With p.echo, each choice starts with the prompt (its text, and its tokens'
    logprobs: None for the first, which nothing predicts)."""
    echo = echo_text(p, prompt_ids, tok) if p.echo else ""

    def logprobs(o: GenerateOutput) -> dict | None:
        if not p.echo:
            return completion_logprobs(tok, o.token_ids, o.logprobs, o.top_logprobs, p)
        tops = [row or [] for row in o.prompt_top_logprobs]
        return completion_logprobs(tok, [*prompt_ids, *o.token_ids],
                                   [*o.prompt_logprobs, *o.logprobs], [*tops, *o.top_logprobs], p)

    return {
        "id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": i, "text": echo + (o.text or ""), "finish_reason": o.finish_reason,
                     "logprobs": logprobs(o)}
                    for i, o in enumerate(outs)],
        "usage": usage(outs),
    }


def echo_text(p: Parsed, prompt_ids: list[int], tok: Any) -> str:
    """The prompt as echoed: its text, or its token ids decoded."""
    if isinstance(p.prompt, str):
        return p.prompt
    return tok.decode(list(prompt_ids)) if tok is not None else ""


def chat_response(model: str, outs: list[GenerateOutput], tok: Any, p: Parsed,
                  shape: Callable[[], ChoiceOutput]) -> dict:
    """shape(): a fresh ChoiceOutput, which splits each choice's text into reasoning,
    content and tool calls."""
    choices = []
    for i, o in enumerate(outs):
        message, finish = shape().message(o.text or "", o.finish_reason)
        choices.append({"index": i, "message": message, "finish_reason": finish,
                        "logprobs": chat_logprobs(tok, o.token_ids, o.logprobs,
                                                  o.top_logprobs, p)})
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(outs)}


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict,
               logprobs: dict | None = None, finish_reason: str | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def completion_chunk(rid: str, created: int, model: str, index: int, chunk: StreamChunk,
                     tok: Any, p: Parsed) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": index, "text": chunk.text, "finish_reason": chunk.finish_reason,
                         "logprobs": completion_logprobs(tok, chunk.token_ids, chunk.logprobs,
                                                         chunk.top_logprobs, p)}]}
