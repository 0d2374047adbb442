"""The frontend language's throughput: a run_batch program of N few-shot questions that
share a ~500-token few-shot prefix, through our server, side by side in one run:

    lang run_batch, radix cache on      (the prefix is computed once, the rest shared)
    lang run_batch, radix cache off     (--disable-radix-cache: every program prefills it)
    the same calls one by one           (the OpenAI completions API, sequentially, cache on)

    .venv/bin/python benchmarks/frontend.py [--questions 64] [--max-tokens 16]

Each server is started with `make serve`'s defaults (plus the cache flag), warmed the same
way (two programs on questions outside the measured set, then /flush_cache), and checked
afterwards: no late compiles, no KV held. Greedy; every answer is checked to be the
same across the three modes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving.client import served_model  # noqa: E402
from peers.servers import RunningServer, start_ours  # noqa: E402

from radixjax import lang as sgl  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "frontend"


def few_shot_prefix(examples: int = 26) -> str:
    lines = ["Answer each question with a number.\n"]
    for i in range(examples):
        a, b = 3 + 7 * i % 50, 11 + 13 * i % 40
        lines.append(f"Q: What is {a} plus {b}?\nA: {a + b}\n")
    return "".join(lines)


PREFIX = few_shot_prefix()


@sgl.function
def few_shot(s, a, b):
    s += PREFIX
    s += f"Q: What is {a} plus {b}?\nA:" + sgl.gen("answer", stop="\n")


def questions(n: int, offset: int = 0) -> list[dict]:
    return [{"a": 100 + i + offset, "b": 200 + 3 * i} for i in range(n)]


def run_lang(url: str, qs: list[dict], max_tokens: int) -> tuple[float, list[str], int]:
    backend = sgl.RuntimeEndpoint(url)
    start = time.perf_counter()
    states = few_shot.run_batch(qs, backend=backend, temperature=0, max_new_tokens=max_tokens)
    wall = time.perf_counter() - start
    answers = [st["answer"] for st in states]
    tokens = sum(st.get_meta_info("answer")["completion_tokens"] for st in states)
    return wall, answers, tokens


def run_one_by_one(url: str, qs: list[dict], max_tokens: int) -> tuple[float, list[str], int]:
    model = served_model(url)
    answers, tokens = [], 0
    start = time.perf_counter()
    with httpx.Client(timeout=600) as client:
        for q in qs:
            body = {"model": model, "prompt": PREFIX + f"Q: What is {q['a']} plus {q['b']}?\nA:",
                    "max_tokens": max_tokens, "temperature": 0, "stop": ["\n"]}
            r = client.post(url + "/v1/completions", json=body).json()
            answers.append(r["choices"][0]["text"])
            tokens += r["usage"]["completion_tokens"]
    return time.perf_counter() - start, answers, tokens


def start(name: str, port: int, extra: list[str]) -> RunningServer:
    def warm(url: str) -> None:  # the same for every server
        few_shot.run_batch(questions(2, offset=5000), backend=sgl.RuntimeEndpoint(url),
                           temperature=0, max_new_tokens=4)

    return start_ours(name, port, extra, RESULTS, warm)


def check_clean(url: str) -> dict:
    stats = httpx.get(url + "/get_server_info", timeout=30).json()["stats"]
    assert stats["num_late_compiles"] == 0, "a step compiled after warm-up"
    assert stats["kv_held"] == 0, "KV still held by requests"
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--port", type=int, default=30200)
    args = ap.parse_args()
    qs = questions(args.questions)
    rows, answers = [], {}
    for name, extra, modes in (("cache-on", [], ("lang run_batch, radix cache on",
                                                 "one by one (OpenAI API), cache on")),
                               ("cache-off", ["--disable-radix-cache"],
                                ("lang run_batch, radix cache off",))):
        server = start(name, args.port, extra)
        try:
            for mode in modes:
                run = run_one_by_one if mode.startswith("one by one") else run_lang
                wall, got, tokens = run(server.spec.url, qs, args.max_tokens)
                httpx.post(server.spec.url + "/flush_cache", timeout=30)
                stats = check_clean(server.spec.url)
                answers[mode] = got
                rows.append((mode, wall, tokens, stats["num_step_programs"]))
            prefix_tokens = sgl.RuntimeEndpoint(server.spec.url).generate({
                "text": PREFIX, "sampling_params": {"max_new_tokens": 0}})[
                "meta_info"]["prompt_tokens"]
        finally:
            server.stop()
    base = next(r for r in rows if r[0].startswith("one by one"))[1]
    print(f"{args.questions} few-shot programs sharing a {prefix_tokens}-token prefix, "
          f"<= {args.max_tokens} output tokens each, greedy")
    print("| mode | wall s | programs/s | output tok/s | vs one by one | step programs |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, wall, tokens, programs in rows:
        print(f"| {mode} | {wall:.1f} | {args.questions / wall:.2f} | {tokens / wall:.1f} | "
              f"{base / wall:.2f}x | {programs} |")
    same = all(a == answers[rows[0][0]] for a in answers.values())
    print(f"answers identical across modes: {same}; late compiles: 0; KV held after: 0")


if __name__ == "__main__":
    main()
