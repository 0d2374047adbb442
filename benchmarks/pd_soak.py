"""The PD soak of issue 41: one prefill and two decode servers (the default model) behind
sglang-router in PD mode, `concurrency` clients for `duration` seconds through the router
(bench_serving/soak.py's mix: good and bad requests, streams and not, sampled and greedy,
clients that leave early).

    .venv/bin/python benchmarks/pd_soak.py [--duration 60] [--concurrency 32]

Prints the requests per kind and status, hung requests, greedy answers that differ from
the same request alone, and per server, once idle: KV held, late compiles, failures,
rooms and the bytes they hold (after the rooms' sweep), transfers, KV integrity.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving.client import served_model  # noqa: E402
from bench_serving.soak import run_traffic  # noqa: E402
from peers.servers import start_ours, start_router, stop_router  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "pd_soak"
TIMEOUT_S = 10  # --disaggregation-timeout: rooms nobody fetched go after 2 x this


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=30700)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    common = ["--enable-debug-endpoints", "--disaggregation-timeout", str(TIMEOUT_S)]
    prefill_port = args.port + 1

    def warm(url: str) -> None:
        httpx.post(url + "/generate", timeout=600, json={
            "text": "Warm-up.", "sampling_params": {"max_new_tokens": 4}}).raise_for_status()

    servers = [start_ours("prefill", prefill_port,
                          ["--disaggregation-mode", "prefill", *common], RESULTS, warm)]
    router = None
    try:
        for k in (2, 3):
            servers.append(start_ours(
                f"decode{k - 1}", args.port + k,
                ["--disaggregation-mode", "decode", *common, "--disaggregation-prefill-hosts",
                 f"127.0.0.1:{prefill_port}"], RESULTS, warm))
        urls = [s.spec.url for s in servers]
        router = start_router(args.port, [
            "--pd-disaggregation", "--prefill", urls[0], str(prefill_port),
            *(a for u in urls[1:] for a in ("--decode", u))], RESULTS / "router.log")
        base = f"http://127.0.0.1:{args.port}"
        t = time.perf_counter()
        r = asyncio.run(run_traffic(base, served_model(urls[1]), args.duration,
                                    args.concurrency, idle_of=urls, router=True))
        print(f"{sum(r.statuses.values())} requests in {time.perf_counter() - t:.0f} s")
        print("| kind | status | count |")
        print("|---|---:|---:|")
        for (kind, status), n in sorted(r.statuses.items()):
            print(f"| {kind} | {status} | {n} |")
        print(f"hung: {r.hung}; greedy prompts checked: {len(r.greedy)}, differing from "
              f"alone: {len(r.mismatches)}")
        time.sleep(2 * TIMEOUT_S + 5)  # the prefill server's sweep of abandoned rooms
        print("| server | kv held | late compiles | failures | rooms | room bytes | "
              "transfers | failed rooms | integrity |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for s in servers:
            stats = httpx.get(s.spec.url + "/get_server_info", timeout=30).json()["stats"]
            ok = httpx.get(s.spec.url + "/debug/check_integrity", timeout=60).status_code
            print(f"| {s.spec.name} | {stats['kv_held']} | {stats['num_late_compiles']} | "
                  f"{stats['num_failures']} | {stats.get('disagg_rooms', '-')} | "
                  f"{stats.get('disagg_room_bytes', '-')} | {stats['disagg_transfers']} | "
                  f"{stats.get('disagg_failed', '-')} | {'ok' if ok == 200 else ok} |")
    finally:
        if router is not None:
            stop_router(router)
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
