"""The decode server's side: before a disaggregated request joins the scheduler, fetch
its prompt's KV from the prefill server and land it in this engine's radix tree.

    fetch   POST {prefill}/disagg/fetch {room} (waits for the prefill) -> where to pull
    pull    the pieces over the transfer server (off the loop)
    land    the engine's land (engine/handoff.py), on its loop: slots for the prompt,
            the pieces scattered into them, the prompt in the radix tree
    then    the request enters with its first token (the prefill's) already generated:
            admission finds the whole prompt cached and extends over that one token,
            exactly as a request resumed after a retraction
A failure at any point is a TransferError for the client, with nothing held here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from radixjax.cache.errors import OutOfKVSlots
from radixjax.disagg.bootstrap import Bootstrap
from radixjax.disagg.kv_transfer import KVTransfer
from radixjax.disagg.rooms import TransferError
from radixjax.engine.handoff import LandKV
from radixjax.engine.request import Req


class DecodeSide:
    mode = "decode"

    def __init__(self, transfer: KVTransfer, timeout_s: float) -> None:
        self.transfer = transfer
        self.timeout_s = timeout_s
        self.num_received = 0
        self.bytes_received = 0
        self.pull_seconds = 0.0

    def stats(self) -> dict[str, float]:
        return {"disagg_transfers": self.num_received, "disagg_bytes": self.bytes_received,
                "disagg_pull_s": self.pull_seconds}

    async def _fetch(self, b: Bootstrap) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s + 5) as client:
                r = await client.post(f"{b.url}/disagg/fetch", json={
                    "room": b.room, "timeout": self.timeout_s})
        except httpx.HTTPError as e:
            raise TransferError(f"the prefill server {b.url} did not answer: "
                                f"{type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise TransferError(f"the prefill server {b.url}: {r.text[:300]}")
        reply = r.json()
        if reply.get("piece") != self.transfer.piece_format:
            raise TransferError(f"the prefill server's KV pieces are {reply.get('piece')}, "
                                f"this server's {self.transfer.piece_format} (a different "
                                "model, --kv-cache-dtype or chunk size)")
        return reply

    async def _abort(self, b: Bootstrap) -> None:
        """Best effort: the prefill server aborts the room's request and drops the room."""
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                await client.post(f"{b.url}/disagg/abort", json={"room": b.room})
        except httpx.HTTPError:
            pass

    async def receive(self, req: Req, b: Bootstrap, land: LandKV) -> None:
        try:
            reply = await self._fetch(b)
        except asyncio.CancelledError:  # the client left: so does the prefill
            asyncio.get_running_loop().create_task(self._abort(b))
            raise
        n = len(req.prompt_ids)
        if reply["prompt_len"] != n:
            raise TransferError(f"the prefill server's prompt has {reply['prompt_len']} "
                                f"tokens, this one {n}: different tokenizers?")
        t0 = time.perf_counter()
        try:
            pieces = await asyncio.to_thread(self.transfer.pull, reply["address"],
                                             reply["uuids"])
        except Exception as e:  # noqa: BLE001 - the transfer server's errors are plain
            raise TransferError(f"pulling the KV failed: {e}") from e
        pulled = time.perf_counter() - t0
        first = int(reply["first_token"])
        if req.grammar is not None and not req.grammar.accept(first):
            raise TransferError("the prefill's first token breaks the request's grammar")
        try:
            await land(req, lambda slots: self.transfer.import_(pieces, slots))
        except OutOfKVSlots as e:
            raise TransferError(f"no room for the prompt's KV here: {e}") from e
        req.output_ids = [first]
        if req.sampling.logprobs:  # the prefill's logprob; its top logprobs stay there
            req.logprobs = [float(reply.get("first_logprob") or 0.0)]
            req.top_logprobs = [[]] if req.sampling.top_logprobs else []
        self.num_received += 1
        self.bytes_received += len(pieces) * self.transfer.piece_bytes
        self.pull_seconds += pulled
