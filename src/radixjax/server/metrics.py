"""Prometheus metrics (prometheus-client), one registry per app (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixjax.engine.engine import GenerateOutput

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "radixjax_"
        self.requests = Counter(p + "requests", "Generation requests received", registry=r)
        self.finished = Counter(p + "requests_finished", "Requests finished, by reason",
                                ["reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter(p + "cached_tokens", "Prompt tokens from the radix cache",
                                     registry=r)
        self.generated_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.running = Gauge(p + "num_running_reqs", "Running requests", registry=r)
        self.waiting = Gauge(p + "num_waiting_reqs", "Waiting requests", registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage", "Fraction of KV slots in use", registry=r)
        self.hit_rate = Gauge(p + "cache_hit_rate", "Cached / prompt tokens", registry=r)
        self.throughput = Gauge(p + "gen_throughput", "Generated tokens/s since start",
                                registry=r)
        self.programs = Gauge(p + "num_step_programs", "Step programs compiled", registry=r)
        self.internal_errors = Counter(p + "internal_errors",
                                       "Exceptions the server did not expect (HTTP 500s)",
                                       registry=r)
        self.num_internal_errors = 0  # the same count, for /get_server_info
        self.late_compiles = Gauge(p + "num_late_compiles",
                                   "Step programs compiled after warm-up (should stay 0)",
                                   registry=r)
        # Data parallelism (--dp): each replica's own, labelled by dp_rank.
        rank = ["dp_rank"]
        self.dp_routed = Gauge(p + "dp_requests_routed", "Requests routed to the replica",
                               rank, registry=r)
        self.dp_running = Gauge(p + "dp_num_running_reqs", "The replica's running requests",
                                rank, registry=r)
        self.dp_waiting = Gauge(p + "dp_num_waiting_reqs", "The replica's waiting requests",
                                rank, registry=r)
        self.dp_kv_usage = Gauge(p + "dp_kv_cache_usage", "The replica's KV use", rank,
                                 registry=r)
        self.dp_hit_rate = Gauge(p + "dp_cache_hit_rate", "The replica's cached / prompt "
                                 "tokens", rank, registry=r)

    def on_internal_error(self) -> None:
        self.internal_errors.inc()
        self.num_internal_errors += 1

    def observe_token(self, seconds: float, first: bool) -> None:
        (self.ttft if first else self.itl).observe(seconds)

    def on_finished(self, out: GenerateOutput) -> None:
        self.finished.labels(reason=out.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(out.prompt_tokens)
        self.cached_tokens.inc(out.cached_tokens)
        self.generated_tokens.inc(out.completion_tokens)

    def render(self, stats: dict[str, float]) -> bytes:
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_usage"])
        self.hit_rate.set(stats["cache_hit_rate"])
        self.throughput.set(stats["generated_tokens_per_s"])
        self.programs.set(stats["num_step_programs"])
        self.late_compiles.set(stats["num_late_compiles"])
        for rep in stats.get("replicas", ()):
            rank = str(rep["dp_rank"])
            self.dp_routed.labels(rank).set(rep["num_routed"])
            self.dp_running.labels(rank).set(rep["num_running"])
            self.dp_waiting.labels(rank).set(rep["num_waiting"])
            self.dp_kv_usage.labels(rank).set(rep["kv_usage"])
            self.dp_hit_rate.labels(rank).set(rep["cache_hit_rate"])
        return generate_latest(self.registry)
