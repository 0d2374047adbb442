"""A step that raises, through the real server (POST /debug/inject_fault, enabled on the
test server): the requests in flight fail (non-stream: HTTP 500 with an OpenAI-style
error body; stream: an error event, then [DONE]), the engine recovers with empty KV
accounting, /health stays 200, and the same request then gets the same greedy answer."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.server.conftest import MODEL, wait_idle

COMP = "/v1/completions"
LONG = dict(model=MODEL, max_tokens=400, temperature=0, ignore_eos=True)


def _stats(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=10).json()["stats"]


def test_a_failed_step_fails_in_flight_requests_and_the_server_recovers(server) -> None:
    greedy = dict(model=MODEL, prompt="The capital of France is", max_tokens=8,
                  temperature=0)
    before = httpx.post(server + COMP, json=greedy, timeout=60).json()["choices"][0]["text"]
    failures = _stats(server)["num_failures"]
    plain: dict = {}

    def non_streaming() -> None:
        r = httpx.post(server + COMP, json=dict(LONG, prompt="Count: one, two,"), timeout=120)
        plain.update(status=r.status_code, body=r.json())

    events: list[str] = []
    with httpx.stream("POST", server + COMP, timeout=120,
                      json=dict(LONG, prompt="Write a long story.", stream=True)) as r:
        lines = r.iter_lines()
        for line in lines:  # the stream is running
            if line.startswith("data: "):
                events.append(line)
                break
        worker = threading.Thread(target=non_streaming)
        worker.start()
        deadline = time.monotonic() + 60
        while _stats(server)["num_running"] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.post(server + "/debug/inject_fault", timeout=10).status_code == 200
        events += [line for line in lines if line.startswith("data: ")]
    worker.join(timeout=60)

    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["type"] == "internal_error" and "injected fault" in error["message"]
    assert plain["status"] == 500
    assert plain["body"]["error"]["code"] == "engine_error"
    stats = wait_idle(server)
    assert stats["num_failures"] == failures + 1 and stats["kv_held"] == 0
    assert httpx.get(server + "/health", timeout=10).status_code == 200
    assert httpx.get(server + "/health_generate", timeout=60).status_code == 200
    after = httpx.post(server + COMP, json=greedy, timeout=60).json()["choices"][0]["text"]
    assert after == before

