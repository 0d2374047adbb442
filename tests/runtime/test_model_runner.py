"""ModelRunner: sampled path vs logits path, dummy-slot padding, warm-up and the
late-compile counter, the persistent compile cache (written by a process, not by one
marked read-only)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.loaders import load_model
from radixjax.runtime.batch import PromptScores, RequestSlice, build_batch
from radixjax.runtime.model_runner import StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams
from tests.model.harness import ScatteredSlots, rel_err, tiny_runner


def _greedy(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0)] * n


def test_step_tokens_are_argmax_of_logits_and_padding_only_hits_dummy(tiny_model_dir) -> None:
    m = load_model(tiny_model_dir("qwen2"), load_tokenizer=False)
    runner = tiny_runner(m.cfg, m.params, num_slots=128)
    rng = np.random.default_rng(0)
    slots = ScatteredSlots(128, seed=2)
    reqs = [RequestSlice(rng.integers(3, 200, n).astype(np.int32), slots.take(n))
            for n in (3, 9, 6)]
    used = np.concatenate([r.kv_slots for r in reqs])
    reference = tiny_runner(m.cfg, m.params, num_slots=128)
    logits = reference.all_logits(build_batch(reqs, runner.buckets))
    last = np.cumsum([len(r.new_tokens) for r in reqs]) - 1
    batch = build_batch(reqs, runner.buckets)
    assert batch.shape.num_tokens == 32 and batch.shape.num_reqs == 4  # real padding
    out = runner.step(batch, SamplingArrays.build(_greedy(3), [0] * 3, 4), StepOptions(
        return_logprobs=True))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:3], logits[last].argmax(-1))
    np.testing.assert_array_equal(np.asarray(out.sample.top_ids)[:3, 0],
                                  logits[last].argmax(-1))
    # Prompt logprobs from the same step program: scattered tokens in two score blocks.
    scored = np.array([0, 1, 7, 17]), rng.integers(0, m.cfg.vocab_size, 4)
    scores = PromptScores.none(32)
    scores.mask[scored[0]], scores.next_ids[scored[0]] = True, scored[1]
    out = runner.step(batch._replace(scores=scores), SamplingArrays.build(
        _greedy(3), [0] * 3, 4), StepOptions(prompt_logprobs=True, return_logprobs=True))
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out.prompt.logprobs)[scored[0]],
                               logp[scored[0], scored[1]], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(out.prompt.top_ids)[scored[0], 0],
                                  logits[scored[0]].argmax(-1))
    # In every layer's rows of the pool, every slot is still zero except the request's
    # slots and the dummy slot 0.
    k = np.asarray(runner.kv[0])
    for layer in k.reshape(m.cfg.num_layers, runner.config.num_slots, *k.shape[1:]):
        written = set(np.flatnonzero(np.abs(layer).sum(axis=(1, 2)) > 0).tolist())
        assert written - {0} == set(used.tolist())
        assert 0 in written  # the padded tokens went to the dummy slot


def test_bfloat16_kv_pool_stays_close_and_is_never_upcast(tiny_model_dir) -> None:
    """kv_dtype bfloat16 on the native backend: the pool holds bf16 bits (uint16), the
    logits of a prefill and an extend over it stay close to a float32 pool's, and the
    step program holds no float copy of the pool (XLA's CPU gather and scatter upcast a
    bf16 operand whole: every layer of every step)."""
    m = load_model(tiny_model_dir("qwen2"), load_tokenizer=False)
    rng = np.random.default_rng(5)
    slots = ScatteredSlots(128, seed=3).take(30)
    ids = rng.integers(3, 200, 30).astype(np.int32)
    logits = []
    for kv_dtype in ("float32", "bfloat16"):
        runner = tiny_runner(m.cfg, m.params, num_slots=331, kv_dtype=kv_dtype)
        runner.all_logits(build_batch([RequestSlice(ids[:20], slots[:20])], runner.buckets))
        logits.append(runner.all_logits(build_batch([RequestSlice(ids[20:], slots)],
                                                    runner.buckets)))  # reads the pool
    assert runner.kv[0].dtype == jnp.uint16
    err = rel_err(logits[1], logits[0])
    assert 1e-5 < err < 5e-2  # really rounded, and still close
    rows = runner.kv[0].shape[0]  # (an odd size no other array has)
    program = runner.programs.get(runner.buckets.shapes[0]).as_text()
    assert not re.search(rf"\b(f32|bf16)\[{rows},", program)
    # a step's host inputs packed otherwise than its program's are refused
    other = runner.buckets.shapes[1]
    _, packing = runner._example_args(other)
    with pytest.raises(ValueError, match="not packed as"):
        runner.programs.get(runner.buckets.shapes[0], packing)
    assert runner.programs.get(other, packing) is not None


def test_one_program_per_token_bucket_serves_every_option_and_context(tiny_model_dir) -> None:
    """Warm-up compiles exactly the token buckets; then sampling, logprobs, penalties, a
    grammar mask and any context length (prefill, extend, decode) compile nothing."""
    m = load_model(tiny_model_dir("llama"), load_tokenizer=False)
    runner = tiny_runner(m.cfg, m.params, max_batch_tokens=16, max_running=2,
                         max_context=600, num_slots=1024)
    runner.warmup(progress=False)
    assert runner.is_warm and runner.num_programs == len(runner.buckets.tokens) == 5
    def sp(batch):
        return SamplingArrays.build([SamplingParams(temperature=1.0, frequency_penalty=0.5)],
                                    [0], batch.shape.num_reqs)

    width = (m.cfg.vocab_size + 31) // 32
    for kv in (1, 19, 300, 599):  # decodes at any depth: the shape is T = 1
        req = RequestSlice(np.array([5], np.int32), np.arange(1, kv + 1, dtype=np.int32))
        for opts in (StepOptions(), StepOptions(True, True, True, True, False)):
            mask = np.full((1, width), -1, np.int32) if opts.use_grammar else None
            batch = build_batch([req], runner.buckets)
            runner.step(batch, sp(batch), opts, mask)
    prefill = RequestSlice(np.arange(3, 19, dtype=np.int32), np.arange(1, 400, dtype=np.int32)
                           [-16:])
    batch = build_batch([prefill], runner.buckets)
    runner.step(batch, sp(batch), StepOptions(do_sample=True))
    scores = PromptScores(np.arange(16, dtype=np.int32), np.arange(16) % 3 == 0)
    runner.step(batch._replace(scores=scores), sp(batch), StepOptions(prompt_logprobs=True))
    jax.block_until_ready(runner.kv)
    assert runner.num_late_compiles == 0 and runner.num_programs == 5
    # A second runner of the same model and config gets the same programs and the same
    # tokens.
    again = tiny_runner(m.cfg, m.params, max_batch_tokens=16, max_running=2,
                        max_context=600, num_slots=1024)
    again.warmup(progress=False)
    assert again.num_programs == 5
    out = again.step(batch, sp(batch), StepOptions())
    ref = runner.step(batch, sp(batch), StepOptions())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


_WRITE_ONE = """
import os, sys, jax, numpy as np
from radixjax.runtime.compile_cache import READ_ONLY_PID_VAR, enable_persistent_cache
if sys.argv[1] == "read-only":
    os.environ[READ_ONLY_PID_VAR] = str(os.getpid())
