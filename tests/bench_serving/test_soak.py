"""A short soak through the real server (bench_serving/soak.py; benchmarks/soak.py runs
the ~2-minute, 64-client version): good and bad requests, streaming and not, clients
that leave early. Nothing hangs, no answer is a server error, every greedy answer equals
the same request sent alone, and afterwards no KV is held and nothing compiled late."""

from __future__ import annotations

import asyncio

from bench_serving.soak import run_soak

from tests.server.conftest import MODEL


def test_short_soak_leaks_nothing_and_keeps_greedy_answers(server: str) -> None:
    report = asyncio.run(run_soak(server, MODEL, duration=12, concurrency=16, seed=3))
    print(f"soak: {sum(report.statuses.values())} requests, rss "
          f"{report.rss_before_mb:.0f} -> {report.rss_after_mb:.0f} MB, "
          f"{dict(report.statuses)}")
    assert report.hung == 0 and report.internal_errors == 0
    assert not [k for k in report.statuses if k[1] >= 500 or k[1] == -1], report.statuses
    kinds = {k for k, _ in report.statuses}
    assert {"greedy", "bad", "leave_stream"} <= kinds
    assert report.greedy and report.mismatches == []
    assert report.stats["kv_held"] == 0 and report.stats["num_running"] == 0
    assert report.stats["num_late_compiles"] == 0
    assert report.rss_after_mb - report.rss_before_mb < 500  # reported by benchmarks/soak.py
