"""benchmarks/serving.py against our real server on 127.0.0.1 (tiny workloads)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import serving
from bench_serving import workloads as wl
from bench_serving.runner import RunConfig, run_workload

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(server):
    return server  # the session's shared server (tests/conftest.py)


@pytest.fixture(scope="module")
def tok():
    return serving.load_tokenizer(None)


def test_shared_prefix_run_reports_throughput_latency_and_cache_hits(url, tok, tmp_path):
    out, png = tmp_path / "gsp.json", tmp_path / "gsp.png"
    payload = serving.main(
        ["--base-url", url, "--workload", "generated-shared-prefix", "--gsp-num-groups", "2",
         "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "64",
         "--gsp-question-len", "8", "--gsp-output-len", "8", "--max-concurrency", "2",
         "--warmup-requests", "2", "--output-json", str(out), "--plot", str(png)], tok=tok)
    m = payload["metrics"]
    assert (m["completed"], m["failed"]) == (4, 0)
    assert m["total_output_tokens"] == 4 * 8  # ignore_eos: every request runs to max_tokens
    assert m["total_input_tokens"] >= 4 * 72
    assert m["output_throughput"] > 0 and m["ttft_ms"]["mean"] > 0
    assert m["tpot_ms"]["p99"] >= m["tpot_ms"]["median"] > 0
    # the second prompt of each group reuses its group's 64-token system prompt
    assert 0.3 < m["cache_hit_rate"] < 1.0
    assert m["reported_cached_tokens"] >= 2 * 60
    assert m["late_compiles"] == 0  # read from /get_server_info: the server warmed up
    assert json.loads(out.read_text())["metrics"] == m
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_multi_turn_resends_the_history(url, tok):
    payload = serving.main(
        ["--base-url", url, "--workload", "multi-turn", "--mt-num-conversations", "2",
         "--mt-num-turns", "2", "--mt-system-len", "32", "--mt-message-len", "8",
         "--mt-output-len", "8", "--max-concurrency", "2", "--warmup-requests", "0"], tok=tok)
    reqs = payload["requests"]
    assert payload["metrics"]["completed"] == 4 and payload["metrics"]["failed"] == 0
    # turns 2 carry turn 1's prompt and answer: longer prompts, mostly cached
    short, long = sorted(r["prompt_tokens"] for r in reqs)[:2], sorted(
        r["prompt_tokens"] for r in reqs)[2:]
    assert min(long) > max(short) + 8
    assert all(r["server_prompt_tokens"] == r["prompt_tokens"] for r in reqs)


def test_json_schema_answers_validate(url, tok):
    work = wl.json_schema(tok, num_prompts=2, output_len=64)
    result = asyncio.run(run_workload(work, RunConfig(base_url=url, model="default",
                                                      max_concurrency=2), tok))
    assert result.metrics.completed == 2
    for rec in result.records:
        jsonschema.validate(json.loads(rec.text), wl.JSON_SCHEMA)
