"""The warm-up compiles every step program the scheduler can ever dispatch: enumerated
from the config, and checked against randomized traffic on a null runner (scheduling
without device work), for several configs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from radixjax.engine.config import EngineConfig
from radixjax.engine.engine import runner_config_for
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
from radixjax.model.attention import BatchShape
from radixjax.runtime.batch import HostBatch
from radixjax.runtime.model_runner import StepOutput
from radixjax.runtime.prompt_logprobs import PromptLogprobs
from radixjax.sampling.params import MAX_TOP_LOGPROBS, SamplingArrays, SamplingParams
from radixjax.sampling.sampler import SampleOutput

VOCAB = 300
EOS = 2


class NullRunner:
    """What the Scheduler touches of a ModelRunner, without a device: random tokens."""

    def __init__(self, cfg: EngineConfig, seed: int) -> None:
        self.buckets = runner_config_for(cfg).buckets
        self.shapes: list[BatchShape] = []
        self.rng = np.random.default_rng(seed)

    def step(self, batch: HostBatch, sp: SamplingArrays, opts, token_mask=None) -> StepOutput:
        self.shapes.append(batch.shape)
        b, t, k = batch.shape.num_reqs, batch.shape.num_tokens, MAX_TOP_LOGPROBS
        sample = SampleOutput(self.rng.integers(3, VOCAB, b).astype(np.int32),
                              np.zeros(b, np.float32), np.zeros((b, k), np.int32),
                              np.zeros((b, k), np.float32))
        prompt = PromptLogprobs(np.zeros(t, np.float32), np.zeros((t, k), np.int32),
                                np.zeros((t, k), np.float32))
        return StepOutput(sample, prompt)


def random_request(rng: np.random.Generator, i: int, cfg: EngineConfig,
                   prefixes: list[list[int]]) -> Req:
    n = int(rng.integers(1, cfg.max_context - 1))
    head = prefixes[i % len(prefixes)][: n // 2]
    prompt = head + rng.integers(3, VOCAB, n - len(head)).tolist()
    sp = SamplingParams(
        max_new_tokens=int(rng.integers(0, cfg.max_context)),  # up to the context limit
        logprob_start_len=int(rng.choice([-1, n // 2])),  # some score their prompt
        temperature=float(rng.choice([0.0, 1.0])), logprobs=bool(rng.random() < 0.3),
        top_logprobs=int(rng.choice([0, 5])), frequency_penalty=float(rng.choice([0, 0.5])),
        ignore_eos=bool(rng.random() < 0.5))
    return Req(rid=str(i), prompt_ids=prompt, sampling=sp, seed=i)


CONFIGS = [
    dict(num_slots=4096, max_running=8, max_context=512, max_prefill_tokens=256,
         chunk_size=256),
    dict(num_slots=2048, max_running=16, max_context=1024, max_prefill_tokens=512,
         chunk_size=128, enable_mixed=True),
    dict(num_slots=1024, page_size=16, max_running=5, max_context=700, max_prefill_tokens=96,
         chunk_size=64, enable_overlap=False, retract_every=7),
    dict(num_slots=600, max_running=32, max_context=300, max_prefill_tokens=300,
         chunk_size=300, enable_mixed=True, policy="fcfs"),  # a small pool: retractions
]


@pytest.mark.parametrize("options", CONFIGS)
def test_every_dispatched_step_is_a_warm_program(options: dict) -> None:
    cfg = EngineConfig(**options)
    warm = set(runner_config_for(cfg).buckets.shapes)  # what ModelRunner.warmup compiles
    assert len(warm) <= 12  # a small, fixed set
    # Enumerated: a step of any token count the scheduler allows lands in a warm program.
    runner = NullRunner(cfg, seed=0)
    for n in range(1, cfg.max_step_tokens + 1):
        for reqs in {1, min(n, cfg.max_running)}:
            assert runner.buckets.shape_for(n, reqs) in warm
    # Observed: randomized traffic (arrivals over time, shared prefixes, sampling options,
    # outputs up to the context limit) dispatches only warm programs.
    rng = np.random.default_rng(len(options))
    sched = Scheduler(runner, cfg, eos_token_ids=(EOS,))  # type: ignore[arg-type]
    prefixes = [rng.integers(3, VOCAB, cfg.max_context).tolist() for _ in range(3)]
    reqs = [random_request(rng, i, cfg, prefixes) for i in range(40)]

    async def drive() -> None:
        pending = list(reqs)
        while pending or sched.has_work:
            for _ in range(int(rng.integers(0, 3))):
                if pending:
                    sched.add_request(pending.pop())
            await sched.run_once()

    asyncio.run(drive())
    assert all(r.finish_reason in ("stop", "length") for r in reqs)
    assert set(runner.shapes) <= warm
    assert max(s.num_tokens for s in runner.shapes) <= max(s.num_tokens for s in warm)
    assert len(set(runner.shapes)) > 3  # the traffic really spread over the buckets
    sched.check_integrity()
