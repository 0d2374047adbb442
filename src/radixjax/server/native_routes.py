"""SGLang's native API: /generate (one prompt or a batch, n samples, streamed as
cumulative bodies; api/native.py), /abort_request, /get_model_info, /get_load."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radixjax.api import native
from radixjax.api.chat_roles import role_markers
from radixjax.api.errors import bad
from radixjax.engine.output import StreamChunk
from radixjax.server.context import ServerContext, sse_stream, while_connected
from radixjax.server.limits import Ticket


def native_routes(ctx: ServerContext) -> list[Route]:
    engine, config, tok = ctx.engine, ctx.config, ctx.tok

    async def generate(request: Request, ticket: Ticket) -> Response:
        batch = native.parse_generate(await ctx.read_json(request))
        ticket.count(len(batch.items))
        tokenized: dict[int, list[int]] = {}  # a prompt's n samples share one object
        for item in batch.items:
            if id(item.prompt) not in tokenized:
                tokenized[id(item.prompt)] = await ctx.tokenize_prompt(item.prompt)
        prompt_ids = [tokenized[id(item.prompt)] for item in batch.items]
        for item, ids in zip(batch.items, prompt_ids, strict=True):
            if item.max_tokens_given:
                ctx.check_room(ids, item.sampling.max_new_tokens, "max_new_tokens")
        ctx.metrics.requests.inc()
        eos = engine.eos_token_ids

        def run(k: int, emit: Callable | None = None) -> Any:
            item = batch.items[k]
            on = None if emit is None else (lambda _, chunk: emit(k, chunk))
            return ctx.run_one(prompt_ids[k], item.sampling, item.index, on, item.rid,
                               item.bootstrap)

        if not batch.stream:
            outs = await while_connected(request, asyncio.gather(
                *(run(k) for k in range(len(batch.items)))))
            bodies = [native.response(item, ids, out, tok, eos)
                      for item, ids, out in zip(batch.items, prompt_ids, outs, strict=True)]
            return JSONResponse(bodies if batch.batched else bodies[0])

        states = [native.StreamState(item, ids, tok, eos, k if batch.batched else None)
                  for k, (item, ids) in enumerate(zip(batch.items, prompt_ids, strict=True))]

        async def produce(put: Callable[[Any], None]) -> None:
            async def emit(k: int, chunk: StreamChunk) -> None:
                body = states[k].push(chunk)
                if body is not None:
                    put(body)

            await asyncio.gather(*(run(k, emit) for k in range(len(batch.items))))

        return sse_stream(produce, ticket, ctx.metrics)

    async def abort_request(request: Request) -> Response:
        """{"rid": ...} ends that request (finish_reason abort); the rids of n > 1
        samples are rid-0, rid-1, ..."""
        body = await ctx.read_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise bad("expected {\"rid\": \"...\"}", "rid")
        found = engine.abort(rid)
        return JSONResponse({"rid": rid, "aborted": found})

    markers = role_markers(tok) if getattr(tok, "chat_template", None) else None

    async def model_info(request: Request) -> Response:
        """SGLang's frontend reads model_path for a chat template; chat_role_markers
        (ours): each chat role's text around its content, for radixjax.lang's HTTP
        backend."""
        return JSONResponse({"chat_role_markers": markers,
            "model_path": config.model_path or config.model_name,
            "tokenizer_path": config.model_path or config.model_name,
            "served_model_name": config.model_name, "is_generation": True,
            "preferred_sampling_params": None, "has_image_understanding": False,
            "has_audio_understanding": False, "max_context": engine.config.max_context})

    async def load(request: Request) -> Response:
        """One entry per data-parallel rank (sglang-router's cache-aware policy)."""
        stats = engine.stats()
        return JSONResponse([{"dp_rank": i,
                              "num_reqs": int(s["num_running"] + s["num_waiting"]),
                              "num_waiting_reqs": int(s["num_waiting"]),
                              "num_tokens": int(s["kv_usage"] * engine.config.num_slots)}
                             for i, s in enumerate(stats.get("replicas", [stats]))])

    return [
        Route("/generate", ctx.admitted(generate), methods=["POST"]),
        Route("/abort_request", ctx.authorized(abort_request), methods=["POST"]),
        Route("/get_model_info", ctx.authorized(model_info), methods=["GET"]),
        Route("/get_load", ctx.authorized(load), methods=["GET"]),
    ]
