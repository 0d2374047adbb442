"""Where a program's requests go. Both backends speak SGLang's native /generate (a body
in SGLang's fields in, its JSON answer out), so the language above them is one piece of
code and a program gives the same text on either:

    EngineBackend(engine)       in this process: api/native.py on an Engine, no HTTP
    RuntimeEndpoint(url)        HTTP to any server with SGLang's native API (ours too)
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from radixjax.api import native
from radixjax.api.chat_roles import CHATML, role_markers
from radixjax.api.errors import APIError
from radixjax.engine.errors import EngineError, RequestError
from radixjax.sampling.params import SamplingParamsError


class BackendError(RuntimeError):
    """The backend refused or failed a program's request (the server's message)."""


class Backend:
    markers: dict[str, tuple[str, str]]  # chat role -> (prefix, suffix)

    def generate(self, body: dict) -> dict | list[dict]:
        raise NotImplementedError

    def stream(self, body: dict) -> Iterator[dict]:
        """SGLang's stream bodies for one prompt: cumulative text, then the last one with
        its finish_reason."""
        raise NotImplementedError

    def flush_cache(self) -> None:
        raise NotImplementedError


class EngineBackend(Backend):
    """An in-process Engine (with its tokenizer). Calls block their thread and run
    concurrently from many threads (run_batch, forks): the engine batches them."""

    def __init__(self, engine: Any) -> None:
        if engine.tokenizer is None:
            raise ValueError("the language needs an engine with a tokenizer")
        self.engine = engine
        self.markers = role_markers(engine.tokenizer)

    def _items(self, body: dict) -> tuple[native.NativeBatch, list[list[int]]]:
        try:
            batch = native.parse_generate(body)
        except APIError as e:
            raise BackendError(e.message) from None
        tok = self.engine.tokenizer
        ids = [p if isinstance(p, list) else tok(p).input_ids for p in
               (item.prompt for item in batch.items)]
        return batch, ids

    def generate(self, body: dict) -> dict | list[dict]:
        batch, ids = self._items(body)

        async def run() -> list:
            return await asyncio.gather(*(
                self.engine.agenerate(p, item.sampling, item.index)
                for item, p in zip(batch.items, ids, strict=True)))

        try:
            outs = asyncio.run(run())
        except (RequestError, SamplingParamsError, EngineError) as e:
            raise BackendError(str(e)) from None
        tok, eos = self.engine.tokenizer, self.engine.eos_token_ids
        bodies = [native.response(item, p, out, tok, eos)
                  for item, p, out in zip(batch.items, ids, outs, strict=True)]
        return bodies if batch.batched else bodies[0]

    def stream(self, body: dict) -> Iterator[dict]:
        batch, ids = self._items(body)
        if len(batch.items) != 1:
            raise BackendError("stream one prompt at a time")
        state = native.StreamState(batch.items[0], ids[0], self.engine.tokenizer,
                                   self.engine.eos_token_ids)
        chunks: queue.Queue = queue.Queue()

        async def pump() -> None:
            try:
                async for chunk in self.engine.generate_stream(ids[0], batch.items[0].sampling):
                    chunks.put(chunk)
            except Exception as e:  # noqa: BLE001 (handed to the reading thread)
                chunks.put(e)
            chunks.put(None)

        threading.Thread(target=asyncio.run, args=(pump(),), daemon=True).start()
        while (chunk := chunks.get()) is not None:
            if isinstance(chunk, Exception):
                raise BackendError(str(chunk))
            out = state.push(chunk)
            if out is not None:
                yield out

    def flush_cache(self) -> None:
        self.engine.flush_cache()


class RuntimeEndpoint(Backend):
    """A server's native API over HTTP. Chat roles: the server's published markers
    (/get_model_info "chat_role_markers", ours), else ChatML."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        # idle connections dropped after 3 s: before a server closes them (uvicorn's
        # default, SGLang's too, is 5 s; a request racing that close fails outright)
        self._client = httpx.Client(base_url=self.base_url, headers=headers,
                                    timeout=timeout, limits=httpx.Limits(
                                        max_connections=256, max_keepalive_connections=64,
                                        keepalive_expiry=3.0))
        info = self._check(self._client.get("/get_model_info")).json()
        self.model_info = info
        markers = info.get("chat_role_markers") or CHATML
        self.markers = {role: tuple(pair) for role, pair in markers.items()}

    @staticmethod
    def _check(r: httpx.Response) -> httpx.Response:
        if r.status_code != 200:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text
            raise BackendError(f"HTTP {r.status_code}: {message}")
        return r

    def generate(self, body: dict) -> dict | list[dict]:
        return self._check(self._client.post("/generate", json=body)).json()

    def stream(self, body: dict) -> Iterator[dict]:
        with self._client.stream("POST", "/generate", json=dict(body, stream=True)) as r:
            if r.status_code != 200:
                r.read()
                self._check(r)
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    raise BackendError(data["error"]["message"])
                yield data

    def flush_cache(self) -> None:
        self._check(self._client.post("/flush_cache"))
