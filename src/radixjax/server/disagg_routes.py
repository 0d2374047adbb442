"""A prefill server's routes for its decode servers (disagg/prefill.py):

    POST /disagg/fetch {"room": R, "timeout": s}  wait (at most s) for room R's prefill,
                                     offer its KV pieces to
                                     the transfer server; answer where and what to pull
                                     (409 with the reason if the room failed or timed out)
    POST /disagg/abort {"room": R}   the decode side gave up: abort the prefill request
                                     and fail the room
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radixjax.api.errors import APIError, bad
from radixjax.disagg.prefill import PrefillSide
from radixjax.disagg.rooms import TransferError
from radixjax.server.context import ServerContext


def disagg_routes(ctx: ServerContext) -> list[Route]:
    engine, authorize = ctx.engine, ctx.authorize
    side = getattr(engine, "disagg", None)
    if not isinstance(side, PrefillSide):
        return []

    async def room_of(request: Request) -> tuple[int, dict]:
        authorize(request)
        try:
            body = await request.json()
            room = body["room"]
        except (ValueError, KeyError, TypeError) as e:
            raise bad("the body must be {\"room\": int}") from e
        if isinstance(room, bool) or not isinstance(room, int):
            raise bad("'room' must be an integer", "room")
        return room, body

    async def fetch(request: Request) -> Response:
        room, body = await room_of(request)
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise bad("'timeout' must be a positive number of seconds", "timeout")
        try:
            return JSONResponse(await side.fetch(room, timeout))
        except TransferError as e:
            raise APIError(409, str(e), "room", type_="transfer_error") from e

    async def abort(request: Request) -> Response:
        room, _ = await room_of(request)
        rid = side.rooms.rid_of(room)
        side.rooms.fail(room, "aborted by the decode server")
        if rid is not None:
            engine.abort(rid)
        return JSONResponse({"room": room, "aborted": rid is not None})

    return [Route("/disagg/fetch", fetch, methods=["POST"]),
            Route("/disagg/abort", abort, methods=["POST"])]