enable_persistent_cache()
jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(7.0)).block_until_ready()
"""


@pytest.mark.parametrize("mode", ["writes", "read-only"])
def test_persistent_compile_cache_is_written(mode: str, tmp_path) -> None:
    """A process writes what it compiles to the cache folder, except the one named
    read-only (the test workers; the processes they start write)."""
    env = dict(os.environ, RADIXJAX_JAX_CACHE=str(tmp_path), JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", _WRITE_ONE, mode], env=env, check=True,
                   timeout=120)
    entries = [f for f in os.listdir(tmp_path) if f.endswith("-cache")]
    assert (len(entries) > 0) == (mode == "writes"), entries


def test_cleared_programs_give_their_memory_maps_back(tiny_model_dir) -> None:
    """clear_compiled_programs (the suite calls it when a worker's memory maps near the
    kernel's vm.max_map_count): once no runner holds a program, its JIT mappings go."""
    import gc

    from radixjax.runtime.model_runner import clear_compiled_programs
    from tests.conftest import _num_maps

    m = load_model(tiny_model_dir("llama"), load_tokenizer=False)
    before = _num_maps()
    runner = tiny_runner(m.cfg, m.params, num_slots=136)  # (a pool no other test has)
    batch = build_batch([RequestSlice(np.arange(1, 6, dtype=np.int32),
                                      np.arange(1, 6, dtype=np.int32))], runner.buckets)
    runner.step(batch, SamplingArrays.build(_greedy(1), [0], batch.shape.num_reqs),
                StepOptions()).tokens.block_until_ready()
    grown = _num_maps()
    assert grown > before + 50  # the program's JIT-linked sections
    del runner
    clear_compiled_programs()
    gc.collect()
    assert _num_maps() < grown - 50
