"""Data parallelism: the DP router's policies, and Engine(dp=2) against one engine
(greedy outputs equal, prefix affinity, accounting), with replicas on one device and on
their own devices (8 fake CPU devices, in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.engine.data_parallel import DataParallelEngine, device_slices
from radixjax.engine.dp_router import DPRouter
from radixjax.loaders import load_model
from tests.tiny_models import EIGHT_CPU_DEVICES_XLA_FLAGS, FAST_COMPILE

KW = dict(num_slots=1024, max_running=4, max_context=96, max_prefill_tokens=64, chunk_size=64,
          xla_options=FAST_COMPILE)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def test_router_policies() -> None:
    never = lambda: pytest.fail("cache hits asked for")  # noqa: E731
    rr = DPRouter("round_robin")
    assert [rr.pick([0, 0, 0], 10, never) for _ in range(4)] == [0, 1, 2, 0]
    assert DPRouter("shortest_queue").pick([3, 1, 2], 10, never) == 1
    aware = DPRouter("cache_aware", cache_threshold=0.5, balance_abs=4, balance_rel=1.5)
    assert aware.pick([2, 0, 1], 10, lambda: [0, 0, 8]) == 2  # the prefix is there
    assert aware.pick([2, 0, 1], 10, lambda: [0, 0, 3]) == 1  # too little of it: least load
    assert aware.pick([9, 0, 1], 10, never) == 1  # out of balance: least load, no lookup
    with pytest.raises(ValueError, match="policy"):
        DPRouter("random")


def test_device_slices() -> None:
    d = list(range(8))
    assert device_slices(2, 2, d) == [[0, 1], [2, 3]]
    assert device_slices(3, 1, [0]) == [[0], [0], [0]]  # one device: replicas share it


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir("llama"), load_tokenizer=False)


def prompts(seed: int, n: int, length: int, head: list[int] | None = None) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [(head or []) + rng.integers(3, 200, length).tolist() for _ in range(n)]


def test_dp2_equals_one_engine_and_keeps_prefixes_together(tiny) -> None:
    heads = prompts(1, 2, 40)
    batch = [p for h in heads for p in prompts(2, 3, 5, h)]  # two groups of three
    with Engine(params=tiny.params, model_config=tiny.cfg, **KW) as one:
        ref = [o.token_ids for o in one.generate(batch, GREEDY)]
    dp = Engine(params=tiny.params, model_config=tiny.cfg, dp=2, **KW)
    assert isinstance(dp, DataParallelEngine) and len(dp.replicas) == 2
    with dp:
        assert [o.token_ids for o in dp.generate(batch, GREEDY)] == ref
        # One at a time now: each group follows its prefix to the replica that has it.
        for h in heads:
            dp.generate(h + [7], GREEDY)
        outs = [dp.generate(p, GREEDY) for p in batch]
        assert [o.token_ids for o in outs] == ref
        assert all(o.cached_tokens >= 40 for o in outs)
        stats = dp.stats()
        assert stats["num_requests"] == 14 and stats["num_late_compiles"] == 0
        assert [r["num_routed"] for r in stats["replicas"]] == [7, 7]
        # the dashboard's data: each replica's own tree, each holding its group's prefix
        snap = dp.snapshot()
        assert [len(r["tree"]["nodes"]) > 0 for r in snap["replicas"]] == [True, True]
        assert all(max(n["tokens"] for n in r["tree"]["nodes"]) >= 40
                   for r in snap["replicas"])
        # unseeded samples on both replicas: every rid and every seed its own
        outs = dp.generate(batch, SamplingParams(max_new_tokens=1))
        assert len({o.rid for o in outs}) == len({o.seed for o in outs}) == len(batch)
        dp.check_integrity()


SLICED = """
import json, numpy as np
from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
m = load_model({folder!r}, load_tokenizer=False)
kw = dict(num_slots=512, max_running=2, max_context=64, max_prefill_tokens=32, chunk_size=32)
batch = [np.random.default_rng(i).integers(3, 200, 9).tolist() for i in range(4)]
sp = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
with Engine(params=m.params, model_config=m.cfg, warmup=False, **kw) as one:
    ref = [o.token_ids for o in one.generate(batch, sp)]
with Engine(params=m.params, model_config=m.cfg, dp=2, dp_policy="round_robin", warmup=False,
            **kw) as dp:
    got = [o.token_ids for o in dp.generate(batch, sp)]
    devices = [str(r.runner.kv[0].devices()) for r in dp.replicas]
print(json.dumps(dict(same=got == ref, devices=devices)))
"""


def test_replicas_run_on_their_own_devices(tiny_model_dir) -> None:
    env = dict(os.environ, XLA_FLAGS=EIGHT_CPU_DEVICES_XLA_FLAGS, JAX_PLATFORMS="cpu")
    code = SLICED.format(folder=str(tiny_model_dir("llama")))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["same"] and out["devices"][0] != out["devices"][1], out
