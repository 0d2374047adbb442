"""OpenAI's API: /v1/models, /v1/completions, /v1/chat/completions (streamed or not, n
samples, usage), parsed by api/openai_protocol.py and shaped by api/openai_formats.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radixjax.api.chat_constraint import constrain_chat
from radixjax.api.chat_output import ChoiceOutput
from radixjax.api.errors import APIError, bad
from radixjax.api.openai_formats import (
    chat_chunk,
    chat_logprobs,
    chat_response,
    completion_chunk,
    completion_response,
    echo_text,
    usage,
)
from radixjax.api.openai_protocol import Parsed, parse_chat, parse_completion
from radixjax.engine.output import GenerateOutput, StreamChunk
from radixjax.server.context import Emit, ServerContext, sse_stream, while_connected
from radixjax.server.limits import Ticket

FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")  # StarCoder's, SmolLM2's


def fim_tokens(tok: Any) -> tuple[int, int, int]:
    """The model's fill-in-the-middle token ids, or a 400 naming the missing ones."""
    vocab = tok.get_vocab() if tok is not None else {}
    missing = [t for t in FIM if t not in vocab]
    if missing:
        raise bad(f"'suffix' needs the model's fill-in-the-middle tokens; this model has "
                  f"no {', '.join(missing)}", "suffix")
    return vocab[FIM[0]], vocab[FIM[1]], vocab[FIM[2]]


def openai_routes(ctx: ServerContext) -> list[Route]:
    config, tok = ctx.config, ctx.tok

    def check_model(body: dict) -> None:
        if body.get("model") not in (config.model_name, "default"):
            raise APIError(404, f"The model '{body.get('model')}' does not exist",
                           "model", code="model_not_found")

    async def tokenize(p: Parsed) -> list[int]:
        if p.messages is not None:
            return await ctx.tokenize_chat(p.messages, p.tools)
        if p.suffix is not None:  # fill in the middle: prefix, suffix, then the middle
            pre, suf, mid = fim_tokens(tok)
            before = await ctx.tokenize_prompt(p.prompt, special=False)
            after = await ctx.tokenize_prompt(p.suffix, special=False)
            return [pre, *before, suf, *after, mid]
        return await ctx.tokenize_prompt(p.prompt)

    async def generate(p: Parsed, ids: list[int], emit: Emit | None = None
                       ) -> list[GenerateOutput]:
        ctx.metrics.requests.inc()
        return list(await asyncio.gather(*(ctx.run_one(ids, p.sampling, i, emit,
                                                       bootstrap=p.bootstrap)
                                           for i in range(p.n))))

    def shaper(p: Parsed) -> Callable[[], ChoiceOutput]:
        """A chat choice's output: tool calls parsed when tools may be called, reasoning
        when the server parses it and the request wants it apart."""
        tools = ctx.tool_format if p.tools is not None and p.tools.calls_allowed else None
        reasoning = ctx.reasoning_format if p.separate_reasoning else None
        return lambda: ChoiceOutput(tools, reasoning, p.stream_reasoning)

    def stream(p: Parsed, ids: list[int], is_chat: bool, ticket: Ticket) -> Response:
        rid = ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        shape = shaper(p)
        outputs: dict[int, ChoiceOutput] = {}

        def chat(put: Callable[[Any], None], index: int, chunk: StreamChunk) -> None:
            out = outputs.setdefault(index, shape())
            deltas = out.feed(chunk.text) if chunk.text else []
            finish = None
            if chunk.finish_reason:
                more, finish = out.finish(chunk.finish_reason)
                deltas += more
            logprobs = chat_logprobs(tok, chunk.token_ids, chunk.logprobs,
                                     chunk.top_logprobs, p)
            if not deltas and finish is not None:
                deltas = [{}]
            for k, delta in enumerate(deltas):
                last = k == len(deltas) - 1
                put(chat_chunk(rid, created, config.model_name, index, delta,
                               logprobs if k == 0 else None, finish if last else None))

        async def produce(put: Callable[[Any], None]) -> None:
            async def emit(index: int, chunk: StreamChunk) -> None:
                if is_chat:
                    chat(put, index, chunk)
                elif chunk.text or chunk.finish_reason:
                    put(completion_chunk(rid, created, config.model_name, index, chunk, tok,
                                         p))

            outs = await generate(p, ids, emit)
            if p.include_usage:
                put({"id": rid, "object": "chat.completion.chunk" if is_chat
                     else "text_completion", "created": created,
                     "model": config.model_name, "choices": [], "usage": usage(outs)})

        if is_chat:
            first = [chat_chunk(rid, created, config.model_name, i,
                                {"role": "assistant", "content": ""}) for i in range(p.n)]
        elif p.echo:  # the prompt first, as each choice's opening text
            first = [{"id": rid, "object": "text_completion", "created": created,
                      "model": config.model_name, "choices": [{
                          "index": i, "text": echo_text(p, ids, tok), "finish_reason": None,
                          "logprobs": None}]} for i in range(p.n)]
        else:
            first = []
        return sse_stream(produce, ticket, ctx.metrics, first)

    def endpoint(is_chat: bool) -> Callable:
        parse = parse_chat if is_chat else parse_completion

        async def handle(request: Request, ticket: Ticket) -> Response:
            body = await ctx.read_json(request)
            p = parse(body, config.default_max_tokens)
            if is_chat:
                p = constrain_chat(p, ctx.tool_format, ctx.reasoning_format)
            ticket.count(p.n)
            check_model(body)
            ids = await tokenize(p)
            if p.max_tokens_given:
                ctx.check_room(ids, p.sampling.max_new_tokens,
                               "max_completion_tokens" if is_chat and
                               "max_completion_tokens" in body else "max_tokens")
            if p.stream:
                return stream(p, ids, is_chat, ticket)
            outs = await while_connected(request, generate(p, ids))
            if is_chat:
                return JSONResponse(chat_response(config.model_name, outs, tok, p, shaper(p)))
            return JSONResponse(completion_response(config.model_name, outs, tok, p, ids))
        return ctx.admitted(handle)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": 0, "owned_by": "radixjax",
            "max_model_len": ctx.engine.config.max_context}]})

    return [
        Route("/v1/models", ctx.authorized(models), methods=["GET"]),
        Route("/v1/completions", endpoint(is_chat=False), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(is_chat=True), methods=["POST"]),
    ]
