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
killed prefill server gives clients a clear error; KV integrity holds on the survivors.
Hostile and failing peers: a bootstrap_host outside the decode server's allow-list is a
400 and never contacted; a prefill server that refuses a request fails its room at once;
one that answers garbage, hangs, dies mid-answer or refuses (with a body the client must
not see) fails the decode request with the reason, within the timeout; a keyed pair
(--api-key) whose prefill transfer server listens on another loopback address."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch  # noqa: F401 - the tiny models are written with it (a test dependency)

from tests.server.conftest import (
    launch_server,
    start_router,
    stop_router,
    wait_healthy,
    wait_idle,
)
from tests.tiny_models import save_char_chat_model

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


class FakePrefill:
    """A "prefill server" that misbehaves by room: 1 answers text that is not JSON, 2
    never answers (within the test), 3 closes the connection, 4 refuses with a 503 whose
    body carries a marker the decode server's client must not see."""

    MARKER = "SECRET-FROM-THE-PEER"

    def __init__(self) -> None:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.seen.append((self.path, body))
                room = body.get("room")
                if room == 2:
                    time.sleep(20)
                if room == 3:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, text = (200, "not json") if room == 1 else (503, fake.MARKER)
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.seen: list[tuple[str, dict]] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def fake_prefill() -> FakePrefill:
    fake = FakePrefill()
    yield fake
    fake.server.shutdown()


