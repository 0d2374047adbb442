"""GET /dashboard: the engine's live page (static/dashboard.html: one file, no build step,
nothing fetched from elsewhere), and GET /dashboard/data: its JSON (Engine.snapshot and
the model's name). With an API key both need it: a browser passes it as ?key=..., the
page then on each of its requests; other clients as the usual Authorization header."""

from __future__ import annotations

import hmac
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from radixjax.api.errors import bad
from radixjax.server.context import ServerContext


def dashboard_routes(ctx: ServerContext) -> list[Route]:
    page = resources.files("radixjax.server").joinpath("static/dashboard.html").read_text()

    def authorize(request: Request) -> None:
        key, given = ctx.config.api_key, request.query_params.get("key")
        if key is not None and given is not None and hmac.compare_digest(
                given.encode(), key.encode()):
            return
        ctx.authorize(request)  # (no key set: passes; else the header, or 401)

    async def dashboard(request: Request) -> Response:
        authorize(request)
        return HTMLResponse(page)

    async def data(request: Request) -> Response:
        authorize(request)
        asked = request.query_params.get("max_nodes", "64")
        if not asked.isdigit() or not 1 <= int(asked) <= 512:
            raise bad("max_nodes must be an integer in [1, 512]")
        snap = ctx.engine.snapshot(int(asked))
        return JSONResponse(dict(snap, model=ctx.config.model_name))

    return [Route("/dashboard", dashboard, methods=["GET"]),
            Route("/dashboard/data", data, methods=["GET"])]
