"""Multi-host serving on jax.distributed: two CPU processes on loopback (one device each),
one global mesh, `--tp 2` across them; rank 0 serves HTTP and publishes each step to
rank 1. Checks: the collectives we rely on are right across processes; concurrent
greedy and seeded requests give the same tokens as one device in one process; a rank
that dies or stops is noticed in bounded time, never a hang: rank 0 answers 503, a rank
> 0 exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch  # noqa: F401 - the tiny models are written with it (a test dependency)

from tests.server.conftest import Launched, free_port, launch_server, wait_healthy, wait_idle
from tests.tiny_models import FAST_COMPILE, save_char_tokenizer

ROOT = Path(__file__).resolve().parents[2]
# Small buckets (T = 1 .. 16: five step programs), so rank 1 compiles little.
# float32 on both sides (several devices have no int8 form; one would default to it)
CONFIG = dict(num_slots=2048, max_running=4, max_context=256, max_prefill_tokens=16,
              chunk_size=16, xla_options=FAST_COMPILE, quantization="none")
FLAGS = ["--num-slots", "2048", "--max-running", "4", "--context-length", "256",
         "--max-prefill-tokens", "16", "--chunk-size", "16", "--dist-timeout", "5",
         "--quantization", "none"]
# Prompts with shared prefixes (radix hits), short and long (chunked prefill).
PROMPTS = [f"Rule {i % 3}: be brief. " * (1 + i % 4) + f"Question {i}?" for i in range(12)]
SEEDED = [{"temperature": 1.0, "top_p": 0.9, "seed": 10 + i} for i in range(4)]


def env() -> dict:
    # XLA's backend optimisation off: the tiny model is compile-bound, numbers unchanged.
    # The steps signed with a cluster secret (parallel/wire.py), as across machines.
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
                XLA_FLAGS="--xla_backend_optimization_level=0",
                RADIXJAX_DIST_SECRET="a secret the test ranks share")


def launch_rank(model: Path, rank: int, coordinator: int, extra: list[str] = ()) -> Launched:
    return launch_server(
        ["--tp", "2", "--nnodes", "2", "--node-rank", str(rank),
         "--dist-init-addr", f"127.0.0.1:{coordinator}", *extra],
        ["--model", str(model), *FLAGS], env())


def launch_pair(model: Path, extra: list[str] = ()) -> tuple[Launched, Launched]:
    coordinator = free_port()
    follower = launch_rank(model, 1, coordinator, extra)
    return launch_rank(model, 0, coordinator, extra), follower


def exit_code(launched: Launched, timeout: float) -> tuple[int | None, str]:
    """The process's return code within timeout (None: still running) and its log."""
    try:
        launched.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    launched.log.seek(0)
    return launched.proc.poll(), launched.log.read()


def stop(*launched: Launched) -> None:
    for x in launched:
        x.proc.kill()
        x.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny llama with a one-character tokenizer (text in, text out)."""
    folder = tmp_path_factory.mktemp("multihost") / "tiny-llama"
    folder.mkdir()
    src = Path(tiny_model_dir("llama"))
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((src / name).read_bytes())
    return save_char_tokenizer(folder)


@pytest.fixture(scope="module")
def cluster(model):
    """Rank 0 and rank 1 serving; /health answers once both compiled their programs."""
    leader, follower = launch_pair(model, ["--enable-debug-endpoints"])
    try:
        wait_healthy(leader)
    except RuntimeError:
        stop(leader, follower)
        raise
    yield leader, follower
    stop(leader, follower)


@pytest.fixture(scope="module")
def reference(model) -> dict:
    """The same requests on one device in this process."""
    from radixjax.engine.engine import Engine
    from radixjax.sampling.params import SamplingParams

    with Engine(str(model), **CONFIG) as engine:
        greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
        seeded = [engine.generate(PROMPTS[i], SamplingParams(max_new_tokens=12, **sp))
                  for i, sp in enumerate(SEEDED)]
    return {"greedy": [o.token_ids for o in greedy], "seeded": [o.token_ids for o in seeded]}


def test_collectives_across_processes(model) -> None:
    """psum, all_gather, psum_scatter and all_to_all over two processes (gloo) against
    numpy, at the model's sizes and at jax issue 40830's (4 MiB float64 chunks). The step
    programs use all-reduce, all-gather and (MoE) all-to-all (test_sharding.py)."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.parallel.multihost_checks", str(port), str(rank)],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (1, 0)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for proc, out in zip(procs, outs, strict=True):
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, out[-3000:]
        wrong = json.loads(lines[-1].removeprefix("RESULT "))
        assert wrong and not any(wrong.values()), wrong


def test_concurrent_requests_equal_one_device(cluster, reference) -> None:
    leader, _ = cluster

    def native(prompt: str, sampling: dict) -> list[int]:
        r = httpx.post(leader.url + "/generate", timeout=120, json={
            "text": prompt, "sampling_params": {"max_new_tokens": 12, **sampling}})
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    client = openai.OpenAI(base_url=leader.url + "/v1", api_key="none", max_retries=0)

    def completion(prompt: str) -> str:
        return client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=12,
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        greedy = [pool.submit(native, p, {"temperature": 0}) for p in PROMPTS]
        seeded = [pool.submit(native, PROMPTS[i], sp) for i, sp in enumerate(SEEDED)]
        texts = [pool.submit(completion, p) for p in PROMPTS[:4]]
        assert [f.result() for f in greedy] == reference["greedy"]
        assert [f.result() for f in seeded] == reference["seeded"]
        # the char tokenizer: one character per token
        assert [f.result() for f in texts] == [
            "".join(map(chr_of, ids)) for ids in reference["greedy"][:4]]
    stats = wait_idle(leader.url)
    assert stats["num_late_compiles"] == 0 and stats["kv_held"] == 0
    assert stats["num_failures"] == 0


