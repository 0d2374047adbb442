"""A randomized mix of OpenAI chat requests (the real `openai` client) against one server:
greedy and sampled (OpenAI's default temperature), logprobs / top_logprobs, penalties,
JSON schema and regex, n > 1, prompts of a few to thousands of tokens, outputs up to the
context limit, waves of 1 .. max_concurrency concurrent requests. Every answer is checked
(finish reason, JSON validity, finite logprobs). Used by tests/bench_serving (small) and
benchmarks/traffic_mix.py (the issue's sizes).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass

import openai

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}
WORDS = "the of a radix tree shares every prefix down to one token while the pool".split()
KINDS = ("plain", "sampled", "logprobs", "penalties", "json", "regex", "n2", "long")


@dataclass(frozen=True)
class MixConfig:
    model: str
    num_requests: int = 40
    max_concurrency: int = 8
    prompt_words: tuple[int, ...] = (1, 3, 20, 120, 300)  # a word is one or two tokens
    long_prompt_words: int = 350  # "long" requests: a prompt this long, then an answer to
    # the end of the context (the max_tokens that fills it: more is a 400)
    seed: int = 7


def _request(rng: random.Random, cfg: MixConfig, kind: str) -> tuple[str, dict]:
    body: dict = {"model": cfg.model, "max_tokens": rng.choice([1, 8, 24])}
    words = rng.choice(cfg.prompt_words)
    msgs = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))}]
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
    elif kind == "long":  # answers to the end of the context (its max_tokens: _one)
        body.update(temperature=0,
                    extra_body={"ignore_eos": True})  # SGLang's field: no early EOS
        msgs = [{"role": "user", "content": " ".join(
            rng.choice(WORDS) for _ in range(cfg.long_prompt_words))}]
    body["messages"] = msgs
    return kind, body


async def _one(client: openai.AsyncOpenAI, kind: str, body: dict) -> None:
    extra = body.pop("extra_body", None)
    if kind == "long":  # the room left after the prompt: one more token is a 400
        context = (await client.models.list()).data[0].max_model_len
        probe = await client.chat.completions.create(**dict(body, max_tokens=1))
        room = context - probe.usage.prompt_tokens
        try:
            await client.chat.completions.create(**dict(body, max_tokens=room + 1))
            raise AssertionError("max_tokens past the context was accepted")
        except openai.BadRequestError as e:
            assert "maximum context length" in str(e), e
        body["max_tokens"] = room
    r = await client.chat.completions.create(**body, extra_body=extra)
    assert len(r.choices) == body.get("n", 1)
    for c in r.choices:
        assert c.finish_reason in ("stop", "length"), c.finish_reason
        if kind == "json" and c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content)["city"], str)
        if body.get("logprobs"):
            for t in c.logprobs.content:
                assert math.isfinite(t.logprob)
                assert all(math.isfinite(x.logprob) for x in t.top_logprobs)
        if kind == "long":
            assert c.finish_reason == "length"


async def run_mix(url: str, cfg: MixConfig) -> dict[str, int]:
    """Send the mix; returns how many requests of each kind were answered (all checked)."""
    rng = random.Random(cfg.seed)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=900)
    kinds: dict[str, int] = {}
    # one of each kind first (in random order), then kinds at random
    extra = max(cfg.num_requests - len(KINDS), 0)
    sent = rng.sample(KINDS, len(KINDS)) + [rng.choice(KINDS) for _ in range(extra)]
    pending = [_request(rng, cfg, k) for k in sent[: cfg.num_requests]]
    while pending:  # waves of 1 .. max_concurrency concurrent requests
        wave = pending[: rng.randint(1, cfg.max_concurrency)]
        pending = pending[len(wave):]
        await asyncio.gather(*(_one(client, k, b) for k, b in wave))
        for k, _ in wave:
            kinds[k] = kinds.get(k, 0) + 1
    return kinds
