"""A randomized traffic mix through the real server (the session's warmed server, OpenAI's
own client): greedy and sampled (OpenAI's default temperature), logprobs / top_logprobs,
penalties, JSON schema and regex, n > 1, prompts from a few tokens to most of the
context, outputs up to the context limit, 1 to 8 concurrent. Nothing compiles late,
every answer is well formed, and no KV is held afterwards."""

from __future__ import annotations

import asyncio
import json
import math
import random

import httpx
import openai

from tests.server.conftest import MODEL, wait_idle

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}
WORDS = "the of a radix tree shares every prefix down to one token while the pool".split()


def _prompt(rng: random.Random) -> str:
    n = rng.choice([1, 3, 20, 120, 300])  # words; a word is one or two tokens
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _request(rng: random.Random) -> tuple[str, dict]:
    kind = rng.choice(["plain", "sampled", "logprobs", "penalties", "json", "regex", "n2",
                       "long"])
    body: dict = {"model": MODEL, "max_tokens": rng.choice([1, 8, 24])}
    msgs = [{"role": "user", "content": _prompt(rng)}]
    if kind == "plain":
        body["temperature"] = 0
    elif kind == "logprobs":
        body.update(logprobs=True, top_logprobs=rng.choice([1, 5, 20]))
    elif kind == "penalties":
        body.update(frequency_penalty=0.7, presence_penalty=0.3, temperature=0.8)
    elif kind == "json":
        body.update(response_format={"type": "json_schema", "json_schema": {
            "name": "c", "schema": SCHEMA}}, max_tokens=40, logprobs=True, top_logprobs=3)
    elif kind == "regex":
        body.update(extra_body={"regex": r"(yes|no), [a-z]{1,8}\."}, max_tokens=16)
    elif kind == "n2":
        body.update(n=2, temperature=1.0)
    elif kind == "long":  # asks for more than the context holds: ends at its limit
        body.update(max_tokens=480, temperature=0)
        msgs = [{"role": "user", "content": "hi"}]
    body["messages"] = msgs
    return kind, body


async def _one(client: openai.AsyncOpenAI, kind: str, body: dict) -> None:
    extra = body.pop("extra_body", None)
    r = await client.chat.completions.create(**body, extra_body=extra)
    assert len(r.choices) == body.get("n", 1)
    for c in r.choices:
        assert c.finish_reason in ("stop", "length")
        text = c.message.content
        if kind == "json" and c.finish_reason == "stop":
            assert isinstance(json.loads(text)["city"], str)
        if body.get("logprobs"):
            for t in c.logprobs.content:
                assert math.isfinite(t.logprob)
                assert all(math.isfinite(x.logprob) for x in t.top_logprobs)
        if kind == "long":
            assert c.finish_reason == "length"


async def _traffic(url: str, seed: int, num: int) -> dict[str, int]:
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=300)
    kinds: dict[str, int] = {}
    pending = [_request(rng) for _ in range(num)]
    while pending:  # waves of 1 .. 8 concurrent requests
        wave = pending[: rng.randint(1, 8)]
        pending = pending[len(wave):]
        await asyncio.gather(*(_one(client, k, b) for k, b in wave))
        for k, _ in wave:
            kinds[k] = kinds.get(k, 0) + 1
    return kinds


def test_random_traffic_mix_compiles_nothing_late(server: str) -> None:
    before = httpx.get(server + "/get_server_info").json()["stats"]
    kinds = asyncio.run(_traffic(server, seed=7, num=40))
    assert len(kinds) == 8  # every kind of request was sent
    stats = wait_idle(server)
    assert stats["kv_held"] == 0
    assert stats["num_late_compiles"] == before["num_late_compiles"] == 0
    metrics = httpx.get(server + "/metrics").text
    assert "radixjax_num_late_compiles 0.0" in metrics
    assert f"radixjax_num_step_programs {stats['num_step_programs']:.1f}" in metrics
