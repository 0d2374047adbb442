"""Prefill-decode disaggregation through SGLang's router in PD mode (sglang-router,
`--pd-disaggregation`): one prefill server and two decode servers on loopback, beside a
unified server with the same flags (the tiny llama with a one-character tokenizer: the
test is about the flow, and the tiny model keeps it cheap). The router sends each request
to a prefill and a decode server with a bootstrap room; the decode server fetches the
prompt's KV and first token from the prefill server (jax.experimental.transfer) and
decodes.

Checks: 32 greedy requests with shared prefixes (some longer than one 256-token piece),
8 at a time, give the unified server's text, with one decode server and with two (both
used); chat too; a fetch the prefill never answers times out with a clear error; a
killed prefill server gives clients a clear error; KV integrity holds on the survivors."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import (
    launch_server,
    start_router,
    stop_router,
    wait_healthy,
    wait_idle,
)
from tests.tiny_models import save_char_chat_model

pytest.importorskip("torch")

SYSTEMS = [f"System {k}: " + " ".join(f"Rule {i} for topic {k}: be kind." for i in range(
    2 + 8 * k)) for k in range(4)]  # ~40 to ~700 tokens: one piece of KV, or three
QUESTIONS = ["What is a cat?", "Name a color.", "Say hello.", "Count to three.",
             "What is rain?", "Tell me a fruit.", "Why is the sky blue?", "Give a number."]
PROMPTS = [s + "\nQuestion: " + q for s in SYSTEMS for q in QUESTIONS]  # 32
GREEDY = {"max_new_tokens": 12, "temperature": 0}
MODEL = "tiny-llama"
FLAGS = ["--num-slots", "4096", "--max-running", "8", "--context-length", "1024",
         "--max-prefill-tokens", "128", "--chunk-size", "128", "--enable-debug-endpoints"]


def router(prefill: str, decodes: list[str]) -> tuple[subprocess.Popen, str]:
    # the bootstrap port after the prefill URL: its own HTTP port
    return start_router(["--pd-disaggregation", "--prefill", prefill,
                         prefill.rsplit(":", 1)[1],
                         *(arg for d in decodes for arg in ("--decode", d))])


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny llama with the one-character tokenizer and a plain chat template."""
    return save_char_chat_model(Path(tiny_model_dir("llama")),
                                tmp_path_factory.mktemp("pd") / MODEL)


@pytest.fixture(scope="module")
def pd(model):
    """(unified, prefill, [decode, decode with a 5 s timeout]) server URLs. The unified
    server compiles first; the others then load its programs from the cache."""
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")  # tiny model

    def launch(extra: list[str]) -> object:
        return launch_server(extra, ["--model", str(model), *FLAGS], env)

    launched = [launch([])]
    try:
        wait_healthy(launched[0])
        launched += [launch(["--disaggregation-mode", "prefill"]),
                     launch(["--disaggregation-mode", "decode"]),
                     launch(["--disaggregation-mode", "decode", "--disaggregation-timeout",
                             "5"])]
        urls = [wait_healthy(x)[1] for x in launched]
        yield urls[0], urls[1], urls[2:]
    finally:
        for x in launched:
            x.proc.terminate()
        for x in launched:
            x.proc.wait(timeout=30)


def generate_all(url: str, prompts: list[str]) -> list[str]:
    def one(prompt: str) -> str:
        r = httpx.post(url + "/generate", timeout=120,
                       json={"text": prompt, "sampling_params": GREEDY})
        assert r.status_code == 200, r.text
        return r.json()["text"]

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, prompts))


def served(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=10).json()["stats"]["num_requests"]


def integrity(url: str) -> None:
    stats = wait_idle(url)
    assert stats["kv_held"] == 0 and stats["num_late_compiles"] == 0, stats
    r = httpx.get(url + "/debug/check_integrity", timeout=30)
    assert r.status_code == 200, r.text


def test_pd_text_equals_unified_with_one_and_two_decode_servers(pd) -> None:
    server, prefill, decodes = pd
    unified = generate_all(server, PROMPTS)
    for used in (decodes[:1], decodes):
        proc, url = router(prefill, used)
        try:
            before = [served(d) for d in decodes]
            assert generate_all(url, PROMPTS) == unified
            grew = [served(d) - b for d, b in zip(decodes, before, strict=True)]
            assert all(g > 0 for g in grew[:len(used)]), grew
            if len(used) == 2:  # the OpenAI API through the PD router too
                client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
                direct = openai.OpenAI(base_url=server + "/v1", api_key="none")
                ask = dict(model=MODEL, max_tokens=8, temperature=0,
                           messages=[{"role": "user", "content": QUESTIONS[0]}])
                assert (client.chat.completions.create(**ask).choices[0].message.content
                        == direct.chat.completions.create(**ask).choices[0].message.content)
        finally:
            stop_router(proc)
    # every answer came through a transfer: the prefill server handed over as many
    # rooms as the decode servers received (2 x 32 + the chat)
    got = [httpx.get(u + "/get_server_info", timeout=10).json()["stats"]
           for u in (prefill, *decodes)]
    assert got[0]["disagg_transfers"] == got[1]["disagg_transfers"] + got[2][
        "disagg_transfers"] == 2 * len(PROMPTS) + 1, got
    assert all(s["num_failures"] == 0 for s in got) and got[0]["disagg_failed"] == 0
    for url in (server, prefill, *decodes):
        integrity(url)


