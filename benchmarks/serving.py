"""Serving benchmark against any OpenAI-compatible server (ours, llama.cpp's
llama-server, vLLM, SGLang), in the manner of SGLang's bench_serving: streamed requests
over HTTP, a request rate or a max concurrency, bounded by a request count and a
duration; TTFT / TPOT / ITL / end-to-end latency (mean, median, p99), request and token
throughput, and against our server the radix cache hit rate from /metrics.

    .venv/bin/python benchmarks/serving.py --base-url http://127.0.0.1:30000 \\
        --workload generated-shared-prefix --max-concurrency 16 --output-json out.json

Workloads (benchmarks/bench_serving/workloads.py): generated-shared-prefix (groups x
prompts per group, shared system prompt), multi-turn (each turn re-sends the history),
random (no sharing), json-schema (response_format json_schema). Tokens are counted with
the model's tokenizer (--tokenizer: a GGUF or HF folder; default: the default model), so
the same prompts count the same for every server. A warm-up pass (a differently seeded
copy of the workload) runs before the clock starts."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import workloads as wl  # noqa: E402
from bench_serving.client import served_model  # noqa: E402
from bench_serving.report import format_metrics, plot_run, result_json, write_json  # noqa: E402
from bench_serving.runner import RunConfig, run_workload  # noqa: E402

WORKLOADS = ("generated-shared-prefix", "multi-turn", "random", "json-schema")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="model name to send (default: the first "
                   "of GET /v1/models)")
    p.add_argument("--tokenizer", default=None, help="GGUF file or HF folder whose tokenizer "
                   "counts tokens (default: radixjax's default model)")
    p.add_argument("--workload", choices=WORKLOADS, default="generated-shared-prefix")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("load")
    g.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most (default: unbounded)")
    g.add_argument("--request-rate", type=float, default=float("inf"),
                   help="sessions per second, Poisson arrivals (inf: all at once)")
    g.add_argument("--num-requests", type=int, default=None,
                   help="stop starting requests after this many (default: whole workload)")
    g.add_argument("--max-duration", type=float, default=None,
                   help="stop starting requests after this many seconds")
    g.add_argument("--warmup-requests", type=_count_or_all, default=None,
                   help="untimed requests first, from a differently seeded copy of the "
                   "workload: a count, or 'all' (default: max(2, max concurrency); 0: none)")
    g.add_argument("--request-timeout", type=float, default=600.0)
    g = p.add_argument_group("generated-shared-prefix")
    g.add_argument("--gsp-num-groups", type=int, default=4)
    g.add_argument("--gsp-prompts-per-group", type=int, default=4)
    g.add_argument("--gsp-system-prompt-len", type=int, default=256)
    g.add_argument("--gsp-question-len", type=int, default=32)
    g.add_argument("--gsp-output-len", type=int, default=32)
    g.add_argument("--gsp-chat", action="store_true",
                   help="chat requests: the system prompt as the system message")
    g = p.add_argument_group("multi-turn")
    g.add_argument("--mt-num-conversations", type=int, default=4)
    g.add_argument("--mt-num-turns", type=int, default=3)
    g.add_argument("--mt-system-len", type=int, default=128)
    g.add_argument("--mt-message-len", type=int, default=32)
    g.add_argument("--mt-output-len", type=int, default=32)
    g = p.add_argument_group("random")
    g.add_argument("--random-num-prompts", type=int, default=16)
    g.add_argument("--random-input-len", type=int, default=256)
    g.add_argument("--random-output-len", type=int, default=32)
    g = p.add_argument_group("json-schema")
    g.add_argument("--json-num-prompts", type=int, default=8)
    g.add_argument("--json-max-tokens", type=int, default=96)
    g = p.add_argument_group("output")
    g.add_argument("--output-json", type=Path, default=None)
    g.add_argument("--plot", type=Path, default=None, help="PNG of TTFT / TPOT / latency")
    g.add_argument("--label", default=None, help="title for the table and plot")
    return p.parse_args(argv)


def _count_or_all(value: str) -> int | str:
    if value == "all":
        return value
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("a count >= 0 or 'all'")
    return n


def build_workload(args: argparse.Namespace, tok: wl.Tokenizer, seed: int) -> wl.Workload:
    if args.workload == "generated-shared-prefix":
        return wl.generated_shared_prefix(
            tok, num_groups=args.gsp_num_groups, prompts_per_group=args.gsp_prompts_per_group,
            system_len=args.gsp_system_prompt_len, question_len=args.gsp_question_len,
            output_len=args.gsp_output_len, seed=seed, chat=args.gsp_chat)
    if args.workload == "multi-turn":
        return wl.multi_turn(tok, num_conversations=args.mt_num_conversations,
                             num_turns=args.mt_num_turns, system_len=args.mt_system_len,
                             message_len=args.mt_message_len, output_len=args.mt_output_len,
                             seed=seed)
    if args.workload == "random":
        return wl.random_prompts(tok, num_prompts=args.random_num_prompts,
                                 input_len=args.random_input_len,
                                 output_len=args.random_output_len, seed=seed)
    return wl.json_schema(tok, num_prompts=args.json_num_prompts,
                          output_len=args.json_max_tokens, seed=seed)


def load_tokenizer(path: str | None) -> Any:
    from radixjax.loaders import default_model_path
    from radixjax.loaders.gguf_file import is_gguf_file
    from radixjax.loaders.gguf_reader import read_gguf
    from radixjax.loaders.tokenizer import load_hf_tokenizer, tokenizer_from_gguf_metadata

    p = Path(path) if path else default_model_path()
    if is_gguf_file(p):
        return tokenizer_from_gguf_metadata(read_gguf(p).metadata)
    tok = load_hf_tokenizer(p)
    if tok is None:
        raise SystemExit(f"no tokenizer in {p}")
    return tok


async def benchmark(args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    """Warm up, run the timed workload, return the JSON payload."""
    model = args.model or served_model(args.base_url)
    cfg = RunConfig(base_url=args.base_url, model=model, max_concurrency=args.max_concurrency,
                    request_rate=args.request_rate, num_requests=args.num_requests,
                    max_duration=args.max_duration, request_timeout=args.request_timeout,
                    seed=args.seed)
    warm_work = build_workload(args, tok, args.seed + 10_000)
    num_warmup = {None: max(2, args.max_concurrency or 2), "all": warm_work.num_requests}.get(
        args.warmup_requests, args.warmup_requests)
    if num_warmup > 0:
        warm = await run_workload(warm_work, replace(cfg, num_requests=num_warmup,
                                                     max_duration=None), tok)
        if warm.metrics.failed:
            first = next(r.error for r in warm.records if not r.ok)
            raise SystemExit(f"warm-up: {warm.metrics.failed} requests failed: {first}")
    workload = build_workload(args, tok, args.seed)
    result = await run_workload(workload, cfg, tok)
    title = args.label or f"{args.workload} @ {args.base_url} c={args.max_concurrency}"
    print(format_metrics(result.metrics, title), flush=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    payload = result_json(result, config | {"model": model, "warmup_requests": num_warmup,
                                            "workload_params": workload.params})
    if args.output_json:
        write_json(args.output_json, payload)
    if args.plot:
        plot_run(result, args.plot, title)
    return payload


def main(argv: list[str] | None = None, tok: Any = None) -> dict[str, Any]:
    args = parse_args(argv)
    return asyncio.run(benchmark(args, tok if tok is not None else load_tokenizer(args.tokenizer)))


if __name__ == "__main__":
    payload = main()
    if payload["metrics"]["failed"]:
        first = next(r["error"] for r in payload["requests"] if r["error"])
        print(f"{payload['metrics']['failed']} requests failed; first: {first}", file=sys.stderr)
        sys.exit(1)
