"""A sliding-window model through the engine (tiny Gemma 3: window 7 on layers 0 and 2,
layer 1 global): prompts and answers far past the window, a radix-cache hit whose cached
prefix is longer than the window (its early keys serve the global layer only), chunked
prefill that splits prompts inside and across windows, and forced retraction (a request
re-prefilled from its cached prefix): greedy outputs equal plain sequential generation,
and KV accounting holds."""

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
    kw = dict(BASE, params=m.params, model_config=m.cfg)
    return m, prompts, kw, sequential_reference(kw, prompts, SP)


def test_window_model_paths_match_sequential(gemma3) -> None:
    m, prompts, kw, ref = gemma3
    with Engine(**dict(kw, **PATH)) as e:
        # the shared-prefix prompts second: the first of them is cached by then
        outs = e.generate(prompts[:4], SP) + e.generate(prompts[4:], SP)
        e.check_integrity()
        stats = e.stats()
    assert_same_or_near_tie([o.token_ids for o in outs], ref, prompts, m.cfg, m.params)
    assert outs[-1].cached_tokens >= 23  # the hit reaches past the window
    assert stats["num_retractions"] > 0
