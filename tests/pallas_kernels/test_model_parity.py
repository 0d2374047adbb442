"""Whole-model logits with the pallas backend (interpret mode on CPU) equal the native
backend's, through a prefill step and then a mixed extend + decode step on the cached KV;
and the engine with page size 16 on the pallas backend generates what the native engine
does with page size 1."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.cache.allocator import KVSlotAllocator
from radixjax.loaders import load_model
from radixjax.model.config import ModelConfig
from radixjax.model.params import init_params
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import rel_err, tiny_runner
from tests.tiny_models import FAST_COMPILE


class ScatteredPages:
    """Page-aligned slots for P > 1, pages handed out in a random order."""

    def __init__(self, num_slots: int, page_size: int, seed: int) -> None:
        self._alloc = KVSlotAllocator(num_slots, page_size)
        pages = np.random.default_rng(seed).permutation(np.arange(1, num_slots // page_size))
        self._pages = list(pages)
        self.page_size = page_size

    def take(self, n: int) -> np.ndarray:
        k = -(-n // self.page_size)
        pages, self._pages = np.array(self._pages[:k]), self._pages[k:]
        return self._alloc.pages_to_slots(pages).astype(np.int32)


def _model(name: str, tiny_model_dir):
    """(cfg, params) with head_dim >= 16, so the same test also runs compiled on a GPU."""
    if name == "llama3":  # HF tiny llama3: GQA 2, head_dim 16, llama3 RoPE scaling
        m = load_model(tiny_model_dir("llama3"), load_tokenizer=False)
        return m.cfg, m.params
    # Mistral-like: GQA 8, a sliding window of 7 on the first layer, random weights at
    # ~0.15 scale (sharper attention than init_params' 0.02).
    cfg = ModelConfig(model_type="mistral", vocab_size=256, hidden_size=128,
                      intermediate_size=192, num_layers=2, num_heads=8, num_kv_heads=1,
                      head_dim=16, sliding_windows=(7, None))
    params = init_params(cfg, jax.random.key(0))
    return cfg, jax.tree.map(lambda a: a * 7.5 if a.ndim >= 2 else a, params)


@pytest.mark.parametrize(("model", "page_size"), [("mistral", 16), ("llama3", 1)])
def test_logits_match_native(tiny_model_dir, model: str, page_size: int) -> None:
    cfg, params = _model(model, tiny_model_dir)
    kw = dict(num_slots=512, max_batch_tokens=64, max_running=4, max_context=64,
              page_size=page_size)
    native = tiny_runner(cfg, params, attention_backend="native", **kw)
    pallas = tiny_runner(cfg, params, attention_backend="pallas", **kw)
    rng = np.random.default_rng(1)
    pages = ScatteredPages(512, 16 if page_size == 16 else 1, seed=2)
    lens = [1, 15, 17]  # prompt lengths: 1, and page boundary -1 / +1
    slots = [pages.take(n + 8) for n in lens]  # room for the second step
    prompts = [rng.integers(3, 200, n).astype(np.int32) for n in lens]

    first = [RequestSlice(p, s[: len(p)]) for p, s in zip(prompts, slots, strict=True)]
    new = [rng.integers(3, 200, q).astype(np.int32) for q in (1, 4, 1)]  # decode/extend
    second = [RequestSlice(t, s[: n + len(t)])
              for t, s, n in zip(new, slots, lens, strict=True)]
    for step in (first, second):
        batch = build_batch(step, native.buckets)
        ref = native.all_logits(batch)
        ours = pallas.all_logits(batch)
        assert np.isfinite(ours).all()
        assert rel_err(ours, ref) < 1e-5


def test_engine_page_16_pallas_generates_like_native(tiny_model_dir) -> None:
    """Through the scheduler: chunked prefill (extends on a cached prefix), radix-cache
    reuse of a shared 20-token prefix (page-aligned matches), overlap, decode."""
    m = load_model(tiny_model_dir("qwen3"), load_tokenizer=False)
    rng = np.random.default_rng(3)
    shared = list(rng.integers(3, 200, 20))
    prompts = [list(rng.integers(3, 200, n)) for n in (15, 17, 4)]
    prompts += [shared + list(rng.integers(3, 200, n)) for n in (1, 9)]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    # warmup=False: only the programs these steps use (warm-up is tested elsewhere)
    kw = dict(params=m.params, model_config=m.cfg, num_slots=512, max_running=4,
              max_context=64, max_prefill_tokens=16, chunk_size=8, warmup=False,
              xla_options=FAST_COMPILE)
    def run(e: Engine) -> tuple[list[list[int]], int]:
        outs = e.generate(prompts[:4], sp) + e.generate(prompts[4:], sp)  # last one: a hit
        e.check_integrity()
        return [o.token_ids for o in outs], outs[-1].cached_tokens

    with Engine(**kw, attention_backend="native", page_size=1) as e:
        ref, ref_cached = run(e)
    with Engine(**kw, attention_backend="pallas", page_size=16) as e:
        assert e.runner.attention_backend == "pallas" and e.runner.config.page_size == 16
        got, cached = run(e)
    assert got == ref
    assert (ref_cached, cached) == (20, 16)  # the shared prefix; whole pages only at P = 16
