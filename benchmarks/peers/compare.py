"""Ours vs llama.cpp vs HF transformers, one server after another, the same workloads,
one comparison table (ratios ours / peer).

    flock /tmp/heavy.lock .venv/bin/python benchmarks/peers/compare.py \\
        --out benchmarks/results/compare

For every server: start it on loopback, then for every workload and concurrency run
benchmarks/serving.py's benchmark (a warm-up pass first, then the timed run), then stop
it. Each (workload, concurrency) cell gets its own seed, the same for every server, so
no run hits the cache of an earlier one. `--rounds N` repeats the whole pass N times, the
servers' order reversed every other round (A B, B A, ...), and the table gives each
metric's median over the rounds and every round's ratios: on a VM whose speed drifts
within minutes one pass per server measures the drift as much as the servers. Writes
<out>/results.json, <out>/table.md, <out>/<server>-<workload>-c<N>.png and the server
logs."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402
from servers import RunningServer, server_specs  # noqa: E402

METRICS = (  # (label, key, sub-key, higher is better)
    ("output tok/s", "output_throughput", None, True),
    ("requests/s", "request_throughput", None, True),
    ("TTFT median ms", "ttft_ms", "median", False),
    ("TPOT median ms", "tpot_ms", "median", False),
    ("ITL p99 ms", "itl_ms", "p99", False),
    ("E2E median ms", "e2e_ms", "median", False),
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--servers", nargs="+", default=["ours", "llama.cpp", "hf"],
                   choices=list(server_specs(1)))
    p.add_argument("--workloads", nargs="+", default=["generated-shared-prefix", "multi-turn"],
                   choices=serving.WORKLOADS)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--max-duration", type=float, default=120.0,
                   help="per timed run: stop starting requests after this many seconds")
    p.add_argument("--model", default=None, help="a GGUF path or packaged name (e.g. "
                   "gemma3-270m) for ours and llama.cpp; default: SmolLM2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over the servers, alternating their order; medians reported")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/compare"))
    p.add_argument("--serving-args", default="", help="extra benchmarks/serving.py flags, "
                   "e.g. '--mt-num-conversations 8' (one string)")
    return p.parse_args()


def cell_argv(args: argparse.Namespace, url: str, workload: str, concurrency: int,
              seed: int, warmup: str, plot: Path) -> list[str]:
    argv = ["--base-url", url, "--workload", workload, "--max-concurrency", str(concurrency),
            "--seed", str(seed), "--warmup-requests", warmup, "--plot", str(plot),
            "--max-duration", str(args.max_duration), *args.serving_args.split()]
    if args.num_requests:
        argv += ["--num-requests", str(args.num_requests)]
    return argv


def run_server(name: str, args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    spec = server_specs(max(args.concurrency), model=args.model)[name]
    print(f"--- starting {name}: {' '.join(spec.command)}", flush=True)
    server = RunningServer(spec, args.out / f"{name}.log")
    cells: dict[str, Any] = {"startup_s": server.startup_s}
    try:
        for wi, workload in enumerate(args.workloads):
            for ci, c in enumerate(args.concurrency):
                argv = cell_argv(args, spec.url, workload, c, args.seed + 100 * wi + ci,
                                 spec.warmup_requests,
                                 args.out / f"{name}-{workload}-c{c}.png")
                argv += ["--label", f"{name}: {workload} c={c}"]
                payload = asyncio.run(serving.benchmark(serving.parse_args(argv), tok))
                cells[f"{workload}/c{c}"] = payload["metrics"]
    finally:
        server.stop()
    return cells


def value(rounds: list[dict[str, Any]], key: str, sub: str | None) -> float | None:
    """The metric's median over the rounds (None: not reported)."""
    vals = [m[key][sub] if sub else m[key] for m in rounds]
    return None if None in vals else float(statistics.median(vals))


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    names = [n for n in args.servers if n in results]
    peers = [n for n in names if not n.startswith("ours")]
    pairs = [(o, p) for o in names if o.startswith("ours") for p in peers]
    head = ["workload", "c", "metric", *names, *(f"{o}/{p}" for o, p in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload in args.workloads:
        for c in args.concurrency:
            cell = f"{workload}/c{c}"
            rows = list(METRICS) + [("cache hit rate", "cache_hit_rate", None, True)]
            for label, key, sub, _ in rows:
                vals = {n: value(results[n][cell], key, sub) for n in names}
                if key == "cache_hit_rate":  # ours: /metrics; peers: their usage, if given
                    vals = {n: v if v is not None else
                            value(results[n][cell], "reported_hit_rate", None)
                            for n, v in vals.items()}
                    fmt = {n: "-" if v is None else f"{v:.2f}" for n, v in vals.items()}
                    ratios = ["" for _ in pairs]
                else:
                    fmt = {n: f"{v:.1f}" if v >= 10 else f"{v:.2f}" for n, v in vals.items()}
                    ratios = [f"{vals[o] / vals[p]:.2f}" if vals[p] else "" for o, p in pairs]
                lines.append("| " + " | ".join([workload, str(c), label,
                                                *(fmt[n] for n in names), *ratios]) + " |")
            if args.rounds > 1:  # each round's output tok/s and ratios
                per = {n: [m["output_throughput"] for m in results[n][cell]] for n in names}
                tps = [" / ".join(f"{v:.1f}" for v in per[n]) for n in names]
                rs = [" / ".join(f"{a / b:.2f}" for a, b in zip(per[o], per[p], strict=True))
                      for o, p in pairs]
                lines.append("| " + " | ".join(
                    [workload, str(c), "output tok/s by round", *tps, *rs]) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    tok = serving.load_tokenizer(None)
    results: dict[str, dict[str, Any]] = {name: {} for name in args.servers}
    for r in range(args.rounds):  # A B, B A, ...: the VM's drift spread over both
        for name in (args.servers if r % 2 == 0 else args.servers[::-1]):
            for cell, metrics in run_server(name, args, tok).items():
                results[name].setdefault(cell, []).append(metrics)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2,
        default=float) + "\n")
    md = table(results, args)
    (args.out / "table.md").write_text(md + "\n")
    print("\nstartup (s): " + ", ".join(
        f"{n} {statistics.median(r['startup_s']):.0f}" for n, r in results.items()))
    print(md)


if __name__ == "__main__":
    main()
