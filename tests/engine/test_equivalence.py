"""Greedy outputs are identical between the sequential cache-off reference and every
engine path: concurrent with the cache, tiny chunks, forced retraction, overlap off,
page size 16, mixed batches, each policy. KV accounting holds after each run. The shared
prompt prefixes are long enough (>= SHARED_PREFIX_MIN) for the native backend's
shared-prefix pass, and the tests check that steps used it."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
from radixjax.runtime import batch as batch_module
from radixjax.runtime.batch import SHARED_PREFIX_MIN
from tests.conftest import SMOLLM2_ENGINE
from tests.engine.helpers import assert_same_or_near_tie, sequential_reference
from tests.tiny_models import FAST_COMPILE

SP = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
BASE = dict(num_slots=2048, max_running=8, max_context=128, max_prefill_tokens=64,
            chunk_size=64, xla_options=FAST_COMPILE)

PATHS = {
    "cache+overlap": {},
    "overlap_off": dict(enable_overlap=False),
    "tiny_chunks": dict(chunk_size=4),
    "retract_every_3": dict(retract_every=3),
    # (no warm-up where the pool's shape is new: only the programs these steps use)
    "page_16": dict(page_size=16, warmup=False),
    "mixed": dict(enable_mixed=True),
    "dfs_weight": dict(policy="dfs-weight"),
    "fcfs": dict(policy="fcfs"),
    "tight_kv": dict(num_slots=200, warmup=False),  # real retraction and eviction pressure
}


@pytest.fixture
def shared_steps(monkeypatch) -> list[int]:
    """The longest shared prefix of each step of >= SHARED_PREFIX_MIN_BATCH requests the
    engines build (0: none; smaller steps never share); each step's lengths from the
    scheduler's PrefixMemo checked against comparing every slot."""
    seen: list[int] = []
    real = batch_module.shared_prefix_lens

    def spy(reqs, num_rows=None, memo=None):
        out = real(reqs, num_rows, memo)
        assert out.tolist() == real(reqs, num_rows).tolist()
        seen.append(int(out.max(initial=0)))
        return out

    monkeypatch.setattr(batch_module, "shared_prefix_lens", spy)
    return seen


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    m = load_model(tiny_model_dir("qwen3"), load_tokenizer=False)
    rng = np.random.default_rng(0)
    shared = list(rng.integers(3, 200, SHARED_PREFIX_MIN + 6))
    prompts = [list(rng.integers(3, 200, n)) for n in (5, 30, 17, 9)]
    prompts += [shared + list(rng.integers(3, 200, k)) for k in (3, 8, 12)]
    kw = dict(BASE, params=m.params, model_config=m.cfg)
    return m, prompts, kw, sequential_reference(kw, prompts, SP)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_tiny_model_paths_match_sequential(tiny, path: str, shared_steps) -> None:
    m, prompts, kw, ref = tiny
    shared_steps.clear()  # (the module's reference engine ran before)
    with Engine(**dict(kw, **PATHS[path])) as e:
        got = [o.token_ids for o in e.generate(prompts, SP)]
        e.check_integrity()
        stats = e.stats()
    assert_same_or_near_tie(got, ref, prompts, m.cfg, m.params)
    if path in ("retract_every_3", "tight_kv"):
        assert stats["num_retractions"] > 0
    if path != "fcfs" and path != "tight_kv":
        assert stats["cache_hit_rate"] > 0.2  # the shared 70-token prefix was reused
    assert max(shared_steps) >= SHARED_PREFIX_MIN, shared_steps


@pytest.fixture(scope="module")
def smol_prompts(smollm2):
    tok = smollm2.tokenizer
    system = "You are a terse assistant. Answer in one short sentence. " * 6
    questions = ["What is the capital of France?", "Name a primary colour.",
                 "What is 3 + 4?", "Say hello in Spanish."]
    return [tok.apply_chat_template([{"role": "system", "content": system},
                                     {"role": "user", "content": q}],
                                    add_generation_prompt=True, tokenize=False)
            for q in questions]


SMOL_PATHS = {
    "cache+overlap": {},
    "tiny_chunks": dict(chunk_size=16),
    "retract_every_2": dict(retract_every=2),
    "overlap_off": dict(enable_overlap=False),
    "page_16": dict(page_size=16, warmup=False),
}


def test_smollm2_paths_match_sequential(smollm2, smol_prompts, shared_steps) -> None:
    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    base = dict(SMOLLM2_ENGINE, chunk_size=256, params=smollm2.params,
                model_config=smollm2.cfg, tokenizer=smollm2.tokenizer)
    ids = [smollm2.tokenizer(p).input_ids for p in smol_prompts]
    ref = sequential_reference(base, ids, sp)
    for name, extra in SMOL_PATHS.items():
        shared_steps.clear()
        with Engine(**dict(base, **extra)) as e:
            got = [o.token_ids for o in e.generate(ids, sp)]
            e.check_integrity()
            if name == "cache+overlap":
                assert e.stats()["cache_hit_rate"] > 0.3, "the system prompt was not reused"
        assert_same_or_near_tie(got, ref, ids, smollm2.cfg, smollm2.params)
        assert max(shared_steps) >= SHARED_PREFIX_MIN, (name, shared_steps)


def test_mla_model_paths_match_sequential(tiny_model_dir, shared_steps) -> None:
    """DeepSeek-V3 (MLA latent pool, shared experts) through the engine: pages of 16,
    chunks of 8 tokens, a retraction every 2 decode steps, the radix cache and overlap,
    in one engine, against the sequential cache-off reference (same page size and
    buckets, so the two engines share their compiled programs)."""
    m = load_model(tiny_model_dir("deepseek_v3"), load_tokenizer=False)
    rng = np.random.default_rng(2)
    shared = list(rng.integers(3, 200, SHARED_PREFIX_MIN + 6))
    prompts = [list(rng.integers(3, 200, n)) for n in (4, 27, 12)]
    prompts += [shared + list(rng.integers(3, 200, k)) for k in (5, 9)]
    kw = dict(num_slots=1024, max_running=8, max_context=96, max_prefill_tokens=16,
              chunk_size=8, page_size=16, warmup=False, params=m.params, model_config=m.cfg,
              xla_options=FAST_COMPILE)
    ref = sequential_reference(kw, prompts, SP)
    shared_steps.clear()
    with Engine(**dict(kw, retract_every=2)) as e:
        got = [o.token_ids for o in e.generate(prompts, SP)]
        e.check_integrity()
        stats = e.stats()
    assert_same_or_near_tie(got, ref, prompts, m.cfg, m.params)
    assert stats["num_retractions"] > 0 and stats["cache_hit_rate"] > 0
    assert max(shared_steps) >= SHARED_PREFIX_MIN, shared_steps
