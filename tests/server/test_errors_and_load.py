"""Bad input gets an OpenAI-style 4xx and the server keeps serving; dropped streams
free their KV; a bounded burst of concurrent streams all complete."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.server.conftest import MODEL, wait_idle

MSG = [{"role": "user", "content": "hi"}]
CHAT, COMP = "/v1/chat/completions", "/v1/completions"

# (name, path, raw body or json, expected status)
BAD_INPUTS = [
    ("broken JSON", CHAT, b'{"model": "x", "messages": [', 400),
    ("body not an object", CHAT, [1, 2, 3], 400),
    ("missing model", CHAT, {"messages": MSG}, 400),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": MSG}, 404),
    ("missing messages", CHAT, {"model": MODEL}, 400),
    ("empty messages", CHAT, {"model": MODEL, "messages": []}, 400),
    ("message without role", CHAT, {"model": MODEL, "messages": [{"content": "x"}]}, 400),
    ("content not a string", CHAT, {"model": MODEL, "messages": [{"role": "user",
                                                                  "content": 5}]}, 400),
    ("unknown field", CHAT, {"model": MODEL, "messages": MSG, "temprature": 1}, 400),
    ("temperature a string", CHAT, {"model": MODEL, "messages": MSG, "temperature": "hot"},
     400),
    ("negative temperature", CHAT, {"model": MODEL, "messages": MSG, "temperature": -1}, 400),
    ("top_p zero", CHAT, {"model": MODEL, "messages": MSG, "top_p": 0}, 400),
    ("max_tokens zero", CHAT, {"model": MODEL, "messages": MSG, "max_tokens": 0}, 400),
    ("max_tokens float", CHAT, {"model": MODEL, "messages": MSG, "max_tokens": 2.5}, 400),
    ("huge n", CHAT, {"model": MODEL, "messages": MSG, "n": 10_000}, 400),
    ("seed negative", CHAT, {"model": MODEL, "messages": MSG, "seed": -5}, 400),
    ("top_logprobs > 20", CHAT, {"model": MODEL, "messages": MSG, "logprobs": True,
                                 "top_logprobs": 50}, 400),
    ("stop not strings", CHAT, {"model": MODEL, "messages": MSG, "stop": [1, 2]}, 400),
    ("stream not bool", CHAT, {"model": MODEL, "messages": MSG, "stream": "yes"}, 400),
    ("stream_options without stream", CHAT, {"model": MODEL, "messages": MSG,
                                             "stream_options": {"include_usage": True}}, 400),
    ("frequency_penalty > 2", CHAT, {"model": MODEL, "messages": MSG,
                                     "frequency_penalty": 3}, 400),
    ("presence_penalty a list", CHAT, {"model": MODEL, "messages": MSG,
                                       "presence_penalty": [1]}, 400),
    ("valid penalties", CHAT, {"model": MODEL, "messages": MSG, "max_tokens": 4,
                               "frequency_penalty": 1.0, "presence_penalty": 0.5}, 200),
    ("empty prompt", COMP, {"model": MODEL, "prompt": ""}, 400),
    ("prompt wrong type", COMP, {"model": MODEL, "prompt": {"a": 1}}, 400),
    ("token id out of vocab", COMP, {"model": MODEL, "prompt": [1, 99_999_999]}, 400),
    ("oversized prompt", COMP, {"model": MODEL, "prompt": "hello " * 2000}, 400),
    ("max_tokens huge", COMP, {"model": MODEL, "prompt": "hi " * 490, "max_tokens": 10**12},
     400),  # past the context left after the prompt: both numbers named
    ("max_new_tokens huge", "/generate", {"text": "hi", "sampling_params": {
        "max_new_tokens": 10**6}}, 400),
    ("native: both text and ids", "/generate", {"text": "a", "input_ids": [1]}, 400),
    ("native: bad sampling param", "/generate", {"text": "a",
                                                 "sampling_params": {"temperature": -3}}, 400),
    ("unknown route", "/v1/nothing", {"model": MODEL}, 404),
]


@pytest.mark.parametrize("name,path,body,status", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_clear_error(server, name, path, body, status) -> None:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server + path, timeout=120, **kw)
    assert r.status_code == status, r.text
    if status >= 400:
        err = r.json()["error"]
        assert err["message"] and err["type"]
        if name == "temperature a string":
            assert err["message"] == "'temperature' must be a number, got str", err
        if name == "max_tokens huge":
            assert "in the prompt, 1000000000000 in the completion" in err["message"], err
    assert httpx.get(server + "/health", timeout=5).status_code == 200


def test_server_still_serves_after_bad_inputs(server) -> None:
    r = httpx.post(server + CHAT, json={"model": MODEL, "messages": MSG, "max_tokens": 4},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    stats = wait_idle(server)
    assert stats["kv_held"] == 0


def test_an_idle_connection_stays_open_past_clients_expiry(server) -> None:
    """launch_server keeps idle connections 65 s: a client (httpx's default expiry is 5 s)
    never races the server's close. The same socket serves a request after 6 s idle."""
    with httpx.Client(limits=httpx.Limits(keepalive_expiry=60)) as client:
        ports = []
        for wait in (0, 6):
            time.sleep(wait)
            r = client.get(server + "/health", timeout=30)
            assert r.status_code == 200
            ports.append(r.extensions["network_stream"].get_extra_info("socket").getsockname())
        assert ports[0] == ports[1]


def test_dropped_streams_free_their_kv(server) -> None:
    async def open_and_drop(i: int) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i}"}],
                    "max_tokens": 200, "stream": True, "ignore_eos": True}
            async with c.stream("POST", server + CHAT, json=body) as r:
                async for line in r.aiter_lines():
                    if '"content": "' in line and '"content": ""' not in line:
                        break  # got a real token: hang up mid-stream

    async def main() -> None:
        await asyncio.gather(*(open_and_drop(i) for i in range(4)))

    asyncio.run(main())
    stats = wait_idle(server)
    assert stats["num_running"] == 0 and stats["kv_held"] == 0
    assert stats["num_aborted"] >= 4 and stats["num_generated_tokens"] >= 4
    assert stats["kv_usage"] == 0.0  # nothing protected or held: only evictable cache left


def test_burst_of_concurrent_streams_completes(server) -> None:
    async def one(i: int) -> int:
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"model": MODEL, "prompt": f"Fact {i}:", "max_tokens": 8, "stream": True,
                    "ignore_eos": True}
            n = 0
            async with c.stream("POST", server + COMP, json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    n += line.startswith("data: ") and line != "data: [DONE]"
                    if line == "data: [DONE]":
                        return n
        return -1

    async def main() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(16)))

    counts = asyncio.run(main())
    assert all(c >= 2 for c in counts), counts
    assert wait_idle(server)["kv_held"] == 0
