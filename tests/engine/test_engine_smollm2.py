"""Text in, text out with the default model: chat prompts, stop strings, streamed text
equal to the batch result, and the one-shot `radixjax.generate`."""

from __future__ import annotations

import asyncio

import pytest

import radixjax
from radixjax import Engine, SamplingParams
from tests.conftest import SMOLLM2_ENGINE


@pytest.fixture(scope="module")
def engine(smollm2):
    with Engine(params=smollm2.params, model_config=smollm2.cfg, tokenizer=smollm2.tokenizer,
                **SMOLLM2_ENGINE) as e:
        yield e
        assert e.stats()["num_late_compiles"] == 0  # every step was a warm program


def chat(tok, text: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True, tokenize=False)


def test_text_generation_stop_string_and_stream(engine, smollm2) -> None:
    p = chat(smollm2.tokenizer, "What is the capital of France?")
    out = engine.generate(p, SamplingParams(max_new_tokens=16, temperature=0.0))
    assert "Paris" in out.text
    assert out.prompt_tokens == len(smollm2.tokenizer(p).input_ids)
    # a stop string ends the request and is cut from the text
    cut = engine.generate(p, SamplingParams(max_new_tokens=16, temperature=0.0, stop=("Paris",)))
    assert cut.finish_reason == "stop" and "Paris" not in cut.text
    assert out.text.startswith(cut.text)
    assert cut.cached_tokens == out.prompt_tokens - 1  # the same prompt again

    async def stream() -> str:
        return "".join([c.text async for c in engine.generate_stream(
            p, SamplingParams(max_new_tokens=16, temperature=0.0))])

    assert asyncio.run(stream()) == out.text

    async def stream_with_stop() -> list:
        return [c async for c in engine.generate_stream(
            p, SamplingParams(max_new_tokens=16, temperature=0.0, stop=("Paris",)))]

    chunks = asyncio.run(stream_with_stop())
    assert "".join(c.text for c in chunks) == cut.text  # no piece of the stop string
    # every token id reaches the stream, the stop string's own tokens included
    assert [t for c in chunks for t in c.token_ids] == cut.token_ids
    assert chunks[-1].finish_reason == "stop" and chunks[-1].output.text == cut.text
    engine.check_integrity()
    stats = engine.stats()
    assert stats["num_finished"] == 4 and stats["cache_hit_rate"] > 0.5


def test_one_shot_generate() -> None:
    out = radixjax.generate("Hello", max_new_tokens=3, temperature=0.0)
    assert out.completion_tokens == 3 and isinstance(out.text, str)
