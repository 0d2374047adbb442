"""A randomized traffic mix through the real server (the session's warmed server, OpenAI's
own client; benchmarks/bench_serving/traffic_mix.py): greedy and sampled, logprobs,
penalties, JSON schema and regex, n > 1, prompts from one token to most of the context,
outputs up to the context limit, 1 to 8 concurrent. Nothing compiles late, every answer
is well formed, and no KV is held afterwards."""

from __future__ import annotations

import asyncio

import httpx
from bench_serving.traffic_mix import KINDS, MixConfig, run_mix

from tests.server.conftest import MODEL, wait_idle


def test_random_traffic_mix_compiles_nothing_late(server: str) -> None:
    before = httpx.get(server + "/get_server_info").json()["stats"]
    kinds = asyncio.run(run_mix(server, MixConfig(model=MODEL, num_requests=20)))
    assert set(kinds) == set(KINDS)  # every kind of request was sent, and answered well
    stats = wait_idle(server)
    assert stats["kv_held"] == 0
    assert stats["num_late_compiles"] == before["num_late_compiles"] == 0
    metrics = httpx.get(server + "/metrics").text
    assert "radixjax_num_late_compiles 0.0" in metrics
    assert f"radixjax_num_step_programs {stats['num_step_programs']:.1f}" in metrics
