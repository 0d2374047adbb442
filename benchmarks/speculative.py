"""Speculative decoding (--speculative-algorithm ngram): one-stream speed per workload,
ours with and without it and llama-server on the same SmolLM2 GGUF; outputs identical
with and without it; throughput at 8 and 16 streams.

    .venv/bin/python benchmarks/speculative.py [--quick] [--no-peer]

Workloads (chat, greedy, max_tokens 128, 4 requests each, one at a time):
  document     quote / extract from a section of the Python reference in the prompt
  rewrite      a stdlib function given in the prompt, rewritten with type hints
  regenerated  the same prompt asked twice in a row (the second is measured)
  multi-turn   a second turn about the function the assistant gave in the first
  free chat    open questions: nothing in the context to copy
Per workload: decode tok/s per request ((completion tokens - 1) / (last - first token
time), streamed, summed over requests), and for ours with speculation the mean accepted
length (tokens a request gets per verify step: accepted drafts + 1) from the server's
stats. The three servers run side by side and take each workload in turn (the VM's
speed drifts between minutes). Every server is warmed with the whole workload once,
untimed, then its radix cache flushed (ours).

Identity: 64 prompts greedy at 1 and at 16 concurrent streams, and seeded (temperature
1, a seed per prompt) at 16 streams: each text with speculation equal to without.
Throughput: all workloads' prompts twice at 4, 8 and 16 concurrent streams, output tok/s.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.servers import RunningServer, ServerSpec, server_specs  # noqa: E402

MAX_TOKENS = 128
REFERENCE = ("if", "while", "for", "try", "with", "function", "class", "import")
FUNCTIONS = (textwrap.dedent, textwrap.indent, json.dumps, inspect.getdoc)
FREE = ("Tell me a short story about a robot who learns to paint.",
        "Explain how rainbows form, for a child.",
        "What are three good habits for staying healthy?",
        "Describe a perfect weekend in the mountains.")


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def workloads(n: int) -> dict[str, list[list[dict]]]:
    import pydoc_data.topics as topics

    docs = [topics.topics[k][:1800] for k in REFERENCE[:n]]
    sources = [inspect.getsource(f)[:1600] for f in FUNCTIONS[:n]]
    return {
        "document": [user(f"{d}\n\nQuote the first three sentences of the text above "
                          "exactly, then list its key terms.") for d in docs],
        "rewrite": [user("Rewrite this Python function with type hints, keeping the body "
                         f"the same:\n\n```python\n{s}```") for s in sources],
        "regenerated": [user(q) for q in FREE[:n]],
        "multi-turn": [user("Show me a Python function from the standard library.")
                       + [{"role": "assistant", "content": f"```python\n{s}```"}]
                       + user("Add a comment above each line of that function.")
                       for s in sources],
        "free chat": [user(f"{q} Use different words than usual.") for q in FREE[:n]],
    }


@cache
def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def stream(url: str, messages: list[dict], **extra) -> tuple[str, int, float, float]:
    """(text, completion tokens, first token time, end time) of one streamed chat."""
    body = dict(model=model_id(url), messages=messages, max_tokens=MAX_TOKENS, temperature=0.0,
                stream=True, stream_options={"include_usage": True}, **extra)
    text, tokens, first = [], 0, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return "".join(text), tokens, first or time.perf_counter(), time.perf_counter()


def stats(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=30).json()["stats"]


def one_stream(url: str, convs: list[list[dict]], regenerate: bool) -> tuple[float, int]:
    """Decode tok/s over the requests, one at a time; and their completion tokens."""
    tokens, seconds = 0, 0.0
    for messages in convs:
        if regenerate:
            stream(url, messages)  # the first answer (cached), not measured
        _, n, first, end = stream(url, messages)
        tokens += n - 1
        seconds += end - first
    return tokens / max(seconds, 1e-9), tokens


def completions(url: str, prompts: list[str], streams: int,
                seeded: bool = False) -> tuple[list[str], float, int]:
    """Texts of /v1/completions (greedy, or temperature 1 with a seed per prompt) at
    `streams` concurrent requests; the wall time and completion tokens."""
    def one(i: int) -> tuple[str, int]:
        body = dict(model=model_id(url), prompt=prompts[i], max_tokens=MAX_TOKENS,
                    temperature=1.0 if seeded else 0.0, **({"seed": i} if seeded else {}))
        r = httpx.post(url + "/v1/completions", json=body, timeout=900).json()
        return r["choices"][0]["text"], r["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        out = list(pool.map(one, range(len(prompts))))
    return [t for t, _ in out], time.perf_counter() - start, sum(n for _, n in out)


def render(tok, convs: list[list[dict]]) -> list[str]:
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in convs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 requests per workload")
    ap.add_argument("--no-peer", action="store_true", help="without llama-server")
    ap.add_argument("--out", default="/tmp/radixjax-speculative")
    args = ap.parse_args()
    work = workloads(2 if args.quick else 4)
    base = server_specs(parallel=16)
    spec_flags = ["--speculative-algorithm", "ngram"]
    ours = base["ours"]
    specs = {"ours": ours,
             "ours+spec": ServerSpec("ours+spec", (*ours.command[:-2], "--port", "30120",
                                                   *spec_flags), 30120)}
    if not args.no_peer:
        specs["llama.cpp"] = base["llama.cpp"]
    log = Path(args.out)
    servers = {}
    try:
        for name, spec in specs.items():
            servers[name] = RunningServer(spec, log / f"{name}.log")
            for name_w, convs in work.items():  # warm: the whole workload, untimed
                one_stream(spec.url, convs, name_w == "regenerated")
            if name.startswith("ours"):
                httpx.post(spec.url + "/flush_cache", timeout=60).raise_for_status()
        rows = []
        for w, convs in work.items():
            cells = {}
            for name, spec in specs.items():
                before = stats(spec.url) if name == "ours+spec" else None
                cells[name], _ = one_stream(spec.url, convs, w == "regenerated")
                if before is not None:
                    after = stats(spec.url)
                    n = after["num_verify_reqs"] - before["num_verify_reqs"]
                    acc = after["num_accepted_tokens"] - before["num_accepted_tokens"]
                    cells["accepted"] = (acc + n) / n if n else 0.0
            rows.append((w, cells))
            print(w, {k: round(v, 2) for k, v in cells.items()}, flush=True)
        identity = check_identity(specs, work)
        mix = all_prompts(work) * 2
        throughput = {s: {name: completions(specs[name].url, mix, s)
                          for name in ("ours", "ours+spec")} for s in (4, 8, 16)}
    finally:
        for s in servers.values():
            s.stop()
    report(rows, identity, throughput, "llama.cpp" in specs)


@cache
def tokenizer():
    from radixjax.loaders import load_model
    return load_model(None).tokenizer


def all_prompts(work: dict) -> list[str]:
    """Every conversation of `work` rendered with SmolLM2's chat template."""
    return render(tokenizer(), [c for convs in work.values() for c in convs])


