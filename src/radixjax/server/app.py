"""The Starlette app over one Engine whose scheduler runs on the same event loop
(Engine(background=False)): the routes of each API in a module of its own, over what
they share (server/context.py).

    server/openai_routes.py   /v1/models, /v1/completions, /v1/chat/completions
    server/native_routes.py   SGLang's /generate, /abort_request, /get_model_info, /get_load
    server/admin_routes.py    /health, /metrics, /get_server_info, /flush_cache, /debug/*
    server/dashboard_routes.py  /dashboard (the live page) and /dashboard/data
    server/disagg_routes.py   a prefill server's /disagg/fetch and /disagg/abort
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixjax.api.errors import APIError
from radixjax.engine.engine import Engine
from radixjax.server.admin_routes import admin_routes
from radixjax.server.context import ClientGone, ServerConfig, ServerContext
from radixjax.server.dashboard_routes import dashboard_routes
from radixjax.server.disagg_routes import disagg_routes
from radixjax.server.native_routes import native_routes
from radixjax.server.openai_routes import openai_routes


def create_app(engine: Engine, config: ServerConfig) -> Starlette:
    ctx = ServerContext(engine, config)

    async def api_error(request: Request, exc: APIError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(),
                            status_code=exc.status_code)

    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it (nginx's "client closed")

    async def internal_error(request: Request, exc: Exception) -> Response:
        ctx.metrics.on_internal_error()
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

    routes = [*openai_routes(ctx), *native_routes(ctx), *admin_routes(ctx),
              *dashboard_routes(ctx), *disagg_routes(ctx)]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: api_error, HTTPException: http_error, ClientGone: client_gone,
        Exception: internal_error})
