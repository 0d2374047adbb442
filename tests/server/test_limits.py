"""Limits through the real server: a body past --max-request-bytes is refused (413)
before it is read whole; a text that cannot fit the context is refused before it is
tokenized; the longest answer the context allows stalls nobody; a client that
leaves a non-streaming request aborts it; state-changing endpoints are POST-only; a
second server's API key (on every route but /health and /metrics) and concurrency limit,
which counts engine requests (a body's prompts x n) and refuses a batch past
--max-batch-requests with a 400."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import MODEL, launch_server, stop_server, wait_healthy, wait_idle

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
MAX_BYTES = 1_000_000  # the session server's --max-request-bytes (tests/conftest.py)
LIMITED_ARGS = ["--api-key", "s3cret", "--max-concurrent-requests", "1",
                "--max-batch-requests", "8"]


@pytest.fixture(scope="module", autouse=True)
def _limited_launch():
    """The second server starts with the module (its start-up overlaps the first tests)
    and stops with it: it lives only while its tests run (the suite's memory peak)."""
    launched = launch_server(LIMITED_ARGS)
    yield launched
    stop_server(launched.proc)


@pytest.fixture
def limited_server(_limited_launch) -> str:
    """A second server: an API key ("s3cret") and one request in progress at most."""
    return wait_healthy(_limited_launch)[1]


def _stats(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=10).json()["stats"]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_past_the_limit_is_413(server, chunked) -> None:
    body = b'{"model": "%s", "prompt": "%s"}' % (MODEL.encode(), b"a" * (MAX_BYTES + 10))
    # chunked: no Content-Length, refused while reading
    content = iter([body[i:i + 65536] for i in range(0, len(body), 65536)]) if chunked \
        else body
    r = httpx.post(server + COMP, content=content, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    ok = httpx.post(server + COMP, json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                    timeout=60)
    assert ok.status_code == 200


def test_a_text_far_past_the_context_is_refused_before_tokenizing(server) -> None:
    for body in ({"model": MODEL, "prompt": "word " * 150_000},
                 {"model": MODEL, "messages": [{"role": "user", "content": "x" * 900_000}]}):
        path = COMP if "prompt" in body else "/v1/chat/completions"
        r = httpx.post(server + path, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_the_longest_answer_stalls_nobody(server) -> None:
    """An answer to the end of the context (512: the prompt's few tokens + 480), ignoring
    EOS; a small request still gets through meanwhile."""
    big = dict(model=MODEL, prompt="Tell me everything.", max_tokens=480, temperature=0,
               ignore_eos=True, stream=True)
    with httpx.stream("POST", server + COMP, json=big, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # it runs
        small = httpx.post(server + COMP, json={"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                                                "temperature": 0}, timeout=60)
        assert small.status_code == 200
        assert small.json()["usage"]["completion_tokens"] == 4
        assert _stats(server)["num_running"] == 1  # the big one is still going
    assert wait_idle(server)["kv_held"] == 0  # closing the stream aborted it


def test_a_client_that_leaves_a_non_streaming_request_aborts_it(server) -> None:
    aborted = _stats(server)["num_aborted"]
    long = dict(model=MODEL, prompt="Count slowly.", max_tokens=400, temperature=0,
                ignore_eos=True)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the socket
        httpx.post(server + COMP, json=long, timeout=httpx.Timeout(60, read=1.5))
    deadline = time.monotonic() + 20
    while _stats(server)["num_aborted"] == aborted and time.monotonic() < deadline:
        time.sleep(0.2)
    stats = wait_idle(server)
    assert stats["num_aborted"] == aborted + 1 and stats["kv_held"] == 0


def test_state_changing_endpoints_are_post_only(server) -> None:
    assert httpx.get(server + "/flush_cache", timeout=10).status_code == 405
    assert httpx.get(server + "/debug/inject_fault", timeout=10).status_code == 405


def test_requests_past_the_concurrency_limit_get_503_with_retry_after(limited_server) -> None:
    url = limited_server  # --max-concurrent-requests 1
    hold = dict(model=MODEL, prompt="Go on.", max_tokens=300, temperature=0, ignore_eos=True,
                stream=True)
    headers = {"Authorization": "Bearer s3cret"}
    with httpx.stream("POST", url + COMP, json=hold, headers=headers, timeout=120) as s:
        lines = s.iter_lines()  # held: dropping the iterator would close the stream
        first = next(line for line in lines if line.startswith("data: "))
        assert '"choices"' in first, first  # streaming, not an error
        r = httpx.post(url + COMP, json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                       headers=headers, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "server_overloaded"
    # the stream's ticket came back when it closed: requests are admitted again
    deadline, status = time.monotonic() + 20, 503
    while status == 503 and time.monotonic() < deadline:
        status = httpx.post(url + COMP, json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                            headers=headers, timeout=60).status_code
        time.sleep(0.2)
    assert status == 200


def test_api_key_is_required_when_set(limited_server) -> None:
    url = limited_server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}
    assert httpx.post(url + CHAT, json=body, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    r = httpx.post(url + CHAT, json=body, headers=wrong, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = httpx.post(url + CHAT, json=body, headers={"Authorization": "Bearer s3cret"},
                    timeout=60)
    assert ok.status_code == 200
    assert httpx.get(url + "/health", timeout=5).status_code == 200  # health is open
    # debug endpoints are off unless --enable-debug-endpoints
    r = httpx.post(url + "/debug/inject_fault", headers={"Authorization": "Bearer s3cret"},
                   timeout=10)
    assert r.status_code == 404


def test_admission_counts_engine_requests_not_bodies(limited_server) -> None:
    """One request in progress at most: a body of two prompts, or n = 2, is two."""
    url, headers = limited_server, {"Authorization": "Bearer s3cret"}
    r = httpx.post(url + "/generate", headers=headers, timeout=60, json={
        "text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 503, r.text
    r = httpx.post(url + COMP, headers=headers, timeout=60, json={
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "n": 2})
    assert r.status_code == 503, r.text
    r = httpx.post(url + "/generate", headers=headers, timeout=60, json={
        "text": ["a"] * 9, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "batch_too_large", r.text
    r = httpx.post(url + "/generate", headers=headers, timeout=60, json={
        "text": ["a"], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert wait_idle(url, headers=headers)["kv_held"] == 0


ROUTES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
          ("GET", "/v1/models"), ("POST", "/generate"), ("POST", "/abort_request"),
          ("GET", "/get_model_info"), ("GET", "/get_load"), ("GET", "/get_server_info"),
          ("GET", "/server_info"), ("GET", "/health_generate"), ("POST", "/flush_cache"),
          ("POST", "/debug/inject_fault"), ("GET", "/debug/check_integrity"),
          ("GET", "/dashboard"), ("GET", "/dashboard/data")]


@pytest.mark.parametrize("method, path", ROUTES)
def test_every_route_but_health_and_metrics_needs_the_key(limited_server, method,
                                                          path) -> None:
    r = httpx.request(method, limited_server + path, json={}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text


def test_the_dashboard_takes_the_key_in_its_address(limited_server) -> None:
    """A browser cannot set headers on a page load: /dashboard?key=... (the page passes it
    on to /dashboard/data); a wrong one is refused."""
    for path in ("/dashboard", "/dashboard/data"):
        assert httpx.get(limited_server + path + "?key=nope", timeout=30).status_code == 401
        r = httpx.get(limited_server + path + "?key=s3cret", timeout=30)
        assert r.status_code == 200, r.text
    assert r.json()["limits"]["max_running"] == 8
