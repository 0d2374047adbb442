"""Zero late compiles under a randomized traffic mix through the real server, at the
sizes of `make serve` (context 4096): greedy and sampled, logprobs / top_logprobs,
penalties, JSON schema and regex, n > 1, prompts from 1 to ~3,000 tokens, outputs up to
the context limit, waves of 1 to 32 concurrent requests (bench_serving/traffic_mix.py).

    make serve &        # or any radixjax server
    .venv/bin/python benchmarks/traffic_mix.py [--base-url http://127.0.0.1:30000]

Prints the requests answered per kind and the server's step programs / late compiles
before and after, and whether any request still holds KV.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from bench_serving.client import served_model
from bench_serving.traffic_mix import MixConfig, run_mix


def stats(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=30).json()["stats"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--num-requests", type=int, default=96)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    model = served_model(args.base_url)
    cfg = MixConfig(model=model, num_requests=args.num_requests,
                    max_concurrency=args.max_concurrency,
                    prompt_words=(1, 5, 40, 300, 1000, 2000),
                    long_prompt_words=3000,
                    seed=args.seed)
    before = stats(args.base_url)
    t = time.perf_counter()
    kinds = asyncio.run(run_mix(args.base_url, cfg))
    wall = time.perf_counter() - t
    after = stats(args.base_url)
    print(f"{sum(kinds.values())} requests in {wall:.0f} s, all answers checked: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print("| | step programs | late compiles | KV held by requests |")
    print("|---|---:|---:|---:|")
    for name, s in (("before the mix", before), ("after the mix", after)):
        print(f"| {name} | {s['num_step_programs']:.0f} | {s['num_late_compiles']:.0f} | "
              f"{s['kv_held']:.0f} |")


if __name__ == "__main__":
    main()
