"""Prefill steps as the batch builder forms them (host only: no model, no device)."""

import types

from radixjax.engine.config import EngineConfig
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
from radixjax.runtime.batch import Buckets
from radixjax.sampling.params import SamplingParams


def test_a_chunked_prefill_takes_the_padding_of_its_step() -> None:
    """A step costs its token bucket: two 50-token prompts in chunks of 32 under a 64-token
    budget run as 32 | 18 + 46 (the bucket of 64 filled) | 4, not 32 | 18 + 32 | 18."""
    cfg = EngineConfig(num_slots=256, max_running=4, max_context=128, max_prefill_tokens=64,
                       chunk_size=32)
    runner = types.SimpleNamespace(buckets=Buckets.default(cfg.max_step_tokens, 4))
    s = Scheduler(runner, cfg, eos_token_ids=(0,))
    a, b = (Req(n, list(range(k, k + 50)), SamplingParams(), seed=0)
            for n, k in (("a", 3), ("b", 100)))
    s.add_request(a)
    s.add_request(b)
    steps = []
    for _ in range(3):
        batch = s.schedule()
        steps.append([(r.rid, n) for r, n in zip(batch.reqs, batch.num_new, strict=True)])
        assert batch.host.shape.num_tokens == runner.buckets.shape_of(  # no padding
            sum(batch.num_new)).num_tokens
    assert steps == [[("a", 32)], [("a", 18), ("b", 46)], [("b", 4)]]
    assert a.num_computed == b.num_computed == 50
