"""Deterministic inference (EngineConfig.enable_deterministic_inference,
model/native_attention.py deterministic_attention) on the default model: a request's
logits are the same bits whatever else is in its step, wherever it sits in the packed
axis and whatever the step's token bucket (another compiled program), whether its
prompt comes in one step or in chunks, whether its prefix was computed by another
request (as after a radix-cache hit), and a decode token whatever its batch. With w8a16's
row-invariant int8 products (and W8A8's). The default mode depends on the packing, so
the comparison can fail."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig

N = 150  # the request's prompt


def _runner(model, quantization: str, deterministic: bool,
            kv_dtype: str = "float32") -> ModelRunner:
    return ModelRunner(model.cfg, model.params, RunnerConfig(
        num_slots=1024, max_batch_tokens=256, max_running=8, max_context=512,
        quantization=quantization, deterministic=deterministic, kv_dtype=kv_dtype))


def _logits(runner: ModelRunner, reqs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    return runner.all_logits(build_batch([RequestSlice(t, s) for t, s in reqs],
                                         runner.buckets))


# decode through the CPU handler (model/cpu_decode.py) where built, as by default; the
# XLA form it replaces: tests/model/test_native_attention.py (the same check at one layer)
# (the default form, w8a16 + a bfloat16 pool, and W8A8 with a float32 pool: the other
# products and the other pool dtype; suite time keeps it to two whole-model cases)
@pytest.mark.parametrize("quantization,kv_dtype", [
    ("w8a16_int8", "bfloat16"), ("w8a8_int8", "float32")])
def test_a_request_is_the_same_bits_in_any_batch(smollm2, quantization: str,
                                                 kv_dtype: str) -> None:
    rng = np.random.default_rng(0)
    p = rng.integers(3, 40000, N).astype(np.int32)
    other = rng.integers(3, 40000, 90).astype(np.int32)
    mine, theirs = np.arange(1, N + 2, dtype=np.int32), np.arange(400, 500, dtype=np.int32)
    det = _runner(smollm2, quantization, deterministic=True, kv_dtype=kv_dtype)
    alone = _logits(det, [(p, mine[:N])])  # [N, V]
    # behind another request, in a larger token bucket
    np.testing.assert_array_equal(_logits(det, [(other, theirs[:90]), (p, mine[:N])])[90:],
                                  alone)
    # in two chunks (the second reads the first's keys from the pool)
    first = _logits(det, [(p[:70], mine[:70])])
    second = _logits(det, [(other[:5], theirs[:5]), (p[70:], mine[:N])])[5:]
    np.testing.assert_array_equal(np.concatenate([first, second]), alone)
    # its prefix computed in another step, beside another request (a cache hit's KV)
    _logits(det, [(other, theirs[:90]), (p[:130], mine[:130])])
    np.testing.assert_array_equal(_logits(det, [(p[130:], mine[:N])]), alone[130:])
    # decode: its next token alone, then among other decodes in another decode program
    # (batch bucket), then in another place beside other requests
    nxt = np.array([7], np.int32)
    one = _logits(det, [(nxt, mine[:N + 1])])
    many = _logits(det, [(np.array([5], np.int32), theirs[:91]), (nxt, mine[:N + 1]),
                         (np.array([9], np.int32), np.arange(600, 609, dtype=np.int32))])
    again = _logits(det, [(nxt, mine[:N + 1]), (np.array([11], np.int32),  # more key blocks
                                                np.arange(700, 1000, dtype=np.int32))])
    np.testing.assert_array_equal(many[1:2], one)
    np.testing.assert_array_equal(again[:1], one)
    # among 8 decodes that share its first 140 keys (a radix-cache system prompt): the
    # step's shared prefix, its whole key blocks gathered once for all
    sharers = [(np.array([20 + i], np.int32),
                np.concatenate([mine[:140], np.arange(800 + 20 * i, 805 + 20 * i + i,
                                                      dtype=np.int32)])) for i in range(7)]
    shared = _logits(det, [*sharers[:3], (nxt, mine[:N + 1]), *sharers[3:]])
    np.testing.assert_array_equal(shared[3:4], one)
    if quantization == "w8a16_int8":  # the default mode moves (its prompts: the packed
        # axis' blocks)
        fast = _runner(smollm2, quantization, deterministic=False, kv_dtype=kv_dtype)
        a = _logits(fast, [(p, mine[:N])])
        b = _logits(fast, [(other, theirs[:90]), (p, mine[:N])])[90:]
        assert not np.array_equal(a, b)
        # the same model (a bfloat16 pool read in another order: 0.46 at most, measured)
        np.testing.assert_allclose(a, alone, rtol=0, atol=1.0)


def test_the_flag_reaches_the_runner_on_the_native_backend_only() -> None:
    from radixjax.engine.config import EngineConfig, EngineConfigError
    from radixjax.engine.engine import runner_config_for

    assert runner_config_for(EngineConfig(enable_deterministic_inference=True)).deterministic
    assert runner_config_for(EngineConfig()).deterministic  # the default on the CPU
    assert not runner_config_for(EngineConfig(enable_deterministic_inference=False)).deterministic
    with pytest.raises(EngineConfigError, match="native attention backend"):
        EngineConfig(enable_deterministic_inference=True, attention_backend="pallas")
    # MLA's attention has no deterministic form: asked for, a clear error (by default off)
    with pytest.raises(EngineConfigError, match="MLA"):
        runner_config_for(EngineConfig(enable_deterministic_inference=True), mla=True)
    assert not runner_config_for(EngineConfig(), mla=True).deterministic
