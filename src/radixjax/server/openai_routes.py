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

from radixjax.api.errors import APIError
from radixjax.api.openai_formats import (
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    usage,
)
from radixjax.api.openai_protocol import Parsed, parse_chat, parse_completion
from radixjax.engine.output import GenerateOutput, StreamChunk
from radixjax.server.context import Emit, ServerContext, sse_stream, while_connected
from radixjax.server.limits import Ticket


def openai_routes(ctx: ServerContext) -> list[Route]:
    config, tok = ctx.config, ctx.tok

    def check_model(body: dict) -> None:
        if body.get("model") not in (config.model_name, "default"):
            raise APIError(404, f"The model '{body.get('model')}' does not exist",
                           "model", code="model_not_found")

    async def tokenize(p: Parsed) -> list[int]:
        if p.messages is not None:
            return await ctx.tokenize_chat(p.messages)
        return await ctx.tokenize_prompt(p.prompt)

    async def generate(p: Parsed, ids: list[int], emit: Emit | None = None
                       ) -> list[GenerateOutput]:
        ctx.metrics.requests.inc()
        return list(await asyncio.gather(*(ctx.run_one(ids, p.sampling, i, emit,
                                                       bootstrap=p.bootstrap)
                                           for i in range(p.n))))

    def stream(p: Parsed, ids: list[int], is_chat: bool, ticket: Ticket) -> Response:
        rid = ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        make = chat_chunk if is_chat else completion_chunk

        async def produce(put: Callable[[Any], None]) -> None:
            async def emit(index: int, chunk: StreamChunk) -> None:
                if chunk.text or chunk.finish_reason or (is_chat and not chunk.token_ids):
                    put(make(rid, created, config.model_name, index, chunk, tok, p))

            outs = await generate(p, ids, emit)
            if p.include_usage:
                put({"id": rid, "object": "chat.completion.chunk" if is_chat
                     else "text_completion", "created": created,
                     "model": config.model_name, "choices": [], "usage": usage(outs)})

        roles = [chat_chunk(rid, created, config.model_name, i, None, tok, p)
                 for i in range(p.n)] if is_chat else []
        return sse_stream(produce, ticket, roles)

    def endpoint(is_chat: bool) -> Callable:
        parse = parse_chat if is_chat else parse_completion
        respond = chat_response if is_chat else completion_response

        async def handle(request: Request, ticket: Ticket) -> Response:
            body = await ctx.read_json(request)
            p = parse(body, config.default_max_tokens)
            ticket.count(p.n)
            check_model(body)
            ids = await tokenize(p)
            if p.stream:
                return stream(p, ids, is_chat, ticket)
            outs = await while_connected(request, generate(p, ids))
            return JSONResponse(respond(config.model_name, outs, tok, p))
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
