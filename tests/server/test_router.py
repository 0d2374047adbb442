"""Our servers as workers behind SGLang's router (PyPI sglang-router, its Rust binary:
`python -m sglang_router.launch_router --policy cache_aware`): three workers (the
suite's shared server, a plain one, and one with two data-parallel replicas), a
multi-tenant shared-prefix workload through the router. Every answer equals the same
request sent to a worker directly, and each tenant's requests all land on one worker."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import (
    launch_server,
    start_router,
    stop_router,
    wait_healthy,
    wait_idle,
)

TENANTS = {
    name: f"You are the assistant of {name}. " + " ".join(
        f"Rule {i}: answer {name}'s customers politely, briefly and in plain words."
        for i in range(12)) + "\nQuestion: "
    for name in ("Acme Bank", "Blue Train Travel", "Cedar Hospital")}
QUESTIONS = ["What are your opening hours?", "How do I reset my password?",
             "Can I speak to a person?", "Where is your office?"]
GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def workers(server):
    """The shared server, a plain one and a --dp 2 one. The two are started here and
    stopped with this module (started in the background with the shared server, they
    slowed the rest of the suite more than they saved: CI 2026-12-04)."""
    procs = [wait_healthy(launch_server(flags)) for flags in ([], ["--dp", "2"])]
    yield [server] + [url for _, url in procs]
    for proc, url in procs:
        stats = wait_idle(url)
        proc.terminate()
        proc.wait(timeout=30)
        assert stats["num_late_compiles"] == 0 and stats["kv_held"] == 0


@pytest.fixture(scope="module")
def router(workers):
    proc, url = start_router(["--policy", "cache_aware", "--worker-urls", *workers])
    yield url
    stop_router(proc)


def requests_served(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=10).json()["stats"]["num_requests"]


def test_tenants_stick_to_a_worker_and_answers_are_right(workers, router) -> None:
    direct = {(t, q): httpx.post(workers[0] + "/generate", timeout=120, json={
        "text": p + q, "sampling_params": GREEDY}).json()["text"]
        for t, p in TENANTS.items() for q in QUESTIONS}
    landed = {}
    for tenant, prefix in TENANTS.items():
        before = [requests_served(w) for w in workers]
        for q in QUESTIONS:
            r = httpx.post(router + "/generate", timeout=120,
                           json={"text": prefix + q, "sampling_params": GREEDY})
            assert r.status_code == 200, r.text
            assert r.json()["text"] == direct[(tenant, q)]
        grew = [requests_served(w) - b for w, b in zip(workers, before, strict=True)]
        assert sorted(grew) == [0, 0, len(QUESTIONS)], (tenant, grew)  # one worker took all
        landed[tenant] = grew.index(len(QUESTIONS))
    # the OpenAI API through the router too
    chat = httpx.post(router + "/v1/chat/completions", timeout=120, json={
        "model": "default", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hi."}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]


def test_dp_worker_reports_each_replica(workers) -> None:
    dp = workers[2]
    load = httpx.get(dp + "/get_load", timeout=10).json()
    assert [entry["dp_rank"] for entry in load] == [0, 1]
    body = {"text": TENANTS["Acme Bank"] + "Hello?", "sampling_params": GREEDY}
    outs = [httpx.post(dp + "/generate", json=body, timeout=120).json() for _ in range(3)]
    assert len({o["text"] for o in outs}) == 1 and outs[-1]["meta_info"]["cached_tokens"] > 100
    metrics = httpx.get(dp + "/metrics", timeout=10).text
    assert 'radixjax_dp_requests_routed{dp_rank="1"}' in metrics
    replicas = httpx.get(dp + "/get_server_info", timeout=10).json()["stats"]["replicas"]
    assert len(replicas) == 2 and sum(r["num_routed"] for r in replicas) >= 3
