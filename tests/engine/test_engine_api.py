"""The public API: in-memory vs disk models, cached_tokens, n > 1, stop conditions,
streaming and abort, typed errors (and the engine keeps serving after them)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.engine.engine import runner_config_for
from radixjax.engine.errors import EngineError, RequestError
from radixjax.loaders import load_model
from radixjax.sampling.params import SamplingParamsError
from tests.tiny_models import FAST_COMPILE

KW = dict(num_slots=1024, max_running=4, max_context=96, max_prefill_tokens=64, chunk_size=64,
          xla_options=FAST_COMPILE)
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    folder = tiny_model_dir("llama")
    return folder, load_model(folder, load_tokenizer=False)


@pytest.fixture(scope="module")
def engine(tiny):
    _, m = tiny
    with Engine(params=m.params, model_config=m.cfg, **KW) as e:
        yield e
        assert e.stats()["num_late_compiles"] == 0  # every step was a warm program


def prompt(seed: int, n: int) -> list[int]:
    return list(np.random.default_rng(seed).integers(3, 200, n))


def test_unseeded_sampling_differs_from_start_to_start(tiny, engine) -> None:
    """A request without a seed gets one from the engine's start-up seed, drawn from the
    OS: a restarted engine answers differently (SGLang's --random-seed absent); the
    output says which seed it used, which reproduces it; a given engine seed repeats."""
    _, m = tiny
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)
    p = prompt(5, 9)
    first = engine.generate(p, sp)
    with Engine(params=m.params, model_config=m.cfg, warmup=False, **KW) as restarted:
        again = restarted.generate(p, sp)
        assert again.seed != first.seed and again.token_ids != first.token_ids
        assert again.rid != first.rid
        seeded = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True,
                                seed=first.seed)
        assert restarted.generate(p, seeded).token_ids == first.token_ids
    runs = []
    for _ in range(2):
        with Engine(params=m.params, model_config=m.cfg, seed=1234, warmup=False,
                    **KW) as fixed:
            runs.append(fixed.generate(p, sp).token_ids)
    assert runs[0] == runs[1]


def test_in_memory_model_equals_disk_model(tiny, engine) -> None:
    folder, _ = tiny
    prompts = [prompt(1, 7), prompt(2, 19)]
    with Engine(folder, **KW) as disk:
        ref = [o.token_ids for o in disk.generate(prompts, GREEDY)]
    # an edited in-memory model is served as is, with no export step
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == ref
    engine.check_integrity()


def test_cached_tokens_is_what_the_tree_supplied(engine) -> None:
    engine.flush_cache()
    base = prompt(3, 30)
    first = engine.generate(base + [5, 6], GREEDY)
    assert first.cached_tokens == 0
    second = engine.generate(base + [7, 8, 9], GREEDY)
    assert second.cached_tokens == 30  # the shared prefix, down to the token
    again = engine.generate(base + [5, 6], GREEDY)
    assert again.cached_tokens == 31  # all but the last prompt token (it must be computed)
    assert again.token_ids == first.token_ids
    engine.check_integrity()


def test_n_samples_share_the_prompt_and_differ(engine) -> None:
    engine.flush_cache()
    p = prompt(4, 40)
    outs = engine.generate(p, SamplingParams(max_new_tokens=8, temperature=1.0, seed=11,
                                             ignore_eos=True), n=3)
    assert len(outs) == 3
    assert sorted(o.cached_tokens for o in outs) == [0, 39, 39]
    assert len({tuple(o.token_ids) for o in outs}) > 1
    # the same seed reproduces the same three samples
    again = engine.generate(p, SamplingParams(max_new_tokens=8, temperature=1.0, seed=11,
                                              ignore_eos=True), n=3)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]
    engine.check_integrity()


def test_stop_token_and_max_tokens(engine) -> None:
    p = prompt(5, 10)
    full = engine.generate(p, GREEDY)
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    stop_at = full.token_ids[3]
    k = full.token_ids.index(stop_at)
    out = engine.generate(p, SamplingParams(max_new_tokens=8, temperature=0.0,
                                            stop_token_ids=(stop_at,), ignore_eos=True))
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[: k + 1]
    engine.check_integrity()


def test_stream_matches_generate_and_early_exit_aborts(engine) -> None:
    p = prompt(6, 12)
    ref = engine.generate(p, GREEDY)

    async def collect(limit: int | None) -> list:
        chunks = []
        async for c in engine.generate_stream(p, GREEDY):
            chunks.append(c)
            if limit is not None and len(chunks) >= limit:
                break
        return chunks

    chunks = asyncio.run(collect(None))
    assert [t for c in chunks for t in c.token_ids] == ref.token_ids
    assert chunks[-1].finish_reason == "length" and chunks[-1].output is not None
    asyncio.run(collect(2))  # leaving early aborts the request
    for _ in range(200):  # the abort reaches the scheduler's loop soon after
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0:
            break
        time.sleep(0.05)
    engine.check_integrity()
    assert engine.stats()["num_aborted"] >= 1


@pytest.mark.parametrize("bad,exc", [
    ([], RequestError),
    (list(range(3, 100)), RequestError),  # longer than the 96-token context
    ([3, 4, 10_000], RequestError),  # token id outside the vocab
    ([-1, 4], RequestError),
])
def test_bad_prompts_raise_and_engine_keeps_serving(engine, bad, exc) -> None:
    with pytest.raises(exc):
        engine.generate(bad, GREEDY)
    assert len(engine.generate(prompt(7, 5), GREEDY).token_ids) == 8
    engine.check_integrity()


def test_bad_sampling_and_config_raise(engine) -> None:
    with pytest.raises(SamplingParamsError):
        engine.generate(prompt(8, 5), {"temperature": -2.0})
    with pytest.raises(SamplingParamsError):
        engine.generate(prompt(8, 5), {"top_p": 0})
    with pytest.raises(RequestError):
        engine.generate(prompt(8, 5), GREEDY, n=0)
    with pytest.raises(EngineConfigError):
        Engine(params={}, model_config=None, policy="random")
    with pytest.raises(EngineConfigError, match="kv_cache_dtype"):
        Engine(params={}, model_config=None, kv_cache_dtype="fp8_e5m2")
    # the KV dtype: bf16 beside int8 products, else the weights' unless given
    assert runner_config_for(EngineConfig(dtype="bfloat16")).kv_dtype == "bfloat16"
    assert runner_config_for(EngineConfig(kv_cache_dtype="bfloat16",
                                          quantization="none")).kv_dtype == "bfloat16"
    assert runner_config_for(EngineConfig(quantization="none")).kv_dtype == "float32"
    assert runner_config_for(EngineConfig()).kv_dtype == "bfloat16"
    with pytest.raises(RequestError):
        engine.generate("text needs a tokenizer", GREEDY)


def test_a_failed_step_fails_its_requests_and_the_engine_recovers(engine) -> None:
    """A step that raises (the test hook): every request the engine held gets EngineError
    (generate raises it, a stream raises it), the engine starts over with empty, checked
    KV accounting, and serves the same greedy answer as before the fault."""
    long = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    before = engine.generate(prompt(9, 12), GREEDY).token_ids
    failures = engine.stats()["num_failures"]

    async def stream_then_fault() -> list[int]:
        got: list[int] = []
        async for chunk in engine.generate_stream(prompt(10, 5), long):
            got += chunk.token_ids
            if len(got) == 3:
                engine.inject_fault()
        return got

    with pytest.raises(EngineError, match="injected fault"):
        asyncio.run(stream_then_fault())
    assert engine.stats()["num_failures"] == failures + 1
    assert engine.healthy
    engine.check_integrity()  # idle and nothing held: the accounting was reset
    engine.inject_fault()
    with pytest.raises(EngineError, match="injected fault"):
        engine.generate([prompt(11, 6), prompt(12, 30)], long)  # batch: both fail
    assert engine.generate(prompt(9, 12), GREEDY).token_ids == before
    engine.check_integrity()


def test_max_new_tokens_is_clamped_to_the_context(engine) -> None:
    """As SGLang and vLLM: a huge max_new_tokens runs to the context, and it reserves no
    more KV at admission than the context allows (others are still admitted)."""
    huge = SamplingParams(max_new_tokens=10**9, temperature=0.0, ignore_eos=True)
    outs = engine.generate([prompt(13, 20), prompt(14, 5)], [huge, GREEDY])
    assert outs[0].finish_reason == "length"
    assert outs[0].completion_tokens == KW["max_context"] - 20
    assert outs[1].stats.admitted < outs[0].stats.finished  # ran alongside, not after
    engine.check_integrity()


def test_an_abort_before_the_request_is_added_is_remembered(engine) -> None:
    req = engine._make_req(prompt(15, 5), GREEDY, 0)
    seen: list = []
    req.on_chunk = seen.append
    engine._call(lambda: engine.scheduler.abort(req))
    engine._call(lambda: engine.scheduler.add_request(req))
    assert [(c.finish_reason, c.token_ids) for c in seen] == [("abort", ())]
    assert seen[0].output.completion_tokens == 0
    engine.check_integrity()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_prompt_logprobs_equal_full_logits_across_chunks_and_cache(tiny, engine) -> None:
    """Scored prompt positions (chunked prefill of 64 + 16, part of the prompt cached by
    an earlier request) equal log-softmax of the logits path over the whole prompt (in
    the engine's form: the default's w8a16 products, bf16 KV, deterministic attention)."""
    from radixjax.runtime.batch import RequestSlice, build_batch
    from tests.model.harness import tiny_runner

    _, m = tiny
    ids = prompt(11, 80)
    form = engine.runner.config
    runner = tiny_runner(m.cfg, m.params, num_slots=128, max_batch_tokens=128,
                         max_context=96, quantization=form.quantization,
                         kv_dtype=form.kv_dtype, deterministic=form.deterministic)
    logits = runner.all_logits(build_batch(
        [RequestSlice(np.array(ids, np.int32), np.arange(1, 81, dtype=np.int32))],
        runner.buckets))
    ref = _log_softmax(logits)[:-1][np.arange(79), ids[1:]]  # log p(ids[p] | ids[:p])
    engine.generate(ids[:70], GREEDY)  # caches 70 tokens: scoring must recompute some
    for start in (0, 10, 75):
        sp = SamplingParams(max_new_tokens=0, temperature=0.0, logprob_start_len=start,
                            top_logprobs=3)
        out = engine.generate(ids, sp)
        assert out.completion_tokens == 0 and out.token_ids == []
        assert out.finish_reason == "length"
        assert out.cached_tokens <= max(start - 1, 0)
        got = out.prompt_logprobs
        assert len(got) == 80 - start
        if start == 0:
            assert got[0] is None and out.prompt_top_logprobs[0] is None
            got = got[1:]
        np.testing.assert_allclose(got, ref[max(start, 1) - 1:], rtol=1e-4, atol=1e-4)
        top = out.prompt_top_logprobs[-1]
        assert [t for t, _ in top] == list(np.argsort(-logits[-2])[:3])
    engine.check_integrity()


def test_max_new_tokens_zero_caches_the_prompt(engine) -> None:
    engine.flush_cache()
    ids = prompt(12, 40)
    out = engine.generate(ids, SamplingParams(max_new_tokens=0))
    assert (out.completion_tokens, out.finish_reason, out.prompt_logprobs) == (0, "length", [])
    assert engine.generate(ids + [7, 8], GREEDY).cached_tokens == 40
    with pytest.raises(RequestError, match="logprob_start_len"):
        engine.generate(ids, SamplingParams(logprob_start_len=40))
    engine.check_integrity()


def test_snapshot_shows_the_shared_node_the_requests_and_the_pool(engine) -> None:
    """Engine.snapshot (what /dashboard draws), taken while requests run: the prefix they
    share is one node they all run through, the running requests are listed, the pool's
    numbers add up and agree with stats(); bounded to the largest nodes."""
    shared = prompt(40, 24)
    engine.generate(shared + [7], GREEDY)  # caches the shared prefix
    sp = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    outs: list = []
    t = threading.Thread(target=lambda: outs.extend(
        engine.generate([shared + prompt(41 + i, 5) for i in range(3)], sp)))
    t.start()
    seen = None
    while t.is_alive() and seen is None:
        snap = engine.snapshot()
        if len(snap["running"]) == 3:
            seen = snap
        time.sleep(0.002)
    t.join()
    assert seen is not None, "never saw the three requests running"
    rids = {r["rid"] for r in seen["running"]}
    node = next(n for n in seen["tree"]["nodes"] if set(n["requests"]) == rids)
    assert node["tokens"] == 24 and node["lock_ref"] == 3 and not node["evictable"]
    assert node["text"].startswith(" ".join(map(str, shared[:8])))  # (no tokenizer: ids)
    assert all(r["cached_tokens"] == 24 and r["prompt_tokens"] == 29 for r in seen["running"])
    pool = seen["pool"]
    assert pool["free"] + pool["evictable"] + pool["protected"] + pool["held"] == pool["usable"]
    used = pool["usable"] - pool["free"] - pool["evictable"]
    assert seen["stats"]["kv_usage"] == pytest.approx(used / pool["usable"])
    assert seen["programs"]["late_compiles"] == 0
    after = engine.snapshot(max_nodes=1)
    assert after["running"] == [] and after["tree"]["shown_nodes"] == 1
    assert after["tree"]["nodes"][0]["parent"] is None  # the largest: a top node