def identity_prompts(work: dict) -> list[str]:
    """64 chat prompts: the workloads' (their first turns and whole conversations),
    quality.py's 16 greedy questions, and those again with an instruction."""
    from quality import GREEDY_PROMPTS

    convs = [c for convs in workloads(4).values() for c in convs]
    convs += [user(q) for q in GREEDY_PROMPTS]
    convs += [user(q + " Answer in two sentences.") for q in GREEDY_PROMPTS]
    convs += [user(q + " Repeat the question first.") for q in GREEDY_PROMPTS]
    return all_prompts({"all": convs})[:64]


def check_identity(specs: dict, work: dict) -> list[str]:
    """Rows of the identity table: texts with speculation == without, per check."""
    prompts = identity_prompts(work)
    rows = []
    for label, streams, seeded in (("greedy, 1 stream", 1, False),
                                   ("greedy, 16 streams", 16, False),
                                   ("seeded temperature 1, 16 streams", 16, True)):
        off = completions(specs["ours"].url, prompts, streams, seeded)[0]
        on = completions(specs["ours+spec"].url, prompts, streams, seeded)[0]
        same = sum(a == b for a, b in zip(off, on, strict=True))
        rows.append(f"| {label} | {len(prompts)} | {same} / {len(prompts)} |")
        print(rows[-1], flush=True)
    return rows


def report(rows, identity, throughput, peer: bool) -> None:
    head = "| workload | ours tok/s | ours + spec tok/s | speed-up | mean accepted length |"
    sep = "|---|---|---|---|---|"
    if peer:
        head += " llama-server tok/s | spec vs llama-server |"
        sep += "---|---|"
    print("\n" + head + "\n" + sep)
    for w, c in rows:
        line = (f"| {w} | {c['ours']:.1f} | {c['ours+spec']:.1f} | "
                f"{c['ours+spec'] / c['ours']:.2f}x | {c['accepted']:.2f} |")
        if peer:
            line += f" {c['llama.cpp']:.1f} | {c['ours+spec'] / c['llama.cpp']:.2f}x |"
        print(line)
    print("\n| check | prompts | identical |\n|---|---|---|")
    print("\n".join(identity))
    print("\n| streams | ours tok/s | ours + spec tok/s | ratio |\n|---|---|---|---|")
    for s, cells in throughput.items():
        off, on = (cells[n][2] / cells[n][1] for n in ("ours", "ours+spec"))
        print(f"| {s} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")


if __name__ == "__main__":
    main()
