"""Operating the server: /health, /health_generate, /get_server_info (and
/server_info), /flush_cache, /metrics, and with --enable-debug-endpoints
/debug/inject_fault and /debug/check_integrity."""

from __future__ import annotations

import os
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from radixjax.api.errors import APIError, bad
from radixjax.engine.errors import EngineError
from radixjax.sampling.params import SamplingParams
from radixjax.server.context import ServerContext


def admin_routes(ctx: ServerContext) -> list[Route]:
    engine, config, metrics = ctx.engine, ctx.config, ctx.metrics

    async def health(request: Request) -> Response:
        if not engine.healthy:
            return PlainTextResponse("unhealthy", status_code=503)
        return PlainTextResponse("ok")

    async def health_generate(request: Request) -> Response:
        """One token generated end to end."""
        try:
            out = await engine.agenerate([engine.model_config.bos_token_id or 0],
                                         SamplingParams(max_new_tokens=1, temperature=0.0))
        except EngineError:
            return PlainTextResponse("failed", status_code=503)
        ok = out.completion_tokens == 1
        return PlainTextResponse("ok" if ok else "failed", status_code=200 if ok else 503)

    async def server_info(request: Request) -> Response:
        return JSONResponse({"model": config.model_name, "pid": os.getpid(),
                             "disaggregation_mode": engine.config.disaggregation_mode,
                             "num_internal_errors": metrics.num_internal_errors,
                             "engine": asdict(engine.config),
                             "model_config": asdict(engine.model_config),
                             "stats": engine.stats()})

    async def flush_cache(request: Request) -> Response:
        if engine.flush_cache():
            return PlainTextResponse("Cache flushed.")
        raise bad("cannot flush the cache while requests are running")

    def debug(handler):  # 404 unless the server runs with its debug endpoints
        async def endpoint(request: Request) -> Response:
            if not config.enable_debug:
                raise APIError(404, "Not Found", code="not_found")
            return await handler(request)
        return endpoint

    async def inject_fault(request: Request) -> Response:
        engine.inject_fault()
        return PlainTextResponse("the next step raises")

    async def check_integrity(request: Request) -> Response:
        """KV accounting (allocator, radix tree, rows; nothing held when idle)."""
        try:
            engine.check_integrity()
        except AssertionError as e:
            raise APIError(500, f"KV integrity broken: {e}", type_="internal_error") from e
        return JSONResponse({"ok": True})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(engine.stats()), media_type=metrics.content_type)

    auth = ctx.authorized
    return [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", auth(health_generate), methods=["GET"]),
        Route("/get_server_info", auth(server_info), methods=["GET"]),
        Route("/server_info", auth(server_info), methods=["GET"]),
        Route("/flush_cache", auth(flush_cache), methods=["POST"]),  # changes state: POST
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/debug/inject_fault", auth(debug(inject_fault)), methods=["POST"]),
        Route("/debug/check_integrity", auth(debug(check_integrity)), methods=["GET"]),
    ]
