"""The prefill side's room table, the bootstrap fields and the decode side's check of
the KV format, host-side only."""

from __future__ import annotations

import asyncio
import threading
import time
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
        rooms.complete(4, EXPORT)  # late: a fresh room, swept after 2 x timeout (a timer)
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


def fake_prefill_answers(monkeypatch, status: int, body: object) -> None:
    def prefill_server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    client = httpx.AsyncClient
    monkeypatch.setattr(decode.httpx, "AsyncClient", lambda **kw: client(
        transport=httpx.MockTransport(prefill_server), **kw))


REPLY = {"prompt_len": 5, "first_token": 7, "uuids": [1], "address": "x",
         "piece": "float32[2, 256, 1, 8]", "fingerprint": "abc"}
B = Bootstrap(host="127.0.0.1", port=1, room=3)


def decode_side(piece: str = "float32[2, 256, 1, 8]", fingerprint: str = "abc"):
    transfer = types.SimpleNamespace(piece_format=piece, fingerprint=fingerprint)
    return decode.DecodeSide(transfer, 5, {("127.0.0.1", 1)})


def test_the_decode_side_refuses_kv_of_another_format_or_model(monkeypatch) -> None:
    """A PD pair whose pools differ (another model, or --kv-cache-dtype) fails the request
    with a TransferError naming both formats, before pulling anything; the same format
    of another model's weights (its fingerprint) too."""
    fake_prefill_answers(monkeypatch, 200, REPLY)
    with pytest.raises(TransferError, match=r"float32\[2, 256, 1, 8\].*uint16.*kv-cache-dtype"):
        asyncio.run(decode_side(piece="uint16[2, 256, 1, 8]")._fetch(B))
    with pytest.raises(TransferError, match="serves another model"):
        asyncio.run(decode_side(fingerprint="other")._fetch(B))
    assert asyncio.run(decode_side()._fetch(B))["uuids"] == [1]


@pytest.mark.parametrize("status, body, says", [
    (200, {**REPLY, "uuids": ["x"]}, "something else"),
    (200, [1, 2], "something else"),
    (200, {**REPLY, "first_token": "7"}, "something else"),
    (409, {"error": {"type": "transfer_error", "message": "room 3: the prefill ended"}},
     "room 3: the prefill ended"),
    (409, {"error": {"type": "other", "message": "PEER TEXT"}}, "HTTP 409"),
    (500, {"error": {"type": "transfer_error", "message": "PEER TEXT"}}, "HTTP 500"),
])
def test_what_a_prefill_server_answers_is_checked_not_echoed(monkeypatch, status, body,
                                                            says) -> None:
    """Only our protocol's own reason for a failed room goes back to the client; any
    other answer is named by its status, and a reply without our fields is refused."""
    fake_prefill_answers(monkeypatch, status, body)
    with pytest.raises(TransferError, match=says) as e:
        asyncio.run(decode_side()._fetch(B))
    assert "PEER TEXT" not in str(e.value)


def test_a_prefill_server_outside_the_allow_list_is_a_request_error() -> None:
    from radixjax.engine.errors import RequestError

    with pytest.raises(RequestError, match="disaggregation-prefill-hosts"):
        decode_side()._check_allowed(Bootstrap(host="127.0.0.1", port=2, room=3))
    decode_side()._check_allowed(B)


def test_rooms_are_swept_on_a_timer_and_their_bytes_counted() -> None:
    rooms = PrefillRooms(timeout_s=0.1, sweep_s=0.05)
    rooms.complete(1, Export(5, 7, None, pieces=["k", "v", "k2"]))
    assert rooms.num_pieces() == 3 and len(rooms) == 1
    deadline = time.monotonic() + 5
    while len(rooms) and time.monotonic() < deadline:  # nobody touches the table
        time.sleep(0.02)
    assert len(rooms) == 0 and rooms.num_pieces() == 0 and rooms.num_failed == 1


def test_a_pull_that_hangs_fails_within_the_deadline_and_aborts_the_room(monkeypatch) -> None:
    """The transfer server never delivers: the request fails once its deadline passes
    (the pull waits on the side's own threads, not the loop's default executor), and
    the prefill server is told to drop the room."""
    release = threading.Event()
    transfer = types.SimpleNamespace(
        piece_format=REPLY["piece"], fingerprint="abc",
        runner=types.SimpleNamespace(cfg=types.SimpleNamespace(vocab_size=100)),
        pull=lambda address, uuids: release.wait(30))
    side = decode.DecodeSide(transfer, 0.5, {("127.0.0.1", 1)})
    aborted = []

    async def fetch(b):
        return dict(REPLY)

    async def abort(b):
        aborted.append(b)

    monkeypatch.setattr(side, "_fetch", fetch)
    monkeypatch.setattr(side, "_abort", abort)
    req = types.SimpleNamespace(prompt_ids=[1, 2, 3, 4, 5], grammar=None)

    async def run() -> None:
        t0 = time.monotonic()
        with pytest.raises(TransferError, match="longer than 0.5 s"):
            await side.receive(req, B, land=None)
        assert time.monotonic() - t0 < 5
        await asyncio.sleep(0)  # the abort task
        assert aborted == [B]

    try:
        asyncio.run(run())
    finally:
        release.set()
