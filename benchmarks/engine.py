"""Engine benchmark on the default model (SmolLM2-135M), each part a markdown table:

  a. shared prefixes: S system prompts x Q questions each; throughput and mean TTFT with
     the radix cache on vs off;
  b. overlap on vs off: decode steps/s at batch 1 and 32;
  c. scheduler overhead: µs per scheduler iteration with a null model runner (no device
     work) at 64 / 256 running and 1k waiting requests, next to the real step time;
  d. LPM vs FCFS: interleaved prefix groups, a KV pool that holds about two groups'
     prefixes: cache hit rate and throughput.

    .venv/bin/python benchmarks/engine.py [--quick]

Sizes are scaled down for the 2-core CPU VM (see benchmarks/README.md); the flags scale
them back up, e.g. the issue's (a): --systems 8 --system-len 1024 --questions 16
--new-tokens 64. Prompts are random token ids (fixed seeds), greedy, ignore_eos.

Every engine compiles its step programs (one per token bucket) before the clock starts
(`runner.warmup`), and `num_late_compiles` afterwards must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any, NamedTuple

import numpy as np

from radixjax import Engine, SamplingParams
from radixjax.engine.config import EngineConfig
from radixjax.engine.engine import GenerateOutput, runner_config_for
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
from radixjax.loaders import load_model
from radixjax.model.attention import BatchShape
from radixjax.runtime.batch import HostBatch
from radixjax.runtime.compile_cache import enable_persistent_cache
from radixjax.runtime.model_runner import StepOptions
from radixjax.sampling.params import SamplingArrays
from radixjax.sampling.sampler import SampleOutput

Prompts = list[list[int]]


class Model(NamedTuple):
    params: Any
    cfg: Any


# -- the null runner ----------------------------------------------------------------------


class NullRunner:
    """Stands in for ModelRunner with what the Scheduler touches (`buckets`, `step`):
    no device work; every sampled token is 1. Records each step's shape."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.buckets = runner_config_for(cfg).buckets
        self.shapes: set[BatchShape] = set()

    def step(self, batch: HostBatch, sp: SamplingArrays, opts: StepOptions,
             token_mask: np.ndarray | None = None) -> SampleOutput:
        self.shapes.add(batch.shape)
        return SampleOutput(np.ones(batch.shape.num_reqs, np.int32), None, None, None)


def make_reqs(prompts: Prompts, sp: SamplingParams) -> list[Req]:
    return [Req(rid=f"r{i}", prompt_ids=list(p), sampling=sp, seed=i)
            for i, p in enumerate(prompts)]


class Run(NamedTuple):
    wall: float  # s, generate() of the whole workload
    outs: list[GenerateOutput]
    stats: dict[str, float]

    @property
    def output_tok_s(self) -> float:
        return sum(o.completion_tokens for o in self.outs) / self.wall

    @property
    def mean_ttft(self) -> float:
        return statistics.fmean(o.stats.ttft for o in self.outs)

    @property
    def step_time(self) -> float:
        """Mean time per output token after the first: the decode step interval."""
        return statistics.fmean(o.stats.time_per_output_token for o in self.outs)


def run(model: Model, prompts: Prompts, sp: SamplingParams, **options: Any) -> Run:
    with Engine(params=model.params, model_config=model.cfg, **options) as eng:
        eng.runner.warmup(progress=False)  # every step program: nothing compiles later
        t = time.perf_counter()
        outs = eng.generate(prompts, sp)
        wall = time.perf_counter() - t
        stats = eng.stats()
        eng.check_integrity()
    if stats["num_late_compiles"]:
        print(f"  warning: {stats['num_late_compiles']:.0f} step(s) compiled inside the "
              "timing (a bucket bug)")
    return Run(wall, outs, stats)


