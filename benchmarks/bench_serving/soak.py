"""A bounded soak against one server: `concurrency` clients for `duration` seconds, each
looping over a random mix of good and bad requests, streaming and not, some of them
leaving early. Afterwards: every greedy answer is compared with the same request sent
alone, the server must be idle with no KV held, and its resident memory growth is
reported. Used by tests/bench_serving/test_soak.py (short) and benchmarks/soak.py (the
issue's ~2 minutes at 64 concurrent).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

PROMPTS = ("Name a fruit.", "What is 2 + 2?", "Say hello in French.", "List three colors.",
           "Write one word.", "Tell me a fact about the sea.")
BAD = [  # (raw body, or fields sent with the model's name; the expected status)
    (b'{"model": "m", "prompt": ', 400),  # broken JSON
    (b'{"prompt": "hi"}', 400),  # no model
    ({"prompt": "hi", "temperature": -1}, 400),
    ({"prompt": "", "max_tokens": 4}, 400),
    ({"prompt": "hi", "max_tokens": 0}, 400),
    ({"prompt": "hi", "n": 1000}, 400),
    ({"prompt": "hi", "model": "gpt-9"}, 404),
]
KINDS = ("greedy", "greedy_stream", "sampled", "sampled_stream", "bad", "leave_stream",
         "leave_plain")


@dataclass
class SoakReport:
    statuses: Counter = field(default_factory=Counter)  # (kind, status) -> count
    greedy: dict = field(default_factory=dict)  # (prompt, max_tokens) -> set of texts
    hung: int = 0  # requests that got no answer within the timeout
    mismatches: list = field(default_factory=list)  # greedy answers != alone
    internal_errors: int = 0  # exceptions the server logged meanwhile (e.g. after a
    # client left: invisible to the clients)
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    stats: dict = field(default_factory=dict)  # the server's, once idle


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _stream_text(client: httpx.AsyncClient, url: str, body: dict,
                       leave_after: int | None) -> tuple[int, str]:
    text = []
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, ""
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return 500, ""
            text.append(event["choices"][0]["text"])
            if leave_after is not None and len(text) >= leave_after:
                return 499, ""  # leaves: closing the stream aborts the request
    return 200, "".join(text)


async def _one(client: httpx.AsyncClient, base: str, model: str, rng: random.Random,
               report: SoakReport, timeout: float, any_4xx: bool = False) -> None:
    """any_4xx: a bad request may get any 4xx (a router that checks bodies itself)."""
    kind = rng.choice(KINDS)
    url = base + "/v1/completions"
    prompt = rng.choice(PROMPTS)
    max_tokens = rng.choice([4, 12, 24])
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if kind.startswith("greedy"):
        body["temperature"] = 0
    try:
        async with asyncio.timeout(timeout):
            if kind == "bad":
                raw, expect = rng.choice(BAD)
                if isinstance(raw, dict):
                    r = await client.post(url, json={"model": model, **raw})
                else:
                    r = await client.post(url, content=raw,
                                          headers={"content-type": "application/json"})
                status = r.status_code
                assert status == expect or (any_4xx and 400 <= status < 500), (
                    raw, status, r.text)
            elif kind in ("greedy_stream", "sampled_stream", "leave_stream"):
                leave = rng.randint(1, 3) if kind == "leave_stream" else None
                status, text = await _stream_text(client, url, dict(body, stream=True), leave)
                if kind == "greedy_stream" and status == 200:
                    report.greedy.setdefault((prompt, max_tokens), set()).add(text)
            elif kind == "leave_plain":
                try:
                    await client.post(url, json=dict(body, max_tokens=200, ignore_eos=True),
                                      timeout=httpx.Timeout(30, read=rng.uniform(0.2, 1.0)))
                    status = 200
                except httpx.ReadTimeout:
                    status = 499  # left: the server aborts it
            else:
                r = await client.post(url, json=body)
                status = r.status_code
                if kind == "greedy" and status == 200:
                    text = r.json()["choices"][0]["text"]
                    report.greedy.setdefault((prompt, max_tokens), set()).add(text)
    except TimeoutError:
        report.hung += 1
        status = -1
    report.statuses[(kind, status)] += 1


async def run_soak(base: str, model: str, duration: float, concurrency: int,
                   seed: int = 0, timeout: float = 120.0) -> SoakReport:
    info = httpx.get(base + "/get_server_info", timeout=30).json()
    pid = info["pid"]
    rss_before = _rss_mb(pid)
    report = await run_traffic(base, model, duration, concurrency, seed, timeout,
                               idle_of=[base])
    report.rss_before_mb, report.rss_after_mb = rss_before, _rss_mb(pid)
    after = httpx.get(base + "/get_server_info", timeout=30).json()
    report.internal_errors = after["num_internal_errors"] - info["num_internal_errors"]
    return report


async def run_traffic(base: str, model: str, duration: float, concurrency: int,
                      seed: int = 0, timeout: float = 120.0,
                      idle_of: list[str] = (), router: bool = False) -> SoakReport:
    """The clients against `base` (a server, or with `router` a router in front of
    several); then, once every server of idle_of is idle (report.stats: the last one's),
    each greedy answer seen is compared with the same request sent alone."""
    report = SoakReport()
    end = time.monotonic() + duration
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < end:
                await _one(client, base, model, rng, report, timeout, router)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        for url in idle_of:
            report.stats = await _wait_idle(client, url)
        for (prompt, max_tokens), texts in sorted(report.greedy.items()):
            r = await client.post(base + "/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
            alone = r.json()["choices"][0]["text"]
            report.mismatches += [(prompt, max_tokens, t, alone) for t in texts if t != alone]
    return report


async def _wait_idle(client: httpx.AsyncClient, base: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = (await client.get(base + "/get_server_info")).json()["stats"]
        idle = stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_held"] == 0
        if idle or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)
