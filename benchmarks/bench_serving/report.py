"""Results out: a text table, a JSON file (metrics + every request), PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench_serving.metrics import Metrics
from bench_serving.runner import RunResult


def format_metrics(m: Metrics, title: str) -> str:
    rows = [
        ("completed / failed", f"{m.completed} / {m.failed}"),
        ("duration (s)", f"{m.duration_s:.2f}"),
        ("input / output tokens", f"{m.total_input_tokens} / {m.total_output_tokens}"),
        ("request throughput (req/s)", f"{m.request_throughput:.3f}"),
        ("input token throughput (tok/s)", f"{m.input_throughput:.1f}"),
        ("output token throughput (tok/s)", f"{m.output_throughput:.1f}"),
    ]
    for name, s in (("TTFT", m.ttft_ms), ("TPOT", m.tpot_ms), ("ITL", m.itl_ms),
                    ("E2E latency", m.e2e_ms)):
        rows.append((f"{name} mean / median / p99 (ms)",
                     f"{s.mean:.1f} / {s.median:.1f} / {s.p99:.1f}"))
    rate = "n/a" if m.cache_hit_rate is None else f"{m.cache_hit_rate:.3f}"
    rows.append(("cache hit rate (/metrics)", rate))
    if m.reported_cached_tokens is not None:
        rows.append(("cached tokens (usage), hit rate", f"{m.reported_cached_tokens}, "
                     f"{m.reported_hit_rate:.3f}"))
    if m.late_compiles is not None:
        rows.append(("step shapes compiled during the run", str(m.late_compiles)))
    width = max(len(k) for k, _ in rows)
    lines = [f"== {title} =="] + [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


def result_json(result: RunResult, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": result.workload,
        "config": config,
        "metrics": result.metrics.to_dict(),
        "requests": [
            {k: v for k, v in asdict(r).items() if k != "text"} | {"ttft": r.ttft if r.ok
                                                                   else None}
            for r in result.records],
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")


def plot_run(result: RunResult, path: Path, title: str) -> None:
    """Three panels: TTFT histogram, TPOT histogram, end-to-end latency per request in
    arrival order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench_serving.metrics import tpot

    done = [r for r in result.records if r.ok]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].hist([r.ttft * 1000 for r in done], bins=20)
    axes[0].set(title="TTFT", xlabel="ms", ylabel="requests")
    axes[1].hist([t * 1000 for t in map(tpot, done) if t is not None], bins=20)
    axes[1].set(title="TPOT", xlabel="ms / token")
    start = min((r.start for r in done), default=0.0)
    for r in done:
        axes[2].plot([r.start - start, r.end - start], [r.latency * 1000] * 2, lw=2)
    axes[2].set(title="E2E latency over the run", xlabel="s since start", ylabel="ms")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
