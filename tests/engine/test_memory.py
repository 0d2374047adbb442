"""The context and the KV pool when the user gives neither (engine/memory.py): the model's
own context, a pool with room for it (at least MIN_POOL tokens) cut to
mem_fraction_static of the available memory, the context cut with it; what the user gives
stays. An engine started without them serves the model's context."""

from __future__ import annotations

import logging

import pytest

from radixjax import Engine
from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.engine.memory import MIN_POOL, available_bytes, sized
from radixjax.model.config import ModelConfig

GB = 1 << 30


def _model(context: int) -> ModelConfig:
    return ModelConfig("llama", 1000, 64, 128, 2, 4, 2, 16, max_position_embeddings=context)


def test_the_models_context_and_a_pool_that_holds_it() -> None:
    c = sized(EngineConfig(), _model(32768), 28672, 20 * GB)  # Qwen2.5-1.5B's bf16 KV
    assert (c.max_context, c.num_slots) == (32768, 32769)
    c = sized(EngineConfig(page_size=16), _model(32768), 28672, 20 * GB)
    assert (c.max_context, c.num_slots) == (32768, 32784)
    c = sized(EngineConfig(), _model(2048), 1024, 20 * GB)  # a short context: MIN_POOL
    assert (c.max_context, c.num_slots) == (2048, MIN_POOL)


def test_a_pool_past_the_memory_fraction_is_cut_and_the_context_with_it(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        c = sized(EngineConfig(mem_fraction_static=0.5), _model(32768), 28672, GB)
    fit = (GB // 2) // 28672  # 18724 tokens
    assert (c.num_slots, c.max_context) == (fit, fit - 1)
    assert "mem_fraction_static" in caplog.text and "cut to the KV pool" in caplog.text


def test_what_the_user_gives_stays() -> None:
    c = sized(EngineConfig(num_slots=4096, max_context=512), _model(32768), 28672, GB // 64)
    assert (c.num_slots, c.max_context) == (4096, 512)
    c = sized(EngineConfig(max_context=100000), _model(32768), 28672, 20 * GB)
    assert (c.num_slots, c.max_context) == (100001, 100000)
    with pytest.raises(EngineConfigError, match="mem_fraction_static"):
        EngineConfig(mem_fraction_static=0.0)


def test_available_memory_is_read() -> None:
    assert GB // 8 < available_bytes() < 1 << 50


def test_an_engine_started_without_them_serves_the_models_context(tiny_model_dir) -> None:
    from radixjax.loaders import load_model

    m = load_model(tiny_model_dir("llama"))
    with Engine(params=m.params, model_config=m.cfg, tokenizer=m.tokenizer,
                warmup=False) as e:
        assert e.config.max_context == m.cfg.max_position_embeddings == 256
        assert e.config.num_slots == MIN_POOL
        assert e.runner.config.max_context == 256
