"""Data parallelism with cache-aware routing vs round-robin, side by side in one run:
our DP controller (one server, --dp N) and SGLang's router (sglang-router) in front of N
separate servers of ours.

Workload: T tenants, each a long system prompt, R short questions each, in a fixed
random order with C in flight; greedy, fixed output length. Each replica's KV pool
(--num-slots) holds fewer system prompts than there are tenants, so where a tenant's
requests land decides the hit rate.

    .venv/bin/python benchmarks/dp.py [--dp 2] [--tenants 8] [--per-tenant 6]

Hit rate: cached / prompt tokens over the run, from each response's meta_info (SGLang's
native /generate, which the router passes through). Every server is warmed the same way
(two unrelated requests, then /flush_cache) and checked afterwards: no late compiles.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.servers import RunningServer, start_ours, start_router, stop_router  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dp"
WORDS = ("account", "billing", "delivery", "refund", "policy", "support", "order", "store",
         "warranty", "schedule", "invoice", "contract", "service", "ticket", "product")


def tenant_prompt(i: int, words: int) -> str:
    rng = np.random.default_rng(i)
    body = " ".join(rng.choice(WORDS, words))
    return f"You are the assistant of company number {i}. Its handbook: {body}.\nQuestion: "


def workload(tenants: int, per_tenant: int, words: int) -> list[str]:
    """Tenants mixed in a fixed random order (a round-robin in step with the tenants
    would partition them by accident)."""
    prompts = [tenant_prompt(t, words) for t in range(tenants)]
    texts = [prompts[t] + f"What about item {q}?" for q in range(per_tenant)
             for t in range(tenants)]
    order = np.random.default_rng(0).permutation(len(texts))
    return [texts[i] for i in order]


async def run(url: str, texts: list[str], concurrency: int, max_tokens: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    body = {"sampling_params": {"max_new_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True}}

    async def one(client: httpx.AsyncClient, text: str) -> dict:
        async with sem:
            r = await client.post(url + "/generate", json=dict(body, text=text))
            r.raise_for_status()
            return r.json()["meta_info"]

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        metas = await asyncio.gather(*(one(client, t) for t in texts))
    wall = time.perf_counter() - start
    prompt = sum(m["prompt_tokens"] for m in metas)
    return dict(wall=wall, req_s=len(texts) / wall,
                tok_s=sum(m["completion_tokens"] for m in metas) / wall,
                hit=sum(m["cached_tokens"] for m in metas) / prompt)


def server(name: str, port: int, flags: list[str]) -> RunningServer:
    def warm(url: str) -> None:
        for text in ("Warm-up one.", "Warm-up two, a little longer."):
            httpx.post(url + "/generate", timeout=600, json={
                "text": text, "sampling_params": {"max_new_tokens": 4}}).raise_for_status()

    return start_ours(name, port, flags, RESULTS, warm)


def late_compiles(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=30).json()["stats"]["num_late_compiles"]


def router(port: int, workers: list[str], policy: str) -> subprocess.Popen:
    return start_router(port, ["--policy", policy, "--worker-urls", *workers],
                        RESULTS / f"router-{policy}.log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--per-tenant", type=int, default=6)
    ap.add_argument("--words", type=int, default=300, help="system prompt length in words")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--num-slots", type=int, default=2048, help="KV slots per replica")
    ap.add_argument("--port", type=int, default=30400)
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    texts = workload(args.tenants, args.per_tenant, args.words)
    flags = ["--num-slots", str(args.num_slots), "--max-running", "8", "--context-length",
             "1024", "--max-prefill-tokens", "512", "--chunk-size", "512"]
    rows = []
    for policy in ("cache_aware", "round_robin"):
        s = server(f"dp-{policy}", args.port, flags + ["--dp", str(args.dp),
                                                       "--load-balance-method", policy])
        try:
            got = asyncio.run(run(s.spec.url, texts, args.concurrency, args.max_tokens))
            rows.append((f"ours, --dp {args.dp}", policy, got, late_compiles(s.spec.url)))
        finally:
            s.stop()
    workers = [server(f"worker{i}", args.port + 1 + i, flags) for i in range(args.dp)]
    try:
        for policy in ("cache_aware", "round_robin"):
            for w in workers:
                httpx.post(w.spec.url + "/flush_cache", timeout=60)
            r = router(args.port, [w.spec.url for w in workers], policy)
            try:
                got = asyncio.run(run(f"http://127.0.0.1:{args.port}", texts,
                                      args.concurrency, args.max_tokens))
            finally:
                stop_router(r)
            late = sum(late_compiles(w.spec.url) for w in workers)
            rows.append((f"sglang-router + {args.dp} servers", policy, got, late))
    finally:
        for w in workers:
            w.stop()
    print(f"{len(texts)} requests: {args.tenants} tenants x {args.per_tenant}, system prompt "
          f"~{args.words} words, {args.max_tokens} output tokens, {args.concurrency} in flight, "
          f"{args.num_slots} KV slots per replica")
    print("| front | policy | wall s | req/s | output tok/s | hit rate | late compiles |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for front, policy, g, late in rows:
        print(f"| {front} | {policy} | {g['wall']:.1f} | {g['req_s']:.2f} | {g['tok_s']:.1f} "
              f"| {g['hit']:.2f} | {late} |")


if __name__ == "__main__":
    main()
