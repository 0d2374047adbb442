"""One streamed OpenAI request over HTTP: what came back and when.

Works against any OpenAI-compatible server (ours, llama.cpp's llama-server, vLLM,
SGLang): POST /v1/completions or /v1/chat/completions with "stream": true, read the SSE
lines, stamp each chunk that carries text. Only fields every one of them accepts are
sent (our server rejects unknown fields); `ignore_eos` is an extension that ours,
llama-server, vLLM and SGLang all take."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def served_model(base_url: str) -> str:
    """The first model id the server lists at GET /v1/models."""
    r = httpx.get(base_url + "/v1/models", timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


@dataclass
class RequestRecord:
    """Times are seconds on time.perf_counter(). `chunk_times` are the arrival times of
    the chunks that carried text (the first one is the first token)."""

    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0  # counted with the model's tokenizer (the same for all servers)
    completion_tokens: int = 0  # the server's usage when given, else the tokenizer's count
    server_prompt_tokens: int | None = None
    server_completion_tokens: int | None = None
    server_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def request_body(model: str, max_tokens: int, *, prompt: str | None = None,
                 messages: list[dict[str, str]] | None = None, ignore_eos: bool = True,
                 response_format: dict[str, Any] | None = None) -> dict[str, Any]:
    """Greedy, streamed, with usage in the last chunk."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt / messages")
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    body.update({"prompt": prompt} if prompt is not None else {"messages": messages})
    if ignore_eos:
        body["ignore_eos"] = True
    if response_format is not None:
        body["response_format"] = response_format
    return body


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text of one streamed chunk (completions: `text`; chat: `delta.content`)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    return (c.get("delta") or {}).get("content") or ""


async def send(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
               timeout: float) -> RequestRecord:
    """POST one streamed request; never raises for server-side failures (they go to
    `record.error`)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    rec = RequestRecord(start=time.perf_counter())
    try:
        async with client.stream("POST", base_url + path, json=body, timeout=timeout) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}"
                return rec
            parts: list[str] = []
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = json.dumps(chunk["error"])[:300]
                    break
                text = chunk_text(chunk)
                if text:
                    rec.chunk_times.append(time.perf_counter())
                    parts.append(text)
                for c in chunk.get("choices") or []:
                    rec.finish_reason = c.get("finish_reason") or rec.finish_reason
                if chunk.get("usage"):
                    rec.server_prompt_tokens = chunk["usage"].get("prompt_tokens")
                    rec.server_completion_tokens = chunk["usage"].get("completion_tokens")
                    details = chunk["usage"].get("prompt_tokens_details") or {}
                    rec.server_cached_tokens = details.get("cached_tokens")
            rec.text = "".join(parts)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end = time.perf_counter()
    if rec.error is None and not rec.chunk_times:
        rec.error = "no text in the stream"
    return rec
