"""What a run's request records add up to: throughputs and latency summaries, plus the
radix cache's hit rate from our server's Prometheus counters. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench_serving.client import RequestRecord

PROMPT_COUNTER = "radixjax_prompt_tokens_total"
CACHED_COUNTER = "radixjax_cached_tokens_total"


@dataclass(frozen=True)
class Summary:
    """Milliseconds for latencies; `p99` is numpy's linear-interpolated percentile."""

    mean: float
    median: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Summary:
        if not seconds:
            return cls(float("nan"), float("nan"), float("nan"))
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        return cls(float(ms.mean()), float(np.median(ms)), float(np.percentile(ms, 99)))


@dataclass(frozen=True)
class Metrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    input_throughput: float  # prompt tokens / s
    output_throughput: float  # generated tokens / s
    ttft_ms: Summary
    tpot_ms: Summary  # per request: (latency - ttft) / (output tokens - 1)
    itl_ms: Summary  # every gap between two text chunks, all requests pooled
    e2e_ms: Summary
    cache_hit_rate: float | None  # cached / prompt tokens over the run (ours: /metrics)
    reported_cached_tokens: int | None  # sum of usage.prompt_tokens_details.cached_tokens
    reported_hit_rate: float | None  # the same / the servers' prompt tokens (llama.cpp, vLLM)
    late_compiles: int | None = None  # ours: step shapes compiled during the run (should be 0)

    def to_dict(self) -> dict:
        return asdict(self)


def tpot(rec: RequestRecord) -> float | None:
    """Time per output token after the first; None for a one-token answer."""
    if rec.completion_tokens < 2:
        return None
    return (rec.latency - rec.ttft) / (rec.completion_tokens - 1)


def compute_metrics(records: Sequence[RequestRecord], duration_s: float,
                    cache_hit_rate: float | None = None,
                    late_compiles: int | None = None) -> Metrics:
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    done = [r for r in records if r.ok]
    inp = sum(r.prompt_tokens for r in done)
    out = sum(r.completion_tokens for r in done)
    tpots = [t for t in map(tpot, done) if t is not None]
    reported = [r for r in done if r.server_cached_tokens is not None and r.server_prompt_tokens]
    cached = sum(r.server_cached_tokens for r in reported)
    served_prompt = sum(r.server_prompt_tokens for r in reported)
    return Metrics(
        completed=len(done), failed=len(records) - len(done), duration_s=duration_s,
        total_input_tokens=inp, total_output_tokens=out,
        request_throughput=len(done) / duration_s, input_throughput=inp / duration_s,
        output_throughput=out / duration_s,
        ttft_ms=Summary.of([r.ttft for r in done]), tpot_ms=Summary.of(tpots),
        itl_ms=Summary.of([g for r in done for g in r.itls]),
        e2e_ms=Summary.of([r.latency for r in done]), cache_hit_rate=cache_hit_rate,
        reported_cached_tokens=cached if reported else None,
        reported_hit_rate=cached / served_prompt if reported else None,
        late_compiles=late_compiles)


def parse_prometheus(text: str) -> dict[str, float]:
    """`name value` samples of a Prometheus text exposition (labelled samples keep their
    labels in the name; comments skipped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name.strip()] = float(value)
        except ValueError:
            continue
    return samples


def hit_rate_between(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Cached / prompt tokens counted between two scrapes; None when the server has no
    such counters (a peer) or saw no prompt tokens."""
    if PROMPT_COUNTER not in after or CACHED_COUNTER not in after:
        return None
    prompt = after[PROMPT_COUNTER] - before.get(PROMPT_COUNTER, 0.0)
    cached = after[CACHED_COUNTER] - before.get(CACHED_COUNTER, 0.0)
    return cached / prompt if prompt > 0 else None
