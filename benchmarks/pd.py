"""Prefill-decode disaggregation vs one unified server (docs/disaggregation.md).

    .venv/bin/python benchmarks/pd.py            # SmolLM2; ~5 min on the 2-core VM

Servers (ours, the same flags, each warmed the same way, then its cache flushed): one
unified server; one prefill + one decode server behind sglang-router --pd-disaggregation.
Two measurements, each on both fronts in turn:

  ttft   long distinct prompts (~1k tokens), one at a time, streamed: TTFT, and what
         disaggregation adds per 1k prompt tokens (fetch + KV pull + landing + the
         decode server's first step); transfer MB/s from the decode server's counters
  itl    decode streams running (short prompts, 96 tokens each) while long prompts
         (~1.5k tokens) arrive every 1.5 s: the running streams' inter-token latency
         p50 / p99 (a unified server stalls them with each long prefill)

On this machine both PD servers share the same 2 CPU cores, so the prefill server's
compute still slows the decode server; on separate hosts it would not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.servers import RunningServer, start_ours, start_router, stop_router  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "pd"
WORDS = ("river stone lamp garden window paper cloud engine market silver "
         "orange violin forest ladder planet candle mirror harbor pencil tunnel").split()


def long_prompt(seed: int, words: int) -> str:
    body = " ".join(WORDS[(seed * 7 + i * 13 + i // 20) % len(WORDS)] for i in range(words))
    return f"Document {seed}: {body}\nSummarize document {seed} in one sentence."


async def stream(client: httpx.AsyncClient, url: str, text: str, max_tokens: int,
                 stamps: list[float] | None = None) -> dict:
    """One streamed /generate: TTFT and (into stamps) the time of every event."""
    body = {"text": text, "stream": True, "sampling_params": {
        "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    first = None
    meta = {}
    async with client.stream("POST", url + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            first = first or now
            if stamps is not None:
                stamps.append(now)
            meta = json.loads(line[6:])["meta_info"]
    return {"ttft": first - t0, "prompt_tokens": meta["prompt_tokens"]}


async def ttft_run(url: str, n: int, words: int, offset: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        outs = [await stream(client, url, long_prompt(offset + i, words), 4) for i in range(n)]
    return {"ttft_ms": 1e3 * statistics.median(o["ttft"] for o in outs),
            "prompt_tokens": statistics.median(o["prompt_tokens"] for o in outs)}


async def itl_run(url: str, streams: int, arrivals: int, words: int, offset: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        stamps = [[] for _ in range(streams)]
        running = [asyncio.create_task(stream(client, url, f"Story {offset + k}: once upon "
                                              "a time", 96, stamps[k]))
                   for k in range(streams)]
        await asyncio.sleep(1.0)
        arriving = []
        for i in range(arrivals):
            arriving.append(asyncio.create_task(
                stream(client, url, long_prompt(offset + 100 + i, words), 4)))
            await asyncio.sleep(1.5)
        await asyncio.gather(*running, *arriving)
    gaps = sorted(b - a for s in stamps for a, b in zip(s[1:], s[2:], strict=False))
    return {"itl_p50_ms": 1e3 * gaps[len(gaps) // 2],
            "itl_p99_ms": 1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]}


def pd_router(port: int, prefill: str, decode: str) -> subprocess.Popen:
    return start_router(port, ["--pd-disaggregation", "--prefill", prefill,
                               prefill.rsplit(":", 1)[1], "--decode", decode],
                        RESULTS / "router.log")


def stats(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=30).json()["stats"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=30500)
    ap.add_argument("--ttft-requests", type=int, default=6)
    ap.add_argument("--words", type=int, default=800, help="long prompt length in words")
    ap.add_argument("--itl-words", type=int, default=1200)
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)

    def warm(url: str) -> None:  # the same for every server: a short and a long prompt
        for text in ("Warm-up.", long_prompt(9999, args.words)):
            httpx.post(url + "/generate", timeout=600, json={
                "text": text, "sampling_params": {"max_new_tokens": 4}}).raise_for_status()

    rows = {}
    unified = start_ours("unified", args.port + 1, [], RESULTS, warm)
    try:
        u = unified.spec.url
        rows["unified"] = {**asyncio.run(ttft_run(u, args.ttft_requests, args.words, 0)),
                           **asyncio.run(itl_run(u, 4, 4, args.itl_words, 0)),
                           "late": stats(u)["num_late_compiles"]}
    finally:
        unified.stop()
    servers: list[RunningServer] = []
    try:
        for name, port in (("prefill", args.port + 2), ("decode", args.port + 3)):
            follows = (["--disaggregation-prefill-hosts", f"127.0.0.1:{args.port + 2}"]
                       if name == "decode" else [])
            servers.append(start_ours(name, port, ["--disaggregation-mode", name, *follows],
                                      RESULTS, warm))
        prefill, decode = (s.spec.url for s in servers)
        router = pd_router(args.port, prefill, decode)
        try:
            r = f"http://127.0.0.1:{args.port}"
            asyncio.run(ttft_run(r, 1, args.words, 5000))  # the decode server's first
            before = stats(decode)
            ttft = asyncio.run(ttft_run(r, args.ttft_requests, args.words, 0))
            after = stats(decode)
            rows["disaggregated"] = {**ttft, **asyncio.run(itl_run(r, 4, 4, args.itl_words,
                                                                   0)),
                                     "late": stats(prefill)["num_late_compiles"]
                                     + after["num_late_compiles"]}
        finally:
            stop_router(router)
    finally:
        for s in servers:
            s.stop()
    mb = (after["disagg_bytes"] - before["disagg_bytes"]) / 1e6
    secs = after["disagg_pull_s"] - before["disagg_pull_s"]
    u, d = rows["unified"], rows["disaggregated"]
    added = (d["ttft_ms"] - u["ttft_ms"]) / (u["prompt_tokens"] / 1000)
    print(f"prompts ~{u['prompt_tokens']:.0f} tokens (ttft, {args.ttft_requests} one at a "
          f"time); itl: 4 decode streams x 96 tokens, 4 prompts of ~{args.itl_words} words "
          "arriving every 1.5 s")
    print(f"{'':16}{'TTFT ms':>9}{'ITL p50 ms':>12}{'ITL p99 ms':>12}{'late':>6}")
    for name, row in rows.items():
        print(f"{name:16}{row['ttft_ms']:9.0f}{row['itl_p50_ms']:12.1f}"
              f"{row['itl_p99_ms']:12.1f}{row['late']:6d}")
    print(f"TTFT added by disaggregation: {added:.0f} ms per 1k prompt tokens; KV pulled "
          f"{mb:.1f} MB in {secs:.2f} s ({mb / max(secs, 1e-9):.0f} MB/s)")


if __name__ == "__main__":
    main()
