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
import concurrent.futures
import time
from typing import Any

import httpx

from radixjax.cache.errors import OutOfKVSlots
from radixjax.disagg.bootstrap import Bootstrap
from radixjax.disagg.kv_transfer import KVTransfer, num_pieces
from radixjax.disagg.rooms import TransferError
from radixjax.engine.errors import RequestError
from radixjax.engine.handoff import LandKV
from radixjax.engine.request import Req


class DecodeSide:
    mode = "decode"

    def __init__(self, transfer: KVTransfer, timeout_s: float,
                 prefill_hosts: set[tuple[str, int]] = frozenset(),
                 api_key: str | None = None) -> None:
        """prefill_hosts: the (host, HTTP port) pairs a request may name; api_key: sent
        to them (as the client's Authorization)."""
        self.transfer = transfer
        self.timeout_s = timeout_s
        self.prefill_hosts = prefill_hosts
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # pulls wait on the network: their own threads, not the loop's default executor
        # (tokenization, the scheduler's result processing)
        self._pulls = concurrent.futures.ThreadPoolExecutor(4, "kv-pull")
        self.num_received = 0
        self.bytes_received = 0
        self.pull_seconds = 0.0

    def stats(self) -> dict[str, float]:
        return {"disagg_transfers": self.num_received, "disagg_bytes": self.bytes_received,
                "disagg_pull_s": self.pull_seconds}

    def prepare(self, req: Req, bootstrap: Bootstrap) -> None:
        raise RequestError("this is a decode server: send the prefill half of a "
                           "disaggregated request to a prefill server")

    def _check_allowed(self, b: Bootstrap) -> None:
        if (b.host, b.port) not in self.prefill_hosts:
            raise RequestError(
                f"bootstrap_host {b.host}:{b.port} is not one of this decode server's "
                "prefill servers (--disaggregation-prefill-hosts)")

    async def _fetch(self, b: Bootstrap) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s + 5) as client:
                r = await client.post(f"{b.url}/disagg/fetch", headers=self._headers,
                                      json={"room": b.room, "timeout": self.timeout_s})
        except httpx.HTTPError as e:
            raise TransferError(f"the prefill server {b.url} did not answer: "
                                f"{type(e).__name__}") from e
        if r.status_code != 200:
            raise TransferError(f"the prefill server {b.url} refused room {b.room}: "
                                f"{_reason(r)}")
        reply = _reply(r)
        if reply is None:
            raise TransferError(f"the prefill server {b.url} answered something else than "
                                "a room's KV")
        if reply["piece"] != self.transfer.piece_format:
            raise TransferError(f"the prefill server's KV pieces are {reply['piece']}, "
                                f"this server's {self.transfer.piece_format} (a different "
                                "model, --kv-cache-dtype or chunk size)")
        if reply["fingerprint"] != self.transfer.fingerprint:
            raise TransferError(f"the prefill server {b.url} serves another model (its "
                                "weights or config differ from this server's)")
        return reply

    async def _abort(self, b: Bootstrap) -> None:
        """Best effort: the prefill server aborts the room's request and drops the room."""
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                await client.post(f"{b.url}/disagg/abort", headers=self._headers,
                                  json={"room": b.room})
        except httpx.HTTPError:
            pass

    async def receive(self, req: Req, b: Bootstrap, land: LandKV) -> None:
        """Fetch, pull and land the prompt's KV. Raises RequestError (a prefill server
        not allowed: nothing fetched) or TransferError; either way after the fetch began
        the prefill server is told to drop the room."""
        self._check_allowed(b)
        try:
            await self._receive(req, b, land)
        except BaseException:  # incl. the client leaving: so does the prefill
            asyncio.get_running_loop().create_task(self._abort(b))
            raise

    async def _receive(self, req: Req, b: Bootstrap, land: LandKV) -> None:
        deadline = time.monotonic() + self.timeout_s
        reply = await self._fetch(b)
        n = len(req.prompt_ids)
        if reply["prompt_len"] != n:
            raise TransferError(f"the prefill server's prompt has {reply['prompt_len']} "
                                f"tokens, this one {n}: different tokenizers?")
        first = reply["first_token"]
        if not 0 <= first < self.transfer.runner.cfg.vocab_size:
            raise TransferError(f"the prefill server's first token {first} is not in the "
                                "vocabulary")
        if len(reply["uuids"]) != num_pieces(n):
            raise TransferError(f"the prefill server offers {len(reply['uuids'])} KV "
                                f"pieces for a prompt of {n} tokens")
        t0 = time.perf_counter()
        pull = asyncio.get_running_loop().run_in_executor(
            self._pulls, self.transfer.pull, reply["address"], reply["uuids"])
        try:
            pieces = await asyncio.wait_for(pull, max(1.0, deadline - time.monotonic()))
        except TimeoutError as e:
            raise TransferError(f"pulling the KV took longer than {self.timeout_s:g} s") from e
        except Exception as e:  # noqa: BLE001 - the transfer server's errors are plain
            raise TransferError(f"pulling the KV failed: {type(e).__name__}") from e
        pulled = time.perf_counter() - t0
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


REPLY_FIELDS = {"prompt_len": int, "first_token": int, "address": str, "uuids": list,
                "piece": str, "fingerprint": str}


def _reply(r: httpx.Response) -> dict[str, Any] | None:
    """The fetch's answer if it has our fields and types, else None."""
    try:
        reply = r.json()
    except ValueError:
        return None
    if not isinstance(reply, dict) or not all(
            isinstance(reply.get(k), t) for k, t in REPLY_FIELDS.items()):
        return None
    if not all(isinstance(u, int) for u in reply["uuids"]):
        return None
    return reply


def _reason(r: httpx.Response) -> str:
    """Why a prefill server refused: the reason it gave for a failed room (our own
    protocol's 409 transfer_error), else only its status: nothing else of a peer's body
    goes back to a client."""
    try:
        error = r.json()["error"]
        if r.status_code == 409 and error["type"] == "transfer_error":
            return "".join(c for c in str(error["message"])[:300] if c.isprintable())
    except (ValueError, KeyError, TypeError):
        pass
    return f"HTTP {r.status_code}"
