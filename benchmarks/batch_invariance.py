"""Batch invariance of a running server: 32 greedy chat requests over two long shared
system prompts (chunked prefill, then cache hits), sent 16 at a time, each against the
same request sent alone after a cache flush (as on a fresh server).

    make serve &        # the default form; or python -m radixjax.launch_server [options]
    .venv/bin/python benchmarks/batch_invariance.py [--base-url URL] [--concurrency 16]

The system prompts are sections of the Python Language Reference (`pydoc_data.topics`,
shipped with CPython), ~700 and ~900 tokens: past the default chunk (512), so their
first requests prefill in chunks and the rest find them in the radix cache. Prints how
many answers are token-identical to the alone run, the first differing ones, and the
server's late compiles and KV held afterwards.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx

QUESTIONS = (
    "Summarize the text above in one sentence.", "What is the main topic above?",
    "Give one example from the text.", "Name a keyword the text mentions.",
    "Is anything above deprecated?", "Explain the first paragraph simply.",
    "What would a beginner find hardest here?", "List two rules stated above.",
    "Write a short Python snippet that illustrates the text.",
    "What error could a programmer make here?", "Which section title fits the text?",
    "Translate the first sentence into French.", "What does the text say about scope?",
    "Ask a quiz question about the text.", "What is the last rule given?",
    "Rate the text's clarity from 1 to 10 and say why.",
)
SECTIONS = (("assignment",), ("function", "naming"))


def system_prompts(max_chars: int = 3600) -> list[str]:
    import pydoc_data.topics as topics

    return ["\n\n".join(topics.topics[k] for k in sec)[:max_chars] for sec in SECTIONS]


def requests(model: str, max_tokens: int) -> list[dict]:
    return [{"model": model, "temperature": 0, "max_tokens": max_tokens, "logprobs": True,
             "messages": [{"role": "system", "content": s}, {"role": "user", "content": q}]}
            for s in system_prompts() for q in QUESTIONS]


async def chat(client: httpx.AsyncClient, body: dict) -> list[str]:
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return [t["token"] for t in r.json()["choices"][0]["logprobs"]["content"]]


async def run(base_url: str, concurrency: int, max_tokens: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        bodies = requests(model, max_tokens)
        (await client.post("/flush_cache")).raise_for_status()
        sem = asyncio.Semaphore(concurrency)

        async def limited(body: dict) -> list[str]:
            async with sem:
                return await chat(client, body)

        together = await asyncio.gather(*(limited(b) for b in bodies))
        alone = []
        for body in bodies:
            (await client.post("/flush_cache")).raise_for_status()
            alone.append(await chat(client, body))
        info = (await client.get("/get_server_info")).json()
    same = [a == b for a, b in zip(together, alone, strict=True)]
    print(f"{sum(same)}/{len(same)} greedy answers token-identical to the same request "
          f"alone (concurrency {concurrency}, {max_tokens} tokens each)")
    for i, ok in enumerate(same):
        if not ok:
            k = next((j for j, (x, y) in enumerate(zip(together[i], alone[i], strict=False))
                      if x != y), min(len(together[i]), len(alone[i])))
            print(f"  request {i}: first difference at token {k} "
                  f"({together[i][k:k + 3]} vs {alone[i][k:k + 3]})")
    stats = info["stats"]
    print(f"late compiles: {stats.get('num_late_compiles')}, KV held: {stats.get('kv_held')}, "
          f"internal errors: {info.get('num_internal_errors')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    asyncio.run(run(args.base_url, args.concurrency, args.max_tokens))


if __name__ == "__main__":
    main()
