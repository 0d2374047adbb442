"""The output stage: what a request's consumer sees. Built on the scheduler's loop once
per step and handed over as immutable values, so consumers (Engine.generate, streams,
the HTTP server) never read a `Req` the scheduler is still changing.

    a step's new token ids -> IncrementalDetokenizer -> StopMatcher -> StreamChunk
    the request ends        -> held-back text flushed; the last chunk carries the
                               GenerateOutput (or the engine's error)

Cost per step follows the new tokens (engine/detokenizer.py), not the output so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixjax.engine.detokenizer import IncrementalDetokenizer, StopMatcher

TopLogprobs = list[tuple[int, float]]


@dataclass
class ReqStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the radix cache supplied (first admission)
    completion_tokens: int = 0
    num_retractions: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.admitted is None else self.admitted - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def time_per_output_token(self) -> float | None:
        if self.finished is None or self.first_token is None or self.completion_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.completion_tokens - 1)


class ReqView(Protocol):
    """What the output stage reads of a request (engine/request.py's Req)."""

    rid: str
    seed: int
    stats: ReqStats
    error: str | None
    finish_reason: str | None
    prompt_ids: Any
    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs]
    prompt_logprobs: list[float | None]
    prompt_top_logprobs: list[TopLogprobs | None]


@dataclass(frozen=True)
class GenerateOutput:
    rid: str
    text: str | None  # None when the engine has no tokenizer
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    stats: ReqStats | None = None
    # sampling.logprob_start_len >= 0: prompt positions from there on (None: position 0)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[TopLogprobs | None] = field(default_factory=list)
    seed: int | None = None  # the request's sampling seed (given, or the engine's)


@dataclass(frozen=True)
class StreamChunk:
    text: str  # new text since the previous chunk ("" when the tokenizer is absent)
    token_ids: tuple[int, ...]  # new token ids
    finish_reason: str | None = None
    output: GenerateOutput | None = None  # set on the last chunk (unless error)
    logprobs: tuple[float, ...] = ()  # of this chunk's tokens
    top_logprobs: tuple[TopLogprobs, ...] = ()
    error: str | None = None  # the engine failed this request (finish_reason "error")
    cached_tokens: int = 0  # prompt tokens the radix cache supplied (known once admitted)


OnChunk = Callable[[StreamChunk], None]  # called on the scheduler's loop


class RequestOutput:
    """One request's output state: its detokenizer and stop matcher, the text emitted,
    how many logprobs went out. Owned by the scheduler."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...],
                 skip_special_tokens: bool = True) -> None:
        self._detok = (IncrementalDetokenizer(tokenizer, skip_special_tokens)
                       if tokenizer is not None else None)
        self._stops = StopMatcher(stops)
        self._text: list[str] = []
        self._num_logprobs = 0
        self.stopped = False  # a stop string ended the text (nothing after it is shown)

    def push(self, new: list[int]) -> str:
        """A step's new ids -> the text they make safe to show."""
        if self._detok is None or self.stopped:
            return ""
        text, self.stopped = self._stops.push(self._detok.push(new))
        self._text.append(text)
        return text

    def flush(self) -> str:
        """At the end: the text still held back (a partial character, a possible stop
        start); nothing after a stop string."""
        if self._detok is None or self.stopped:
            return ""
        text, self.stopped = self._stops.push(self._detok.flush())
        if not self.stopped:
            text += self._stops.flush()
        self._text.append(text)
        return text

    def chunk(self, req: ReqView, new: list[int], text: str) -> StreamChunk:
        """A chunk of a running request (its finish_reason still None)."""
        return StreamChunk(text, tuple(new), None, None, *self._new_logprobs(req),
                           cached_tokens=req.stats.cached_tokens)

    def last_chunk(self, req: ReqView, new: list[int], text: str) -> StreamChunk:
        """The chunk that ends `req` (finish_reason set): held-back text included."""
        text += self.flush()
        lps, tops = self._new_logprobs(req)
        if req.error is not None:
            return StreamChunk(text, tuple(new), req.finish_reason, None, lps, tops,
                               error=req.error, cached_tokens=req.stats.cached_tokens)
        out = GenerateOutput(
            rid=req.rid, text="".join(self._text) if self._detok is not None else None,
            token_ids=list(req.output_ids), finish_reason=req.finish_reason,
            prompt_tokens=len(req.prompt_ids), cached_tokens=req.stats.cached_tokens,
            completion_tokens=len(req.output_ids), logprobs=list(req.logprobs),
            top_logprobs=list(req.top_logprobs), stats=req.stats,
            prompt_logprobs=list(req.prompt_logprobs),
            prompt_top_logprobs=list(req.prompt_top_logprobs), seed=req.seed,
        )
        return StreamChunk(text, tuple(new), req.finish_reason, out, lps, tops,
                           cached_tokens=req.stats.cached_tokens)

    def _new_logprobs(self, req: ReqView) -> tuple[tuple, tuple]:
        start, self._num_logprobs = self._num_logprobs, len(req.logprobs)
        return (tuple(req.logprobs[start:]), tuple(req.top_logprobs[start:]))
