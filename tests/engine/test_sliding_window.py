"""A sliding-window model through the engine (tiny Gemma 3: window 7 on layers 0 and 2,
layer 1 global), its window layers' KV in a pool of their own (cache/window_kv.py):
prompts and answers far past the window, a radix-cache hit whose cached prefix is longer
than the window (its early keys serve the global layer only), chunked prefill that
splits prompts inside and across windows, forced retraction (a request re-prefilled from
its cached prefix), and enough traffic that the tree's window KV is reclaimed: greedy
outputs equal plain sequential generation with one pool, and KV accounting (both pools,
the pins) holds."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
from tests.engine.helpers import assert_same_or_near_tie, sequential_reference
from tests.tiny_models import FAST_COMPILE

SP = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
BASE = dict(num_slots=1024, max_running=4, max_context=96, max_prefill_tokens=32,
            chunk_size=32, xla_options=FAST_COMPILE, warmup=False)
# one engine with every path at once (suite time): the cache, overlap, chunks of 5
# tokens, a retraction every 3 decode steps
PATH = dict(chunk_size=5, retract_every=3)


@pytest.fixture(scope="module")
def gemma3(tiny_model_dir):
    m = load_model(tiny_model_dir("gemma3"), load_tokenizer=False)
    assert m.cfg.sliding_windows == (7, None, 7)
    rng = np.random.default_rng(5)
    shared = list(rng.integers(3, 200, 23))  # a cached prefix 3x the window
    prompts = [list(rng.integers(3, 200, n)) for n in (4, 19, 40)]
    prompts += [shared + list(rng.integers(3, 200, k)) for k in (2, 9)]
    prompts += [list(rng.integers(3, 200, 40)) for _ in range(12)]  # window pool traffic
    prompts += [prompts[4]]  # the shared prefix again, after that traffic
    kw = dict(BASE, params=m.params, model_config=m.cfg)
    # the reference: one pool, every position's KV in every layer
    ref = sequential_reference(dict(kw, disable_hybrid_swa_memory=True), prompts, SP)
    return m, prompts, kw, ref


def test_window_pool_paths_match_sequential(gemma3) -> None:
    m, prompts, kw, ref = gemma3
    # a window pool of a quarter of the slots (256): the first prompts fit it whole
    with Engine(**dict(kw, **PATH, swa_full_tokens_ratio=0.25)) as e:
        assert e.runner.config.window_slots == 256
        window = e.scheduler.kvm.window
        # the shared-prefix prompts second: the first of them is cached by then
        outs = e.generate(prompts[:4], SP) + e.generate(prompts[4:5], SP)
        e.check_integrity()
        assert outs[-1].cached_tokens >= 23  # the hit reaches past the window
        assert window.num_reclaimed == 0
        outs += e.generate(prompts[5:17], SP)
        e.check_integrity()
        assert window.num_reclaimed > 0  # the tree gave window KV up (LRU), kept going
        outs += e.generate(prompts[17:], SP)
        e.check_integrity()
        stats = e.stats()
    assert_same_or_near_tie([o.token_ids for o in outs], ref, prompts, m.cfg, m.params)
    assert stats["num_retractions"] > 0
