"""Limits checked before a request costs anything: the body's size (413 before it is read
whole or parsed), the prompt's length against the context (a bound that needs no
tokenizing), and the number of requests in progress (503 with Retry-After).

The prompt bound: no token's text is longer than the vocabulary's longest token string
(byte-level BPE: one character per byte), so a text of N characters has at least
N / longest tokens. Twice that bound is refused at once (the slack covers normalizers
that shrink text); anything shorter is tokenized and the engine checks the real count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from radixjax.api.errors import APIError


@dataclass(frozen=True)
class Limits:
    max_request_bytes: int = 8 << 20  # request body
    max_concurrent_requests: int = 512  # generation requests in progress (incl. streams)
    # engine requests one body may ask for (prompts x n); more is a 400
    max_batch_requests: int = 128


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than this server's limit of "
                         f"{limit} bytes", code="request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to pass `limit` bytes: from its
    Content-Length before reading anything, else while reading its chunks."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def longest_token_chars(tok: Any) -> int:
    """Characters in the vocabulary's longest token string (1 without a tokenizer)."""
    if tok is None:
        return 1
    return max(len(t) for t in tok.convert_ids_to_tokens(list(range(len(tok)))) if t)


def check_prompt_chars(num_chars: int, longest_token: int, max_context: int) -> None:
    """Refuse a text that cannot fit the context whatever it tokenizes to."""
    if num_chars > 2 * longest_token * max_context:
        raise APIError(400, f"the prompt ({num_chars} characters) is far longer than this "
                            f"model's context of {max_context} tokens",
                       "messages", code="context_length_exceeded")


class Admission:
    """Counts engine requests in progress (a body's prompts x n samples); past the limit
    a body gets 503 with Retry-After (the OpenAI client retries it after that long)."""

    def __init__(self, limit: int, max_batch: int = Limits.max_batch_requests) -> None:
        self.limit = limit
        self.max_batch = max_batch
        self.active = 0

    def enter(self) -> Ticket:
        """A body arrives: one request, until it says how many (Ticket.count)."""
        self._check(1)
        self.active += 1
        return Ticket(self)

    def _check(self, more: int) -> None:
        if self.active + more > self.limit:
            raise APIError(503, f"the server is at its limit of {self.limit} requests in "
                                "progress; retry later", type_="server_overloaded",
                           code="too_many_requests", headers={"Retry-After": "1"})


class Ticket:
    """One admitted body; `release` is idempotent (a stream releases from its body's
    end and from the response's background task, whichever runs)."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission
        self._count = 1

    def count(self, num_requests: int) -> None:
        """The body asks for this many engine requests: a 400 past the batch limit, a
        503 past the server's limit (then nothing more is held)."""
        a = self._admission
        if a is None or num_requests <= self._count:
            return
        if num_requests > a.max_batch:
            raise APIError(400, f"{num_requests} requests in one body (prompts x n); this "
                                f"server takes at most {a.max_batch}", code="batch_too_large")
        a._check(num_requests - self._count)
        a.active += num_requests - self._count
        self._count = num_requests

    def release(self) -> None:
        if self._admission is not None:
            self._admission.active -= self._count
            self._admission = None