def test_failed_step_recovers_on_every_rank(cluster, reference) -> None:
    """A step that raises on rank 0 (the fault hook) fails its request; the state reset
    that follows reaches rank 1 too, and the next answers are right again."""
    leader, _ = cluster
    assert httpx.post(leader.url + "/debug/inject_fault", timeout=10).status_code == 200
    r = httpx.post(leader.url + "/generate", timeout=60, json={"text": PROMPTS[1]})
    assert r.status_code == 500 and "injected fault" in r.text
    r = httpx.post(leader.url + "/generate", timeout=60, json={
        "text": PROMPTS[2], "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    assert r.json()["output_ids"] == reference["greedy"][2]
    stats = wait_idle(leader.url)
    assert stats["num_failures"] == 1 and stats["kv_held"] == 0


def chr_of(token_id: int) -> str:
    return chr(32 + token_id) if token_id < 95 else chr(0x100 + token_id - 95)


def lost_rank_answers_503(leader: Launched, t0: float) -> None:
    """Rank 0 stays up, unhealthy: /health and new requests get 503, within the
    heartbeat timeout (5 s) and the watch's poll."""
    deadline = t0 + 30
    while httpx.get(leader.url + "/health", timeout=10).status_code != 503:
        assert time.monotonic() < deadline, "rank 0 still says it is healthy"
        time.sleep(0.2)
    r = httpx.post(leader.url + "/generate", timeout=30, json={"text": PROMPTS[2]})
    assert r.status_code == 503 and "gone" in r.text, r.text
    assert leader.proc.poll() is None  # answering, not hung and not gone


def test_killing_rank_1_fails_rank_0s_requests_with_503(cluster) -> None:
    """A request in flight gets an error; rank 0 notices the dead rank within its
    heartbeat timeout and answers 503 from then on."""
    leader, follower = cluster
    body = {"text": PROMPTS[0], "stream": True,
            "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
    events = []
    with httpx.stream("POST", leader.url + "/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        events.append(next(lines))
        follower.proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        try:
            events.extend(lines)
        except httpx.HTTPError as e:  # rank 0 went down mid-stream
            events.append(repr(e))
    assert any("error" in e.lower() for e in events[1:]), events[-3:]
    assert time.monotonic() - t0 < 30
    lost_rank_answers_503(leader, t0)


def test_a_follower_failing_alone_exits_and_rank_0_answers_503(model) -> None:
    """Rank 1's own call fails (its test hook), rank 0's does not: rank 1 sees that rank 0
    went on without a reset and exits; rank 0 loses it, the request in flight gets an
    error, and rank 0 answers 503 within its heartbeat timeout; nothing hangs."""
    coordinator = free_port()
    launched = [launch_server(
        ["--tp", "2", "--nnodes", "2", "--node-rank", str(rank), "--no-warmup",
         "--dist-init-addr", f"127.0.0.1:{coordinator}", "--enable-debug-endpoints"],
        ["--model", str(model), *FLAGS], dict(env(), RADIXJAX_DEBUG_FOLLOWER_FAIL_AT="3"))
        for rank in (1, 0)]
    follower, leader = launched
    try:
        wait_healthy(leader)
        t0 = time.monotonic()
        try:
            r = httpx.post(leader.url + "/generate", timeout=60, json={
                "text": PROMPTS[3], "sampling_params": {"max_new_tokens": 40}})
            assert r.status_code >= 500, r.text
        except httpx.HTTPError:
            pass  # rank 0 went down with the request
        code, log = exit_code(follower, timeout=30)
        assert code not in (None, 0) and "failed alone" in log, log[-2000:]
        lost_rank_answers_503(leader, t0)
    finally:
        stop(*launched)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_rank_0_going_away_ends_rank_1(model, how) -> None:
    """Stopped (SIGTERM): rank 1 is told and exits 0. Killed: rank 1 loses the
    coordination service and exits with that error. (No warm-up: no step runs.)"""
    leader, follower = launch_pair(model, ["--no-warmup"])
    try:
        wait_healthy(leader)
        leader.proc.send_signal(signal.SIGTERM if how == "stop" else signal.SIGKILL)
        code, log = exit_code(follower, timeout=30)
        if how == "stop":
            assert code == 0, log[-2000:]
            # uvicorn re-raises the SIGTERM it handled, after the graceful shutdown
            assert exit_code(leader, timeout=30)[0] in (0, -signal.SIGTERM)
        else:  # our read of the next call, or JAX's error poller, whichever is first
            assert code not in (None, 0), log[-2000:]
            assert "lost rank 0" in log or "another task died" in log, log[-2000:]
    finally:
        stop(leader, follower)


def test_dist_config_errors() -> None:
    from radixjax.parallel.multihost import DistConfig

    with pytest.raises(ValueError, match="node_rank"):
        DistConfig(nnodes=2, node_rank=2, dist_init_addr="127.0.0.1:1")
    with pytest.raises(ValueError, match="dist-init-addr"):
        DistConfig(nnodes=2, node_rank=0)
