"""The Starlette app: OpenAI-compatible and SGLang-style native endpoints over one Engine
whose scheduler runs on the same event loop (Engine(background=False))."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from radixjax.api import native
from radixjax.api.chat_roles import role_markers
from radixjax.api.errors import APIError, bad
from radixjax.disagg.bootstrap import Bootstrap
from radixjax.engine.engine import Engine, GenerateOutput, StreamChunk
from radixjax.engine.errors import EngineError, RequestError
from radixjax.sampling.params import SamplingParams, SamplingParamsError
from radixjax.server.disagg_routes import disagg_routes
from radixjax.server.formats import (
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    usage,
)
from radixjax.server.limits import (
    Admission,
    Limits,
    Ticket,
    check_prompt_chars,
    longest_token_chars,
    read_body,
)
from radixjax.server.metrics import ServerMetrics
from radixjax.server.protocol import Parsed, parse_chat, parse_completion


@dataclass
class ServerConfig:
    model_name: str
    api_key: str | None = None
    default_max_tokens: int = 256
    enable_debug: bool = False  # POST /debug/inject_fault (tests of the supervision)
    limits: Limits = field(default_factory=Limits)
    model_path: str | None = None  # what /get_model_info reports (default: model_name)


class ClientGone(Exception):
    """The client of a non-streaming request disconnected; its requests were aborted."""


async def while_connected(request: Request, work: Any) -> Any:
    """Await `work` (a coroutine) unless the client disconnects first: then cancel it,
    which aborts its engine requests and frees their KV."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # the client left (or this handler was cancelled)
    if not task.done():
        raise ClientGone()
    return task.result()


def engine_failed(e: EngineError) -> APIError:
    return APIError(500, f"the engine failed while serving this request: {e}",
                    type_="internal_error", code="engine_error")


