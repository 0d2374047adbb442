"""The prefill server's transfer table: bootstrap room -> the prompt's exported KV.

A room goes through (SGLang's KVPoll states, named as there):

    Bootstrapping   created by whichever arrives first: the request (router -> prefill)
                    or the decode server's fetch (decode -> prefill /disagg/fetch)
    Transferring    the prefill finished: first token + KV pieces ready to be pulled
    Success         the decode server fetched it (pieces offered to its pull): removed
    Failed          the request failed or was aborted, or nobody fetched within the
                    timeout: removed, the pieces dropped

Thread-safe: the scheduler completes rooms on its loop, HTTP handlers wait on theirs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from radixjax.engine.errors import EngineError


class KVPoll(Enum):
    BOOTSTRAPPING = "bootstrapping"
    TRANSFERRING = "transferring"
    SUCCESS = "success"
    FAILED = "failed"


class TransferError(EngineError):
    """The KV of a disaggregated request did not arrive (prefill failed, died, timed out)."""


@dataclass
class Export:
    """What the decode server needs: the prompt's length, the prefill's first token (and
    its logprob), the KV pieces (kv_transfer.Piece)."""

    prompt_len: int
    first_token: int
    first_logprob: float | None
    pieces: list[Any]


@dataclass
class Room:
    created: float = field(default_factory=time.monotonic)
    result: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    rid: str | None = None  # the prefill request's id (for an abort from the decode side)

    @property
    def state(self) -> KVPoll:
        if not self.result.done():
            return KVPoll.BOOTSTRAPPING
        return KVPoll.TRANSFERRING if _succeeded(self.result) else KVPoll.FAILED


def _succeeded(f: concurrent.futures.Future) -> bool:
    return f.done() and not f.cancelled() and f.exception() is None


class PrefillRooms:
    """sweep_s: how often a timer drops rooms nobody finished or fetched in time (None:
    only when a room is touched; tests)."""

    def __init__(self, timeout_s: float, sweep_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self._rooms: dict[int, Room] = {}
        self._lock = threading.Lock()
        self.num_success = 0
        self.num_failed = 0
        if sweep_s is not None:
            threading.Thread(target=self._sweep_forever, args=(sweep_s,), daemon=True,
                             name="room-sweeper").start()

    def __len__(self) -> int:
        return len(self._rooms)

    def _sweep_forever(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            with self._lock:
                self._sweep()

    def num_pieces(self) -> int:
        """KV pieces held by finished rooms not fetched yet."""
        with self._lock:
            return sum(len(r.result.result().pieces) for r in self._rooms.values()
                       if _succeeded(r.result))

    def _room(self, room: int) -> Room:
        with self._lock:
            self._sweep()
            return self._rooms.setdefault(room, Room())

    def _sweep(self) -> None:
        """Drop rooms nobody finished or fetched in time (their pieces with them)."""
        now = time.monotonic()
        for key, r in list(self._rooms.items()):
            if now - r.created > 2 * self.timeout_s:
                del self._rooms[key]
                self.num_failed += 1
                if not r.result.done():
                    r.result.set_exception(TransferError(f"room {key} timed out"))

    def expect(self, room: int, rid: str) -> None:
        """The prefill request of this room arrived."""
        self._room(room).rid = rid

    def complete(self, room: int, export: Export) -> None:
        r = self._room(room)
        if not r.result.done():
            r.result.set_result(export)

    def fail(self, room: int, error: str) -> None:
        r = self._room(room)
        if not r.result.done():
            r.result.set_exception(TransferError(error))

    def rid_of(self, room: int) -> str | None:
        with self._lock:
            r = self._rooms.get(room)
            return None if r is None else r.rid

    async def take(self, room: int, timeout_s: float | None = None) -> Export:
        """Wait (up to timeout_s, at most this table's timeout) for the room's export and
        remove the room: each is fetched once. Raises TransferError."""
        r = self._room(room)
        timeout = min(timeout_s or self.timeout_s, self.timeout_s)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(r.result)),
                                          timeout)
        except TimeoutError as e:
            raise TransferError(f"room {room}: the prefill did not finish within "
                                f"{timeout:g} s") from e
        finally:
            with self._lock:
                if self._rooms.get(room) is r:
                    del self._rooms[room]
                    if _succeeded(r.result):
                        self.num_success += 1
                    else:
                        self.num_failed += 1
