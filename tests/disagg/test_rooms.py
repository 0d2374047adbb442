"""The prefill side's room table, the bootstrap fields and the decode side's check of
the KV format, host-side only."""

from __future__ import annotations

import asyncio
import types

import httpx
import pytest

from radixjax.disagg import decode
from radixjax.disagg.bootstrap import Bootstrap, BootstrapError, parse_bootstrap
from radixjax.disagg.rooms import Export, KVPoll, PrefillRooms, TransferError

EXPORT = Export(prompt_len=5, first_token=7, first_logprob=None, pieces=[])


def test_fetch_before_and_after_the_prefill_finishes() -> None:
    async def run() -> None:
        rooms = PrefillRooms(timeout_s=5)
        early = asyncio.create_task(rooms.take(1))  # the decode side came first
        await asyncio.sleep(0.01)
        assert not early.done() and rooms._room(1).state is KVPoll.BOOTSTRAPPING
        rooms.expect(1, "rid-1")
        rooms.complete(1, EXPORT)
        assert await early == EXPORT
        rooms.expect(2, "rid-2")
        rooms.complete(2, EXPORT)  # the prefill finished first
        assert rooms._room(2).state is KVPoll.TRANSFERRING
        assert await rooms.take(2) == EXPORT
        assert len(rooms) == 0 and rooms.num_success == 2

    asyncio.run(run())


def test_failed_and_timed_out_rooms_raise_and_are_removed() -> None:
    async def run() -> None:
        rooms = PrefillRooms(timeout_s=5)
        rooms.expect(3, "rid-3")
        assert rooms.rid_of(3) == "rid-3"
        rooms.fail(3, "the prefill ended without KV (abort)")
        with pytest.raises(TransferError, match="abort"):
            await rooms.take(3)
        with pytest.raises(TransferError, match="within 0.05 s"):
            await rooms.take(4, timeout_s=0.05)  # never prefilled
        assert len(rooms) == 0 and rooms.num_failed == 2
        rooms.complete(4, EXPORT)  # late: a fresh room, swept after 2 x timeout
        assert len(rooms) == 1

    asyncio.run(run())


def test_bootstrap_fields() -> None:
    body = {"bootstrap_host": "10.0.0.1", "bootstrap_port": 30000, "bootstrap_room": 9}
    assert parse_bootstrap(body, 1, False) == [Bootstrap("10.0.0.1", 30000, 9)]
    assert parse_bootstrap({}, 2, True) == [None, None]
    lists = {"bootstrap_host": ["h", "h"], "bootstrap_port": [1, 2], "bootstrap_room": [3, 4]}
    assert parse_bootstrap(lists, 2, True) == [Bootstrap("h", 1, 3), Bootstrap("h", 2, 4)]
    for bad in ({**body, "bootstrap_port": None}, {**body, "bootstrap_room": -1},
                {**body, "bootstrap_host": ""}, lists):
        with pytest.raises(BootstrapError):
            parse_bootstrap(bad, 1, False)


def test_the_decode_side_refuses_kv_pieces_of_another_format(monkeypatch) -> None:
    """A PD pair whose pools differ (another model, or --kv-cache-dtype) fails the request
    with a TransferError naming both formats, before pulling anything."""
    def prefill_server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"prompt_len": 5, "first_token": 7, "uuids": [1],
                                         "address": "x", "piece": "float32[2, 256, 1, 8]"})

    client = httpx.AsyncClient
    monkeypatch.setattr(decode.httpx, "AsyncClient", lambda **kw: client(
        transport=httpx.MockTransport(prefill_server), **kw))
    side = decode.DecodeSide(types.SimpleNamespace(piece_format="uint16[2, 256, 1, 8]"), 5)
    b = Bootstrap(host="127.0.0.1", port=1, room=3)
    with pytest.raises(TransferError, match=r"float32\[2, 256, 1, 8\].*uint16.*kv-cache-dtype"):
        asyncio.run(side._fetch(b))
    side.transfer.piece_format = "float32[2, 256, 1, 8]"
    assert asyncio.run(side._fetch(b))["uuids"] == [1]
