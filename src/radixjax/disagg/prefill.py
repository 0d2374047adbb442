"""The prefill server's side: run a disaggregated request's prompt (and its first token),
export the prompt's KV when it finishes, hand it to the decode server that fetches it.

    request (room R)  -> prepare() (engine/handoff.py): one new token; the scheduler
                         calls the finish hook before the request's slots go back to
                         the radix tree
    finish hook       -> export the prompt's slots (gather, on the scheduler's loop),
                         rooms.complete(R) — or rooms.fail(R) if the request failed
    POST /disagg/fetch -> fetch(R): wait for the room, offer its pieces to the transfer
                         server, answer where and what to pull
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from radixjax.disagg.bootstrap import Bootstrap
from radixjax.disagg.kv_transfer import KVTransfer
from radixjax.disagg.rooms import Export, PrefillRooms
from radixjax.engine.errors import RequestError
from radixjax.engine.request import Req


class PrefillSide:
    mode = "prefill"

    def __init__(self, transfer: KVTransfer, timeout_s: float) -> None:
        self.transfer = transfer
        self.rooms = PrefillRooms(timeout_s, sweep_s=max(1.0, timeout_s / 4))

    def prepare(self, req: Req, bootstrap: Bootstrap) -> None:
        room = bootstrap.room
        self.rooms.expect(room, req.rid)
        req.sampling = replace(req.sampling, max_new_tokens=1)

        def on_finish_kv(r: Req, reason: str, slots: np.ndarray | None) -> None:
            if slots is None or not r.output_ids or reason not in ("stop", "length"):
                self.rooms.fail(room, f"the prefill ended without KV ({r.error or reason})")
                return
            self.rooms.complete(room, Export(
                len(r.prompt_ids), r.output_ids[0], r.logprobs[0] if r.logprobs else None,
                self.transfer.export(slots)))

        req.on_finish_kv = on_finish_kv

    async def receive(self, req: Req, bootstrap: Bootstrap, land: Any) -> None:
        raise RequestError("this is a prefill server: send the decode half of a "
                           "disaggregated request to a decode server")

    def reject(self, room: int, reason: str) -> None:
        """The server refused this room's request before it ran (bad input, overload):
        its decode server hears the reason now, not after the timeout."""
        self.rooms.fail(room, f"the prefill server refused the request: {reason}")

    def stats(self) -> dict[str, float]:
        return {"disagg_transfers": self.rooms.num_success,
                "disagg_failed": self.rooms.num_failed, "disagg_rooms": len(self.rooms),
                "disagg_room_bytes": self.rooms.num_pieces() * self.transfer.piece_bytes}

    async def fetch(self, room: int, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait up to timeout_s (at most this server's timeout) for the room. Raises
        rooms.TransferError."""
        export = await self.rooms.take(room, timeout_s)
        uuids = self.transfer.offer(export.pieces, self.rooms.timeout_s)
        return {"prompt_len": export.prompt_len, "first_token": export.first_token,
                "first_logprob": export.first_logprob, "address": self.transfer.address,
                "uuids": uuids, "piece": self.transfer.piece_format,
                "fingerprint": self.transfer.fingerprint}
