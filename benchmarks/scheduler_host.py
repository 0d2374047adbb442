"""The scheduler's host time per decode step: how it grows with the requests' context.

Run:  PYTHONPATH=src python benchmarks/scheduler_host.py [--reqs 32] [--contexts 256 2048]

The real Scheduler over a runner that computes nothing (its step returns the tokens at
once), so every microsecond measured is the scheduler's own host work of a step: the
batch built (slots, token sources, shared-prefix lengths), the sampling arrays, the
previous step's tokens processed (outputs, finish checks, chunks). B requests of each
context are admitted and prefilled; then the median of the decode steps' run_once time.
Two prompt sets: distinct (no two share a slot) and shared (every request extends one
common prefix of context - 16 tokens: the shared-prefix pass's grouping runs).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import NamedTuple

import numpy as np

from radixjax.engine.config import EngineConfig
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
from radixjax.runtime.batch import Buckets, HostBatch
from radixjax.runtime.model_runner import StepOutput
from radixjax.runtime.prompt_logprobs import PromptLogprobs
from radixjax.sampling.params import SamplingParams
from radixjax.sampling.sampler import SampleOutput

TOKEN = 7  # every step samples this (no EOS: the requests run to max_new_tokens)


class FakeModelConfig(NamedTuple):
    vocab_size: int


class InstantRunner:
    """What the scheduler uses of a ModelRunner, with no device work."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.buckets = Buckets.default(cfg.max_prefill_tokens, cfg.max_running)
        self.cfg = FakeModelConfig(vocab_size=1000)

    def dispatches_at_once(self, shape) -> bool:
        return True

    def step(self, host: HostBatch, sp, opts, token_mask) -> StepOutput:
        b, t = host.shape.num_reqs, host.shape.num_tokens
        sample = SampleOutput(np.full(b, TOKEN, np.int32), np.zeros(b, np.float32),
                              np.zeros((b, 1), np.int32), np.zeros((b, 1), np.float32))
        prompt = PromptLogprobs(np.zeros(t, np.float32), np.zeros((t, 1), np.int32),
                                np.zeros((t, 1), np.float32))
        return StepOutput(sample, prompt)

    def reset_state(self) -> None:
        pass


def prompts(num: int, context: int, shared: bool, rng: np.random.Generator) -> list[list[int]]:
    if not shared:
        return [rng.integers(10, 1000, context).tolist() for _ in range(num)]
    common = rng.integers(10, 1000, context - 16).tolist()
    return [common + rng.integers(10, 1000, 16).tolist() for _ in range(num)]


async def decode_step_us(num: int, context: int, shared: bool, steps: int) -> float:
    cfg = EngineConfig(num_slots=num * (context + steps + 64) + 64, max_running=num,
                       max_context=context + steps + 32, max_prefill_tokens=1024,
                       chunk_size=1024)
    sched = Scheduler(InstantRunner(cfg), cfg, eos_token_ids=(0,))
    sp = SamplingParams(max_new_tokens=steps + 8, temperature=0.0)
    for i, p in enumerate(prompts(num, context, shared, np.random.default_rng(0))):
        sched.add_request(Req(f"r{i}", p, sp, seed=i))
    while any(r.is_prefilling or r.num_computed == 0 for r in sched.running) or sched.waiting:
        await sched.run_once()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        await sched.run_once()
        times.append(time.perf_counter() - t0)
    assert len(sched.running) == num, "every request still decoding"
    return float(np.median(times)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reqs", type=int, default=32)
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    print(f"scheduler host time per decode step, {args.reqs} requests (median µs)")
    print(f"{'context':>8} {'distinct':>10} {'shared':>10}")
    for context in args.contexts:
        row = [asyncio.run(decode_step_us(args.reqs, context, s, args.steps))
               for s in (False, True)]
        print(f"{context:>8} {row[0]:>10.0f} {row[1]:>10.0f}")


if __name__ == "__main__":
    main()
