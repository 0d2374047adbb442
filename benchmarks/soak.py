"""The soak of issue 15 against a running server: ~2 minutes, 64 concurrent clients, good
and bad requests, streaming and not, clients that leave early (bench_serving/soak.py).

    make serve &        # or any radixjax server
    .venv/bin/python benchmarks/soak.py [--base-url URL] [--duration 120] [--concurrency 64]

Prints the requests per kind and status, hung requests, greedy answers that differ from
the same request sent alone, KV held afterwards, and the server's resident memory before
and after.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench_serving.client import served_model
from bench_serving.soak import run_soak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = served_model(args.base_url)
    t = time.perf_counter()
    r = asyncio.run(run_soak(args.base_url, model, args.duration, args.concurrency, args.seed))
    print(f"{sum(r.statuses.values())} requests in {time.perf_counter() - t:.0f} s "
          f"(incl. the greedy re-checks)")
    print("| kind | status | count |")
    print("|---|---:|---:|")
    for (kind, status), n in sorted(r.statuses.items()):
        print(f"| {kind} | {status} | {n} |")
    print(f"hung: {r.hung}; server exceptions: {r.internal_errors}; greedy prompts "
          f"checked: {len(r.greedy)}, differing from alone: "
          f"{len(r.mismatches)}; KV held after: {r.stats.get('kv_held')}; late compiles: "
          f"{r.stats.get('num_late_compiles')}")
    print(f"server RSS: {r.rss_before_mb:.0f} MB -> {r.rss_after_mb:.0f} MB "
          f"({r.rss_after_mb - r.rss_before_mb:+.0f} MB)")


if __name__ == "__main__":
    main()