def test_a_fetch_the_prefill_never_answers_times_out(pd) -> None:
    """The decode server with a 5 s timeout, a room the prefill server never saw."""
    _, prefill, decodes = pd
    host, port = prefill.removeprefix("http://").split(":")
    t0 = time.monotonic()
    r = httpx.post(decodes[1] + "/generate", timeout=60, json={
        "text": PROMPTS[0], "sampling_params": GREEDY, "bootstrap_host": host,
        "bootstrap_port": int(port), "bootstrap_room": 12345})
    assert r.status_code == 500 and "did not finish within 5 s" in r.text, r.text
    assert time.monotonic() - t0 < 30
    integrity(decodes[1])


def test_a_client_leaving_the_decode_server_aborts_the_room(pd) -> None:
    """The decode server waits in its fetch; its client disconnects: it tells the prefill
    server, whose room fails at once (not after its timeout); nothing held anywhere."""
    _, prefill, decodes = pd
    host, port = prefill.removeprefix("http://").split(":")

    def failed() -> int:
        return httpx.get(prefill + "/get_server_info", timeout=10).json()["stats"][
            "disagg_failed"]

    before = failed()
    with httpx.stream("POST", decodes[0] + "/generate", timeout=30, json={
            "text": PROMPTS[0], "stream": True, "sampling_params": GREEDY,
            "bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 777}):
        time.sleep(1.0)  # the decode server is waiting for room 777
    deadline = time.monotonic() + 10
    while failed() == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert failed() == before + 1
    integrity(decodes[0])


def test_a_failed_prefill_fails_the_decode_request(pd) -> None:
    """The prefill server's step raises (its fault hook) while it holds room 888: its
    request fails, the room fails, and the decode server's client gets that reason."""
    _, prefill, decodes = pd
    host, port = prefill.removeprefix("http://").split(":")
    body = {"text": PROMPTS[5], "sampling_params": GREEDY, "bootstrap_host": host,
            "bootstrap_port": int(port), "bootstrap_room": 888}
    assert httpx.post(prefill + "/debug/inject_fault", timeout=10).status_code == 200
    with ThreadPoolExecutor(2) as pool:  # both at once, as the router sends them
        on_decode = pool.submit(httpx.post, decodes[0] + "/generate", json=body, timeout=60)
        on_prefill = pool.submit(httpx.post, prefill + "/generate", json=body, timeout=60)
        assert on_prefill.result().status_code == 500
        r = on_decode.result()
    assert r.status_code == 500 and "the prefill ended without KV" in r.text, r.text
    for url in (prefill, decodes[0]):
        integrity(url)


def test_bad_bootstrap_fields_are_400(pd) -> None:
    _, _, decodes = pd
    r = httpx.post(decodes[0] + "/generate", timeout=30, json={
        "text": "Hi", "bootstrap_host": "127.0.0.1", "bootstrap_port": "x",
        "bootstrap_room": 1})
    assert r.status_code == 400 and "bootstrap_port" in r.text


def test_killed_prefill_server_gives_a_clear_error(pd) -> None:
    """Last: the prefill server is killed; a request naming it fails at once with an
    error that says so, and the decode servers hold no KV and keep serving. (Sent to a
    decode server directly: the router would retry a dead prefill server first.)"""
    _, prefill, decodes = pd
    host, port = prefill.removeprefix("http://").split(":")
    pid = httpx.get(prefill + "/get_server_info", timeout=10).json()["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    r = httpx.post(decodes[0] + "/generate", timeout=60, json={
        "text": PROMPTS[3], "sampling_params": GREEDY, "bootstrap_host": host,
        "bootstrap_port": int(port), "bootstrap_room": 4242})
    assert r.status_code == 500 and "prefill server" in r.text, r.text
    assert "did not answer" in r.json()["error"]["message"]
    for d in decodes:
        integrity(d)
        assert httpx.get(d + "/health", timeout=10).status_code == 200
