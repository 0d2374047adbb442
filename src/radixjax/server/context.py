"""What every route module of the server shares: the engine, the server's config and
metrics, authorization, body reading, tokenization off the loop, one request run through
the engine, admission (503 past the limit) and server-sent-event streams."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from radixjax.api.errors import APIError, bad
from radixjax.api.reasoning import REASONING_FORMATS
from radixjax.api.tool_formats import FORMATS, detect_format
from radixjax.api.tool_prompt import chat_for_template
from radixjax.api.tool_spec import ToolRequest
from radixjax.engine.engine import Engine, GenerateOutput, StreamChunk
from radixjax.engine.errors import EngineError, RequestError
from radixjax.sampling.params import SamplingParams, SamplingParamsError
from radixjax.server.limits import (
    Admission,
    Limits,
    Ticket,
    check_prompt_chars,
    longest_token_chars,
    read_body,
)
from radixjax.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

Emit = Callable[[int, StreamChunk], Awaitable[None]]  # (sample index, chunk)


@dataclass
class ServerConfig:
    model_name: str
    api_key: str | None = None
    default_max_tokens: int = 256
    enable_debug: bool = False  # POST /debug/inject_fault (tests of the supervision)
    limits: Limits = field(default_factory=Limits)
    model_path: str | None = None  # what /get_model_info reports (default: model_name)
    tool_call_parser: str | None = None  # api/tool_formats.py FORMATS; None: from template
    reasoning_parser: str | None = None  # api/reasoning.py REASONING_FORMATS


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


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def sse_stream(produce: Callable[[Callable[[Any], None]], Awaitable[None]],
               ticket: Ticket, metrics: ServerMetrics, first: list[Any] = ()) -> StreamingResponse:
    """A stream of server-sent events: `first` bodies, then what produce(put) puts as
    the requests run, then [DONE]. An APIError becomes its error event; any other
    exception (a parser's bug, a malformed peer reply) an internal_error event, logged
    and counted, so the client still gets [DONE] and the ticket goes back. A client that
    goes away cancels produce (its requests abort); the ticket is released at the end."""
    async def body() -> AsyncIterator[bytes]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        for obj in first:
            queue.put_nowait(sse(obj))

        async def run() -> None:
            try:
                await produce(lambda obj: queue.put_nowait(sse(obj)))
            except APIError as e:
                queue.put_nowait(sse(e.body()))
            except Exception as e:  # noqa: BLE001 (cancellation is not an Exception)
                log.exception("a stream failed")
                metrics.on_internal_error()
                queue.put_nowait(sse(APIError(500, f"internal error: {type(e).__name__}: {e}",
                                              type_="internal_error").body()))
            queue.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            while (item := await queue.get()) is not None:
                yield item
            yield b"data: [DONE]\n\n"
        finally:
            task.cancel()
            ticket.release()

    return StreamingResponse(body(), media_type="text/event-stream")


class ServerContext:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.tok = engine.tokenizer
        self.metrics = ServerMetrics()
        self.admission = Admission(config.limits.max_concurrent_requests,
                                   config.limits.max_batch_requests)
        self._longest_token = longest_token_chars(self.tok)
        self._expected_auth = f"Bearer {config.api_key}".encode()
        template = getattr(self.tok, "chat_template", None)
        self.tool_format = (FORMATS[config.tool_call_parser] if config.tool_call_parser
                            else detect_format(template))
        self.reasoning_format = REASONING_FORMATS.get(config.reasoning_parser or "")

    def authorize(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, self._expected_auth):  # constant time
            raise APIError(401, "Incorrect or missing API key", type_="authentication_error",
                           code="invalid_api_key")

    async def read_json(self, request: Request) -> Any:
        """The body, parsed (and kept on request.state.body)."""
        raw = await read_body(request, self.config.limits.max_request_bytes)
        try:
            request.state.body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad(f"invalid JSON body: {e}") from e
        return request.state.body

    async def tokenize_chat(self, messages: list[dict], tools: ToolRequest | None = None
                            ) -> list[int]:
        """The chat template rendered (with the tools the model may call, its own way or
        ours: api/tool_prompt.py) and tokenized in a worker thread, off the scheduler's
        loop; a text that cannot fit the context is refused first."""
        check_prompt_chars(sum(len(m.get("content") or "") for m in messages),
                           self._longest_token, self.engine.config.max_context)
        tok = self.tok
        if tok is None or not getattr(tok, "chat_template", None):
            raise bad("this model has no chat template")
        messages, extra = chat_for_template(messages, tools, self.tool_format,
                                            tok.chat_template)

        def render() -> list[int]:
            try:
                text = tok.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=False, **extra)
            except TemplateError as e:  # the template's own checks (roles alternate...)
                raise bad(f"the chat template refused these messages: {e}", "messages") from e
            return tok(text, add_special_tokens=False).input_ids
        return await asyncio.to_thread(render)

    async def tokenize_prompt(self, prompt: str | list[int], special: bool = True) -> list[int]:
        """special: the tokenizer's own additions (a BOS); False for a part of a prompt."""
        if isinstance(prompt, list):
            return prompt
        check_prompt_chars(len(prompt), self._longest_token, self.engine.config.max_context)
        if self.tok is None:
            raise bad("this model has no tokenizer: send token ids")
        return await asyncio.to_thread(
            lambda: self.tok(prompt, add_special_tokens=special).input_ids)

    def check_room(self, ids: list[int], max_tokens: int, param: str) -> None:
        """A max_tokens the client named must fit the context left after its prompt (as
        OpenAI, vLLM and SGLang answer; an absent one is cut to that room)."""
        context = self.engine.config.max_context
        if len(ids) + max_tokens > context:
            raise bad(f"This model's maximum context length is {context} tokens. However, "
                      f"you requested {len(ids) + max_tokens} tokens ({len(ids)} in the "
                      f"prompt, {max_tokens} in the completion): reduce the prompt or "
                      f"{param}", param)

    async def run_one(self, ids: list[int], sp: SamplingParams, index: int,
                      emit: Emit | None, rid: str | None = None,
                      bootstrap: Any = None) -> GenerateOutput:
        """One request through the engine, each chunk to emit (if any), timed for the
        metrics; the engine's refusals as 400, its failures as 500."""
        start, last = time.perf_counter(), None
        out = None
        try:
            async for chunk in self.engine.generate_stream(ids, sp, index, rid, bootstrap):
                now = time.perf_counter()
                if chunk.token_ids:
                    self.metrics.observe_token(now - (last or start), first=last is None)
                    last = now
                if emit is not None:
                    await emit(index, chunk)
                out = chunk.output or out
        except (RequestError, SamplingParamsError) as e:
            raise bad(str(e)) from e
        except EngineError as e:
            if not self.engine.healthy:  # it cannot serve now (recovering, or for good)
                raise APIError(503, f"the engine cannot serve: {e}", type_="unavailable",
                               code="engine_unhealthy", headers={"Retry-After": "5"}) from e
            raise APIError(500, f"the engine failed while serving this request: {e}",
                           type_="internal_error", code="engine_error") from e
        assert out is not None
        self.metrics.on_finished(out)
        return out

    def admitted(self, handler: Callable[[Request, Ticket], Awaitable[Response]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        """A generation endpoint: counted in progress from here until its response (or its
        stream) ends; past the limit, 503 with Retry-After."""
        async def endpoint(request: Request) -> Response:
            self.authorize(request)
            try:
                ticket = self.admission.enter()
            except APIError as e:
                await self._refuse_rooms(request, e)
                raise
            try:
                response = await handler(request, ticket)
            except BaseException as e:
                ticket.release()
                await self._refuse_rooms(request, e)
                raise
            if isinstance(response, StreamingResponse):  # its body releases; or this
                response.background = BackgroundTask(ticket.release)
            else:
                ticket.release()
            return response
        return endpoint

    async def _refuse_rooms(self, request: Request, error: BaseException) -> None:
        """A prefill server refused a request (an authorized one): its rooms fail now with
        the reason, so their decode servers do not wait out their timeout."""
        side = getattr(self.engine, "disagg", None)
        if side is None or side.mode != "prefill":
            return
        body = getattr(request.state, "body", None)
        if body is None:
            try:
                body = await self.read_json(request)
            except Exception:  # noqa: BLE001 - no body to read: no rooms to name
                return
        rooms = body.get("bootstrap_room") if isinstance(body, dict) else None
        reason = error.message if isinstance(error, APIError) else type(error).__name__
        for room in rooms if isinstance(rooms, list) else [rooms]:
            if isinstance(room, int) and not isinstance(room, bool):
                side.reject(room, reason)

    def authorized(self, handler: Callable[[Request], Awaitable[Response]]
                   ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            self.authorize(request)
            return await handler(request)
        return endpoint
