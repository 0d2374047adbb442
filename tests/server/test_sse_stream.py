"""A stream's failure reaches its client (server/context.py sse_stream), host only."""

import asyncio
import json

from radixjax.server.context import sse_stream
from radixjax.server.limits import Admission
from radixjax.server.metrics import ServerMetrics


def test_any_exception_ends_the_stream_with_an_error_event_and_done() -> None:
    """Not only APIError: a parser's bug or a malformed peer reply inside a stream gives
    the client an internal_error event and [DONE] (it hung before, holding its
    admission ticket), and counts as an internal error."""
    admission, metrics = Admission(4), ServerMetrics()
    ticket = admission.enter()

    async def produce(put) -> None:
        put({"choices": [{"delta": {"content": "Hel"}}]})
        raise ValueError("a parser's bug")

    async def collect() -> list[bytes]:
        return [c async for c in sse_stream(produce, ticket, metrics).body_iterator]

    chunks = asyncio.run(asyncio.wait_for(collect(), 10))
    events = [c.decode().removeprefix("data: ").strip() for c in chunks]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hel"
    err = json.loads(events[1])["error"]
    assert err["type"] == "internal_error" and "ValueError: a parser's bug" in err["message"]
    assert events[2] == "[DONE]" and len(events) == 3
    assert admission.active == 0 and metrics.num_internal_errors == 1