@pytest.fixture(scope="module")
def pd(model, fake_prefill):
    """(unified, prefill, [decode, decode with a 5 s timeout]) server URLs; the decode
    servers follow the prefill server and the fake one. The unified server compiles
    first; the others then load its programs from the cache."""
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")  # tiny model

    def launch(extra: list[str]) -> object:
        return launch_server(extra, ["--model", str(model), *FLAGS], env)

    launched = [launch([])]
    try:
        wait_healthy(launched[0])
        launched.append(launch(["--disaggregation-mode", "prefill"]))
        hosts = ["--disaggregation-prefill-hosts", launched[1].url.removeprefix("http://"),
                 f"127.0.0.1:{fake_prefill.port}"]
        launched += [launch(["--disaggregation-mode", "decode", *hosts]),
                     launch(["--disaggregation-mode", "decode", "--disaggregation-timeout",
                             "5", *hosts])]
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

    def rooms() -> int:
        return httpx.get(prefill + "/get_server_info", timeout=10).json()["stats"][
            "disagg_rooms"]

    before, held = failed(), rooms()
    with httpx.stream("POST", decodes[0] + "/generate", timeout=30, json={
            "text": PROMPTS[0], "stream": True, "sampling_params": GREEDY,
            "bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 777}):
        deadline = time.monotonic() + 10
        while rooms() == held and time.monotonic() < deadline:  # the fetch is waiting
            time.sleep(0.05)
        assert rooms() == held + 1
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
    for fields, says in (({"bootstrap_host": "127.0.0.1", "bootstrap_port": "x"},
                          "bootstrap_port"),
                         ({"bootstrap_host": "evil.example/x#", "bootstrap_port": 80},
                          "bootstrap_host")):
        r = httpx.post(decodes[0] + "/generate", timeout=30, json={
            "text": "Hi", "bootstrap_room": 1, **fields})
        assert r.status_code == 400 and says in r.text, r.text


def test_a_prefill_server_outside_the_allow_list_is_never_contacted(pd) -> None:
    """SSRF: a bootstrap_host:port the decode server was not told of is a 400; nothing
    connects to it."""
    _, _, decodes = pd
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(1.0)
        r = httpx.post(decodes[0] + "/generate", timeout=30, json={
            "text": "Hi", "bootstrap_host": "127.0.0.1",
            "bootstrap_port": listener.getsockname()[1], "bootstrap_room": 5})
        assert r.status_code == 400 and "--disaggregation-prefill-hosts" in r.text, r.text
        with pytest.raises(TimeoutError):
            listener.accept()
    integrity(decodes[0])


def test_a_refused_prefill_fails_its_room_at_once(pd) -> None:
    """The prefill server refuses its half (a bad sampling value: 400); the decode
    server's client hears that reason at once, not after the 30 s timeout."""
    _, prefill, decodes = pd
    host, port = prefill.removeprefix("http://").split(":")
    fields = {"bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 999}
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        on_decode = pool.submit(httpx.post, decodes[0] + "/generate", timeout=60, json={
            "text": PROMPTS[6], "sampling_params": GREEDY, **fields})
        r = httpx.post(prefill + "/generate", timeout=60, json={
            "text": PROMPTS[6], "sampling_params": {"temperature": -1}, **fields})
        assert r.status_code == 400, r.text
        r = on_decode.result()
    assert r.status_code == 500 and "refused the request" in r.text, r.text
    assert "temperature" in r.text and time.monotonic() - t0 < 15
    for url in (prefill, decodes[0]):
        integrity(url)


@pytest.mark.parametrize("room, says", [(1, "answered something else"),
                                        (2, "did not answer"), (3, "did not answer"),
                                        (4, "HTTP 503")])
def test_a_misbehaving_prefill_server_fails_the_request_with_the_reason(
        pd, fake_prefill, room, says) -> None:
    """Garbage, a hang, a dropped connection, a refusal: the decode request fails with
    the reason within its timeout (5 s + the fetch's slack), the peer's body is not
    shown, the decode server keeps its KV whole and keeps serving."""
    _, _, decodes = pd
    t0 = time.monotonic()
    r = httpx.post(decodes[1] + "/generate", timeout=60, json={
        "text": PROMPTS[1], "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
        "bootstrap_port": fake_prefill.port, "bootstrap_room": room})
    assert r.status_code == 500 and says in r.text, r.text
    assert FakePrefill.MARKER not in r.text
    assert time.monotonic() - t0 < 15
    assert ("/disagg/fetch", {"room": room, "timeout": 5.0}) in fake_prefill.seen
    integrity(decodes[1])
    assert generate_all(decodes[1], ["Hi"]) == generate_all(decodes[0], ["Hi"])


def test_a_keyed_pair_across_loopback_addresses(pd, model) -> None:
    """Both servers with --api-key: the decode server forwards it to /disagg/fetch and
    /disagg/abort; the prefill server's transfer server listens on 127.0.0.2, not the
    decode server's 127.0.0.1. Answers equal the unified server's; a keyless half is a
    401 and fails nothing."""
    server, _, _ = pd
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    key = ["--api-key", "pd-key"]
    prefill = launch_server([*key, "--disaggregation-mode", "prefill",
                             "--disaggregation-transfer-host", "127.0.0.2"],
                            ["--model", str(model), *FLAGS], env)
    decode = launch_server([*key, "--disaggregation-mode", "decode",
                            "--disaggregation-prefill-hosts",
                            prefill.url.removeprefix("http://")],
                           ["--model", str(model), *FLAGS], env)
    try:
        for x in (prefill, decode):
            wait_healthy(x)
        host, port = prefill.url.removeprefix("http://").split(":")
        auth = {"Authorization": "Bearer pd-key"}

        def pd_generate(prompt: str, room: int) -> str:
            body = {"text": prompt, "sampling_params": GREEDY, "bootstrap_host": host,
                    "bootstrap_port": int(port), "bootstrap_room": room}
            with ThreadPoolExecutor(2) as pool:
                halves = [pool.submit(httpx.post, u + "/generate", json=body, headers=auth,
                                      timeout=60) for u in (prefill.url, decode.url)]
                replies = [h.result() for h in halves]
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            return replies[1].json()["text"]

        assert [pd_generate(p, 100 + i) for i, p in enumerate(PROMPTS[:3])] == \
            generate_all(server, PROMPTS[:3])
        r = httpx.post(prefill.url + "/generate", timeout=30, json={
            "text": "Hi", "bootstrap_host": host, "bootstrap_port": int(port),
            "bootstrap_room": 200})
        assert r.status_code == 401
        info = httpx.get(prefill.url + "/get_server_info", headers=auth, timeout=10).json()
        assert info["stats"]["disagg_transfers"] == 3 and info["stats"]["disagg_failed"] == 0
        assert info["stats"]["disagg_room_bytes"] == 0
        for x in (prefill, decode):
            stats = wait_idle(x.url, headers=auth)
            assert stats["kv_held"] == 0 and stats["num_late_compiles"] == 0, stats
    finally:
        for x in (prefill, decode):
            x.proc.terminate()
        for x in (prefill, decode):
            x.proc.wait(timeout=30)


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