def tokens(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(3, vocab, n).tolist()


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def greedy(max_new: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True)


# -- (a) radix cache on vs off ------------------------------------------------------------


def part_a(model: Model, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(1)
    vocab = model.cfg.vocab_size
    systems = [tokens(rng, args.system_len, vocab) for _ in range(args.systems)]
    prompts = [s + tokens(rng, int(rng.integers(args.question_len // 2,
                                                  args.question_len * 3 // 2 + 1)), vocab)
               for s in systems for _ in range(args.questions)]
    order = rng.permutation(len(prompts))  # questions of all systems arrive mixed
    prompts = [prompts[i] for i in order]
    max_context = pow2_at_least(max(map(len, prompts)) + args.new_tokens)
    max_running = min(32, len(prompts))
    options = dict(num_slots=max_running * max_context, max_running=max_running,
                   max_context=max_context, max_prefill_tokens=512, chunk_size=512)
    sp = greedy(args.new_tokens)
    off = run(model, prompts, sp, enable_cache=False, **options)
    on = run(model, prompts, sp, enable_cache=True, **options)
    print(f"\n(a) shared prefixes: {args.systems} system prompts x {args.system_len} tokens, "
          f"{args.questions} questions each (~{args.question_len} tokens), "
          f"{args.new_tokens} new tokens, {len(prompts)} requests at once, "
          f"max_running {max_running}\n")
    print("| measure | cache off | cache on | on/off |")
    print("|---|---:|---:|---:|")
    rows = [
        ("wall s", off.wall, on.wall, "{:.1f}"),
        ("output tok/s", off.output_tok_s, on.output_tok_s, "{:.1f}"),
        ("mean TTFT s", off.mean_ttft, on.mean_ttft, "{:.2f}"),
        ("tokens computed", off.stats["num_computed_tokens"],
         on.stats["num_computed_tokens"], "{:.0f}"),
    ]
    for name, a, b, fmt in rows:
        print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {b / a:.2f} |")
    print(f"| cache hit rate | {off.stats['cache_hit_rate']:.1%} | "
          f"{on.stats['cache_hit_rate']:.1%} | |")


# -- (b) overlap on vs off ----------------------------------------------------------------


def part_b(model: Model, args: argparse.Namespace) -> dict[int, float]:
    """Returns the overlap-off step time (s) per batch size, for (c)."""
    rng = np.random.default_rng(2)
    sp = greedy(args.decode_tokens)
    results = []
    for b in args.batches:
        prompts = [tokens(rng, 32, model.cfg.vocab_size) for _ in range(b)]
        options = dict(num_slots=b * 256 + 1, max_running=b, max_context=256,
                       max_prefill_tokens=512, chunk_size=512)
        off = run(model, prompts, sp, enable_overlap=False, **options)
        on = run(model, prompts, sp, enable_overlap=True, **options)
        results.append((b, off, on))
    print(f"\n(b) overlap: decode-heavy, B requests of 32 prompt tokens, "
          f"{args.decode_tokens} new tokens; step = mean time per output token after the "
          "first\n")
    print("| batch | off: ms/step | on: ms/step | off: steps/s | on: steps/s | on/off steps/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, off, on in results:
        print(f"| {b} | {off.step_time * 1e3:.1f} | {on.step_time * 1e3:.1f} | "
              f"{1 / off.step_time:.2f} | {1 / on.step_time:.2f} | "
              f"{off.step_time / on.step_time:.2f} |")
    return {b: off.step_time for b, off, _ in results}


# -- (c) scheduler overhead ---------------------------------------------------------------


def scheduler_overhead(num_running: int, num_waiting: int, policy: str, iters: int,
                       prompt_len: int = 512) -> tuple[float, float, str]:
    """(median wall µs, median CPU µs) per decode iteration with `num_running` requests
    decoding and `num_waiting` queued behind them (max_running is full), and the policy
    in effect. Prompts: one of 8 shared 256-token prefixes + unique tokens."""
    rng = np.random.default_rng(3)
    max_context = 2048
    cfg = EngineConfig(num_slots=num_running * max_context + 1, max_running=num_running,
                       max_context=max_context, max_prefill_tokens=1024, chunk_size=512,
                       policy=policy)
    heads = [tokens(rng, 256, 49152) for _ in range(8)]
    prompts = [heads[i % 8] + tokens(rng, prompt_len - 256, 49152)
               for i in range(num_running + num_waiting)]
    runner = NullRunner(cfg)
    sched = Scheduler(runner, cfg, eos_token_ids=())  # type: ignore[arg-type]
    for r in make_reqs(prompts, greedy(max_context - prompt_len - 1)):
        sched.add_request(r)
    walls, cpus = [], []

    async def drive() -> None:
        while any(r.is_prefilling for r in sched.running) or len(sched.running) < num_running:
            await sched.run_once()  # admit and prefill the running set
        for _ in range(3):
            await sched.run_once()
        for _ in range(iters):
            before = sched.stats.num_decode_steps
            t, c = time.perf_counter(), time.process_time()
            await sched.run_once()
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            assert sched.stats.num_decode_steps == before + 1
            assert len(sched.running) == num_running and len(sched.waiting) == num_waiting

    asyncio.run(drive())
    return (statistics.median(walls) * 1e6, statistics.median(cpus) * 1e6,
            sched.policy.effective(num_waiting))


def part_c(args: argparse.Namespace, step_times: dict[int, float]) -> None:
    cases = [(64, 0, "lpm"), (64, 128, "lpm"), (64, 1000, "lpm"), (256, 1000, "lpm")]
    print(f"\n(c) scheduler overhead: null model runner, context 512+, median of "
          f"{args.iters} decode iterations (run_once: schedule, build the batch, dispatch, "
          "process the previous step)\n")
    print("| running | waiting | policy in effect | wall µs/iter | CPU µs/iter |")
    print("|---:|---:|---|---:|---:|")
    for running, waiting, policy in cases:
        wall, cpu, eff = scheduler_overhead(running, waiting, policy, args.iters)
        print(f"| {running} | {waiting} | {eff} | {wall:.0f} | {cpu:.0f} |")
    for b, t in step_times.items():
        print(f"| real model decode step, batch {b} | | | {t * 1e6:.0f} | |")


# -- (d) LPM vs FCFS ----------------------------------------------------------------------


def part_d(model: Model, args: argparse.Namespace) -> None:
    """G prefix groups, R requests each, arriving interleaved g0 g1 .. g0 g1 ..; the KV
    pool holds three requests, so serving in arrival order evicts each prefix before its
    group comes round again (LRU under a cyclic pattern), while LPM serves a cached
    group's requests first."""
    rng = np.random.default_rng(4)
    vocab = model.cfg.vocab_size
    g, r, plen = args.groups, args.per_group, args.group_prefix
    prefixes = [tokens(rng, plen, vocab) for _ in range(g)]
    prompts = [prefixes[i % g] + tokens(rng, 16, vocab) for i in range(g * r)]
    req_len = plen + 16 + args.group_new_tokens
    options = dict(num_slots=3 * req_len, max_running=8, max_context=pow2_at_least(req_len),
                   max_prefill_tokens=512, chunk_size=512)
    sp = greedy(args.group_new_tokens)
    runs = {p: run(model, prompts, sp, policy=p, **options) for p in ("fcfs", "lpm")}
    print(f"\n(d) LPM vs FCFS: {g} prefix groups x {r} requests ({plen}-token prefix + 16), "
          f"interleaved, {args.group_new_tokens} new tokens; KV pool {options['num_slots']} "
          "tokens (3 requests' worth), max_running 8\n")
    print("| policy | cache hit rate | tokens computed | wall s | output tok/s | mean TTFT s |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, x in runs.items():
        print(f"| {p} | {x.stats['cache_hit_rate']:.1%} | {x.stats['num_computed_tokens']:.0f}"
              f" | {x.wall:.1f} | {x.output_tok_s:.1f} | {x.mean_ttft:.2f} |")
    f, lp = runs["fcfs"], runs["lpm"]
    print(f"| lpm/fcfs | | {lp.stats['num_computed_tokens'] / f.stats['num_computed_tokens']:.2f}"
          f" | {lp.wall / f.wall:.2f} | {lp.output_tok_s / f.output_tok_s:.2f} | "
          f"{lp.mean_ttft / f.mean_ttft:.2f} |")


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--parts", default="abcd")
    ap.add_argument("--systems", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 32])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--group-prefix", type=int, default=384)
    ap.add_argument("--group-new-tokens", type=int, default=8)
    args = ap.parse_args()
    if args.quick:
        args.systems, args.system_len, args.questions, args.question_len = 2, 128, 2, 16
        args.new_tokens, args.batches, args.decode_tokens, args.iters = 4, [1, 4], 6, 10
        args.groups, args.per_group, args.group_prefix, args.group_new_tokens = 3, 2, 128, 4
    enable_persistent_cache()
    t = time.perf_counter()
    model = None
    if set(args.parts) - {"c"}:
        m = load_model(None, load_tokenizer=False)
        model = Model(m.params, m.cfg)
    step_times: dict[int, float] = {}
    if "a" in args.parts:
        part_a(model, args)
    if "b" in args.parts:
        step_times = part_b(model, args)
    if "c" in args.parts:
        part_c(args, step_times)
    if "d" in args.parts:
        part_d(model, args)
    print(f"\ntotal {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