def create_app(engine: Engine, config: ServerConfig) -> Starlette:
    metrics = ServerMetrics()
    tok = engine.tokenizer
    admission = Admission(config.limits.max_concurrent_requests)
    longest_token = longest_token_chars(tok)
    expected_auth = f"Bearer {config.api_key}".encode()

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected_auth):  # constant time
            raise APIError(401, "Incorrect or missing API key", type_="authentication_error",
                           code="invalid_api_key")

    async def read_json(request: Request) -> Any:
        raw = await read_body(request, config.limits.max_request_bytes)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad(f"invalid JSON body: {e}") from e

    def check_model(parsed_body: dict) -> None:
        if parsed_body.get("model") not in (config.model_name, "default"):
            raise APIError(404, f"The model '{parsed_body.get('model')}' does not exist",
                           "model", code="model_not_found")

    async def tokenize(p: Parsed) -> list[int]:
        """Tokenization runs in a worker thread, off the scheduler's loop; a text that
        cannot fit the context is refused before it is tokenized."""
        max_context = engine.config.max_context
        if p.messages is not None:
            check_prompt_chars(sum(len(m["content"]) for m in p.messages), longest_token,
                               max_context)
            if tok is None or not getattr(tok, "chat_template", None):
                raise bad("this model has no chat template")

            def render() -> list[int]:
                text = tok.apply_chat_template(p.messages, add_generation_prompt=True,
                                               tokenize=False)
                return tok(text, add_special_tokens=False).input_ids
            return await asyncio.to_thread(render)
        return await tokenize_prompt(p.prompt)

    async def tokenize_prompt(prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        check_prompt_chars(len(prompt), longest_token, engine.config.max_context)
        if tok is None:
            raise bad("this model has no tokenizer: send token ids")
        return await asyncio.to_thread(lambda: tok(prompt).input_ids)

    async def run_one(ids: list[int], sp: SamplingParams, index: int,
                      emit: Callable[[int, StreamChunk], Any] | None,
                      rid: str | None = None,
                      bootstrap: Bootstrap | None = None) -> GenerateOutput:
        start, last = time.perf_counter(), None
        out = None
        try:
            async for chunk in engine.generate_stream(ids, sp, index, rid, bootstrap):
                now = time.perf_counter()
                if chunk.token_ids:
                    metrics.observe_token(now - (last or start), first=last is None)
                    last = now
                if emit is not None:
                    await emit(index, chunk)
                out = chunk.output or out
        except (RequestError, SamplingParamsError) as e:
            raise bad(str(e)) from e
        except EngineError as e:
            raise engine_failed(e) from e
        assert out is not None
        metrics.on_finished(out)
        return out

    async def generate(p: Parsed, ids: list[int], emit=None) -> list[GenerateOutput]:
        metrics.requests.inc()
        return list(await asyncio.gather(*(run_one(ids, p.sampling, i, emit,
                                                   bootstrap=p.bootstrap)
                                           for i in range(p.n))))

    def sse(obj: Any) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    async def stream_response(p: Parsed, ids: list[int], is_chat: bool,
                              ticket: Ticket) -> StreamingResponse:
        rid = ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        make = chat_chunk if is_chat else completion_chunk

        async def body() -> AsyncIterator[bytes]:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def emit(index: int, chunk: StreamChunk) -> None:
                if chunk.text or chunk.finish_reason or (is_chat and not chunk.token_ids):
                    queue.put_nowait(sse(make(rid, created, config.model_name, index, chunk,
                                              tok, p)))

            if is_chat:
                for i in range(p.n):
                    queue.put_nowait(sse(chat_chunk(rid, created, config.model_name, i, None,
                                                    tok, p)))

            async def produce() -> None:
                try:
                    outs = await generate(p, ids, emit)
                    if p.include_usage:
                        queue.put_nowait(sse({
                            "id": rid, "object": "chat.completion.chunk" if is_chat
                            else "text_completion", "created": created,
                            "model": config.model_name, "choices": [], "usage": usage(outs)}))
                except APIError as e:
                    queue.put_nowait(sse(e.body()))
                queue.put_nowait(None)

            task = asyncio.create_task(produce())
            try:
                while (item := await queue.get()) is not None:
                    yield item
                yield b"data: [DONE]\n\n"
            finally:
                task.cancel()  # a client that went away aborts its requests
                ticket.release()

        return StreamingResponse(body(), media_type="text/event-stream")

    def openai_endpoint(is_chat: bool) -> Callable:
        parse = parse_chat if is_chat else parse_completion
        respond = chat_response if is_chat else completion_response

        async def endpoint(request: Request, ticket: Ticket) -> Response:
            body = await read_json(request)
            p = parse(body, config.default_max_tokens)
            check_model(body)
            ids = await tokenize(p)
            if p.stream:
                return await stream_response(p, ids, is_chat, ticket)
            outs = await while_connected(request, generate(p, ids))
            return JSONResponse(respond(config.model_name, outs, tok, p))
        return admitted(endpoint)

    def admitted(handler: Callable) -> Callable:
        """A generation endpoint: counted in progress from here until its response (or its
        stream) ends; past the limit, 503 with Retry-After."""
        async def endpoint(request: Request) -> Response:
            authorize(request)
            ticket = admission.enter()
            try:
                response = await handler(request, ticket)
            except BaseException:
                ticket.release()
                raise
            if isinstance(response, StreamingResponse):  # its body releases; or this
                response.background = BackgroundTask(ticket.release)
            else:
                ticket.release()
            return response
        return endpoint

    async def native_generate(request: Request, ticket: Ticket) -> Response:
        """SGLang's /generate (api/native.py): one prompt or a batch, n samples each."""
        batch = native.parse_generate(await read_json(request))
        tokenized: dict[int, list[int]] = {}  # a prompt's n samples share one object
        for item in batch.items:
            if id(item.prompt) not in tokenized:
                tokenized[id(item.prompt)] = await tokenize_prompt(item.prompt)
        prompt_ids = [tokenized[id(item.prompt)] for item in batch.items]
        metrics.requests.inc()
        eos = engine.eos_token_ids

        def run(k: int, emit: Callable | None = None) -> Any:
            item = batch.items[k]
            on = None if emit is None else (lambda _, chunk: emit(k, chunk))
            return run_one(prompt_ids[k], item.sampling, item.index, on, item.rid,
                           item.bootstrap)

        if not batch.stream:
            outs = await while_connected(request, asyncio.gather(
                *(run(k) for k in range(len(batch.items)))))
            bodies = [native.response(item, ids, out, tok, eos)
                      for item, ids, out in zip(batch.items, prompt_ids, outs, strict=True)]
            return JSONResponse(bodies if batch.batched else bodies[0])

        async def body_iter() -> AsyncIterator[bytes]:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            states = [native.StreamState(item, ids, tok, eos, k if batch.batched else None)
                      for k, (item, ids) in enumerate(zip(batch.items, prompt_ids,
                                                          strict=True))]

            async def emit(k: int, chunk: StreamChunk) -> None:
                body = states[k].push(chunk)
                if body is not None:
                    queue.put_nowait(sse(body))

            async def produce() -> None:
                try:
                    await asyncio.gather(*(run(k, emit) for k in range(len(batch.items))))
                except APIError as e:
                    queue.put_nowait(sse(e.body()))
                queue.put_nowait(None)

            task = asyncio.create_task(produce())
            try:
                while (item := await queue.get()) is not None:
                    yield item
                yield b"data: [DONE]\n\n"
            finally:
                task.cancel()  # a client that went away aborts its requests
                ticket.release()

        return StreamingResponse(body_iter(), media_type="text/event-stream")

    async def abort_request(request: Request) -> Response:
        """SGLang's /abort_request: {"rid": ...} ends that request (finish_reason abort);
        the rids of n > 1 samples are rid-0, rid-1, ..."""
        authorize(request)
        body = await read_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise bad("expected {\"rid\": \"...\"}", "rid")
        found = engine.abort(rid)
        return JSONResponse({"rid": rid, "aborted": found})

    markers = role_markers(tok) if getattr(tok, "chat_template", None) else None

    async def model_info(request: Request) -> Response:
        """SGLang's /get_model_info (its frontend reads model_path for a chat template);
        chat_role_markers (ours): each chat role's text around its content, for
        radixjax.lang's HTTP backend."""
        authorize(request)
        return JSONResponse({"chat_role_markers": markers,
            "model_path": config.model_path or config.model_name,
            "tokenizer_path": config.model_path or config.model_name,
            "served_model_name": config.model_name, "is_generation": True,
            "preferred_sampling_params": None, "has_image_understanding": False,
            "has_audio_understanding": False, "max_context": engine.config.max_context})

    async def load(request: Request) -> Response:
        """SGLang's /get_load: one entry per data-parallel rank (one here)."""
        authorize(request)
        stats = engine.stats()
        return JSONResponse([{"dp_rank": i,
                              "num_reqs": int(s["num_running"] + s["num_waiting"]),
                              "num_waiting_reqs": int(s["num_waiting"]),
                              "num_tokens": int(s["kv_usage"] * engine.config.num_slots)}
                             for i, s in enumerate(stats.get("replicas", [stats]))])

    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": 0, "owned_by": "radixjax",
            "max_model_len": engine.config.max_context}]})

    async def health(request: Request) -> Response:
        if not engine.healthy:
            return PlainTextResponse("unhealthy", status_code=503)
        return PlainTextResponse("ok")

    async def health_generate(request: Request) -> Response:
        authorize(request)
        try:
            out = await engine.agenerate([engine.model_config.bos_token_id or 0],
                                         SamplingParams(max_new_tokens=1, temperature=0.0))
        except EngineError:
            return PlainTextResponse("failed", status_code=503)
        return PlainTextResponse("ok" if out.completion_tokens == 1 else "failed",
                                 status_code=200 if out.completion_tokens == 1 else 503)

    async def server_info(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"model": config.model_name, "pid": os.getpid(),
                             "disaggregation_mode": engine.config.disaggregation_mode,
                             "num_internal_errors": metrics.num_internal_errors,
                             "engine": asdict(engine.config),
                             "model_config": asdict(engine.model_config),
                             "stats": engine.stats()})

    async def flush_cache(request: Request) -> Response:
        authorize(request)
        if engine.flush_cache():
            return PlainTextResponse("Cache flushed.")
        raise bad("cannot flush the cache while requests are running")

    async def inject_fault(request: Request) -> Response:
        authorize(request)
        if not config.enable_debug:
            raise APIError(404, "Not Found", code="not_found")
        engine.inject_fault()
        return PlainTextResponse("the next step raises")

    async def check_integrity(request: Request) -> Response:
        """KV accounting (allocator, radix tree, rows; nothing held when idle)."""
        authorize(request)
        if not config.enable_debug:
            raise APIError(404, "Not Found", code="not_found")
        try:
            engine.check_integrity()
        except AssertionError as e:
            raise APIError(500, f"KV integrity broken: {e}", type_="internal_error") from e
        return JSONResponse({"ok": True})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(engine.stats()), media_type=metrics.content_type)

    async def api_error(request: Request, exc: APIError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(),
                            status_code=exc.status_code)

    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it (nginx's "client closed")

    async def internal_error(request: Request, exc: Exception) -> Response:
        metrics.on_internal_error()
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                       type_="internal_error")
        return JSONResponse(err.body(), status_code=500)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", openai_endpoint(is_chat=False), methods=["POST"]),
        Route("/v1/chat/completions", openai_endpoint(is_chat=True), methods=["POST"]),
        Route("/generate", admitted(native_generate), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/get_load", load, methods=["GET"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["POST"]),  # state-changing: POST only
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/debug/inject_fault", inject_fault, methods=["POST"]),
        Route("/debug/check_integrity", check_integrity, methods=["GET"]),
        *disagg_routes(engine, authorize),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: api_error, HTTPException: http_error, ClientGone: client_gone,
        Exception: internal_error})
