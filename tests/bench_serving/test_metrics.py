from __future__ import annotations

import math

import pytest
from bench_serving.client import RequestRecord, chunk_text, request_body
from bench_serving.metrics import (
    Summary,
    compute_metrics,
    hit_rate_between,
    parse_prometheus,
    tpot,
)


def record(start: float, chunks: list[float], end: float, prompt: int, out: int,
           cached: int | None = None) -> RequestRecord:
    return RequestRecord(start=start, end=end, chunk_times=chunks, prompt_tokens=prompt,
                         completion_tokens=out, server_cached_tokens=cached,
                         server_prompt_tokens=prompt if cached is not None else None)


def test_summary_mean_median_p99_in_ms():
    s = Summary.of([0.001 * i for i in range(1, 101)])  # 1..100 ms
    assert s.mean == pytest.approx(50.5)
    assert s.median == pytest.approx(50.5)
    assert s.p99 == pytest.approx(99.01)
    assert all(math.isnan(v) for v in (Summary.of([]).mean, Summary.of([]).p99))


def test_compute_metrics_by_hand():
    a = record(0.0, [0.5, 0.6, 0.7, 0.8], 0.8, prompt=100, out=4, cached=0)
    b = record(1.0, [1.2, 1.5], 1.5, prompt=50, out=2, cached=40)
    failed = RequestRecord(start=0.0, end=0.1, error="HTTP 400: bad")
    m = compute_metrics([a, b, failed], duration_s=2.0, cache_hit_rate=0.25)
    assert (m.completed, m.failed) == (1 + 1, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (150, 6)
    assert m.request_throughput == pytest.approx(1.0)
    assert m.input_throughput == pytest.approx(75.0)
    assert m.output_throughput == pytest.approx(3.0)
    assert m.ttft_ms.mean == pytest.approx((500 + 200) / 2)
    # TPOT: a (0.8 - 0.5) / 3 = 100 ms, b (0.5 - 0.2) / 1 = 300 ms
    assert m.tpot_ms.mean == pytest.approx(200.0)
    assert m.tpot_ms.median == pytest.approx(200.0)
    # ITL pools every gap: 100, 100, 100 (a) and 300 (b)
    assert m.itl_ms.mean == pytest.approx(150.0) and m.itl_ms.median == pytest.approx(100.0)
    assert m.e2e_ms.mean == pytest.approx((800 + 500) / 2)
    assert m.cache_hit_rate == 0.25 and m.reported_cached_tokens == 40
    assert m.reported_hit_rate == pytest.approx(40 / 150)
    assert tpot(record(0, [0.1], 0.1, 1, 1)) is None
    with pytest.raises(ValueError):
        compute_metrics([a], duration_s=0.0)


def test_hit_rate_from_prometheus_deltas():
    before = parse_prometheus("# HELP x\n# TYPE x counter\nradixjax_prompt_tokens_total 100.0\n"
                              "radixjax_cached_tokens_total 10.0\n"
                              'radixjax_requests_finished_total{reason="length"} 3.0\n')
    assert before['radixjax_requests_finished_total{reason="length"}'] == 3.0
    after = {"radixjax_prompt_tokens_total": 500.0, "radixjax_cached_tokens_total": 310.0}
    assert hit_rate_between(before, after) == pytest.approx(300 / 400)
    assert hit_rate_between({}, {}) is None  # a peer without our counters
    assert hit_rate_between(after, after) is None  # no prompt tokens in between


def test_request_body_and_chunk_text():
    body = request_body("m", 8, prompt="hi")
    assert body["stream"] and body["ignore_eos"] and body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True} and "messages" not in body
    chat = request_body("m", 8, messages=[{"role": "user", "content": "x"}], ignore_eos=False,
                        response_format={"type": "json_object"})
    assert "ignore_eos" not in chat and chat["response_format"]["type"] == "json_object"
    with pytest.raises(ValueError):
        request_body("m", 8)
    assert chunk_text({"choices": [{"text": "ab"}]}) == "ab"
    assert chunk_text({"choices": [{"delta": {"content": "cd"}}]}) == "cd"
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert chunk_text({"choices": [], "usage": {"prompt_tokens": 3}}) == ""
