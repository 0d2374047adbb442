"""When to send: sessions arrive at a Poisson request rate (or all at once), each request
waits for one of `max_concurrency` slots, and the run stops starting requests after
`num_requests` or `max_duration` seconds (requests in flight then finish).

Turns of one session go one after another (turn i+1 needs turn i's answer); sessions
run side by side, so a multi-turn workload keeps at most `len(sessions)` requests in
flight whatever the concurrency."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench_serving.client import RequestRecord, request_body, send
from bench_serving.metrics import Metrics, compute_metrics, hit_rate_between, parse_prometheus
from bench_serving.workloads import Session, Tokenizer, Workload, chat_messages


@dataclass(frozen=True)
class RunConfig:
    base_url: str
    model: str
    max_concurrency: int | None = None  # None: unbounded
    request_rate: float = float("inf")  # sessions / s; inf: all start at once
    num_requests: int | None = None  # None: the whole workload
    max_duration: float | None = None  # seconds; None: no limit
    request_timeout: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if self.request_rate <= 0:
            raise ValueError("request_rate must be > 0")


@dataclass
class RunResult:
    workload: str
    records: list[RequestRecord]
    metrics: Metrics


class _Budget:
    """Requests left to start (count and deadline), shared by all sessions."""

    def __init__(self, num_requests: int, max_duration: float | None) -> None:
        self.left = num_requests
        self.deadline = time.perf_counter() + max_duration if max_duration else float("inf")

    def take(self) -> bool:
        if self.left <= 0 or time.perf_counter() >= self.deadline:
            return False
        self.left -= 1
        return True


def count_prompt_tokens(tok: Any, prompt: str | None,
                        messages: list[dict[str, str]] | None) -> int:
    """The prompt's length with the model's tokenizer (chat: its chat template)."""
    if messages is not None:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tok.encode(prompt, add_special_tokens=False))
    return len(tok.encode(prompt))


def arrival_delays(num: int, rate: float, rng: random.Random) -> list[float]:
    """Start offsets (s) of `num` sessions: a Poisson process at `rate`, or all zero."""
    if rate == float("inf"):
        return [0.0] * num
    t, delays = 0.0, []
    for _ in range(num):
        delays.append(t)
        t += rng.expovariate(rate)
    return delays


async def _run_session(client: httpx.AsyncClient, cfg: RunConfig, tok: Tokenizer,
                       session: Session, delay: float, slots: asyncio.Semaphore | None,
                       budget: _Budget, records: list[RequestRecord]) -> None:
    await asyncio.sleep(delay)
    answers: list[str] = []
    for i, turn in enumerate(session.turns):
        if slots is not None:
            await slots.acquire()
        try:
            if not budget.take():
                return
            messages = chat_messages(session, i, answers) if session.is_chat else None
            prompt = None if session.is_chat else turn.prompt
            body = request_body(cfg.model, turn.max_tokens, prompt=prompt, messages=messages,
                                ignore_eos=turn.ignore_eos,
                                response_format=turn.response_format)
            rec = await send(client, cfg.base_url, body, cfg.request_timeout)
        finally:
            if slots is not None:
                slots.release()
        rec.prompt_tokens = count_prompt_tokens(tok, prompt, messages)
        rec.completion_tokens = (rec.server_completion_tokens
                                 if rec.server_completion_tokens is not None
                                 else len(tok.encode(rec.text, add_special_tokens=False)))
        records.append(rec)
        if not rec.ok:
            return  # a conversation cannot go on without its answer
        answers.append(rec.text)


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    """Our server's Prometheus samples; {} from a server without /metrics."""
    try:
        r = await client.get(base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return {}
    return parse_prometheus(r.text) if r.status_code == 200 else {}


async def late_compiles(client: httpx.AsyncClient, base_url: str) -> int | None:
    """Our server's count of step shapes compiled after start-up; None elsewhere."""
    try:
        r = await client.get(base_url + "/get_server_info", timeout=10)
        return int(r.json()["stats"]["num_late_compiles"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


async def run_workload(workload: Workload, cfg: RunConfig, tok: Tokenizer) -> RunResult:
    """Send the workload, time it, and sum it up (cache hit rate from /metrics deltas)."""
    limits = httpx.Limits(max_connections=cfg.max_concurrency or 1000)
    async with httpx.AsyncClient(limits=limits) as client:
        before = await scrape_metrics(client, cfg.base_url)
        compiles_before = await late_compiles(client, cfg.base_url)
        slots = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        budget = _Budget(cfg.num_requests or workload.num_requests, cfg.max_duration)
        delays = arrival_delays(len(workload.sessions), cfg.request_rate,
                                random.Random(cfg.seed))
        records: list[RequestRecord] = []
        start = time.perf_counter()
        await asyncio.gather(*(
            _run_session(client, cfg, tok, s, d, slots, budget, records)
            for s, d in zip(workload.sessions, delays, strict=True)))
        duration = time.perf_counter() - start
        after = await scrape_metrics(client, cfg.base_url)
        compiles_after = await late_compiles(client, cfg.base_url)
    compiled = (compiles_after - compiles_before
                if compiles_before is not None and compiles_after is not None else None)
    metrics = compute_metrics(records, duration, hit_rate_between(before, after), compiled)
    return RunResult(workload.name, records, metrics)
