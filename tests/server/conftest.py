"""A real server: `python -m radixjax.launch_server` on a free loopback port."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

import httpx
import pytest

# The shared SmolLM2 runner configuration (tests/conftest.py SMOLLM2_ENGINE), as flags.
SERVER_ARGS = ["--num-slots", "4096", "--max-running", "8",
               "--context-length", "512", "--max-prefill-tokens", "256", "--chunk-size", "256",
               "--default-max-tokens", "16"]
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launched(NamedTuple):
    proc: subprocess.Popen
    url: str
    log: IO[str]


def launch_server(extra: list[str] = (), base: list[str] = SERVER_ARGS,
                  env: dict[str, str] | None = None) -> Launched:
    """Start a server process (SmolLM2 with the shared flags, unless `base` says other);
    `wait_healthy` waits for it."""
    # The server's output goes to a file, never an unread pipe: a pipe that fills up
    # (64 KB of logs) would block the server's event loop on its next write.
    log = tempfile.TemporaryFile("w+")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixjax.launch_server", "--port", str(port), *base,
         *extra], stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    return Launched(proc, f"http://127.0.0.1:{port}", log)


def wait_healthy(server: Launched) -> tuple[subprocess.Popen, str]:
    proc, url, log = server
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def start_server(extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    return wait_healthy(launch_server(extra))


@contextmanager
def running_server(extra: list[str] = ()) -> Iterator[str]:
    """A started server's base URL; stopped on exit."""
    proc, url = start_server(extra)
    try:
        yield url
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def wait_idle(url: str, timeout: float = 30.0, headers: dict | None = None) -> dict:
    """Server stats once no request runs or waits and no KV is held by requests."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(url + "/get_server_info", timeout=10,
                          headers=headers).json()["stats"]
        idle = stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_held"] == 0
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def start_router(args: list[str]) -> tuple[subprocess.Popen, str]:
    """SGLang's router (sglang-router, its Rust binary) on a free loopback port with these
    arguments (policy and workers, or PD mode), once it answers /health."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parents[2] / "scripts" / "sglang_router_main.py"),
         "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-port", str(free_port()),  # default: 29000
         *args], stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            stop_router(proc)
            pytest.fail(f"the router did not start: {log.read()[-3000:]}")
        time.sleep(0.5)


def stop_router(proc: subprocess.Popen) -> None:
    """The router ignores SIGTERM (it outlived terminate() in earlier runs): SIGINT, then
    SIGKILL if it is still there."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)
