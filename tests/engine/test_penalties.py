"""Frequency / presence penalties: engine outputs equal a numpy reference that applies
OpenAI's formula to full-sequence logits, on every path (overlap, chunks, retraction
with re-prefill of the outputs, mixed batches)."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import tiny_runner
from tests.tiny_models import FAST_COMPILE

FREQ, PRES, N = 0.7, 0.9, 10
# float32, as the reference's runner (the penalties are what is compared)
BASE = dict(num_slots=1024, max_running=4, max_context=96, max_prefill_tokens=64,
            chunk_size=64, xla_options=FAST_COMPILE, quantization="none")


def reference(m, prompt: list[int], freq: float, pres: float) -> list[int]:
    runner = tiny_runner(m.cfg, m.params, num_slots=128, max_context=64)
    seq, counts, out = list(prompt), np.zeros(m.cfg.vocab_size), []
    for _ in range(N):
        n = len(seq)
        logits = runner.all_logits(build_batch(
            [RequestSlice(np.array(seq, np.int32), np.arange(1, n + 1, dtype=np.int32))],
            runner.buckets))[-1]
        tok = int(np.argmax(logits - freq * counts - pres * (counts > 0)))
        counts[tok] += 1
        seq.append(tok)
        out.append(tok)
    return out


@pytest.fixture(scope="module")
def case(tiny_model_dir):
    m = load_model(tiny_model_dir("llama"), load_tokenizer=False)
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(3, 60, n)) for n in (4, 11, 7)]
    ref = [reference(m, p, FREQ, PRES) for p in prompts]
    plain = [reference(m, p, 0.0, 0.0) for p in prompts]
    assert ref != plain  # the penalties change these outputs
    assert any(len(set(r)) < len(r) for r in plain)  # repetition that penalties fight
    return m, prompts, ref


@pytest.mark.parametrize("extra", [{}, dict(enable_overlap=False), dict(chunk_size=3),
                                   dict(retract_every=2), dict(enable_mixed=True)],
                         ids=["default", "no_overlap", "chunks", "retract", "mixed"])
def test_penalties_match_reference(case, extra) -> None:
    m, prompts, ref = case
    sp = SamplingParams(max_new_tokens=N, temperature=0.0, ignore_eos=True,
                        frequency_penalty=FREQ, presence_penalty=PRES)
    plain_sp = SamplingParams(max_new_tokens=N, temperature=0.0, ignore_eos=True)
    with Engine(params=m.params, model_config=m.cfg, **dict(BASE, **extra)) as e:
        got = [o.token_ids for o in e.generate(prompts, sp)]
        # an unpenalized neighbour in the same batches is unaffected, and vice versa
        mixed = e.generate([prompts[0], prompts[0]], [plain_sp, sp])
        e.check_integrity()
        if "retract_every" in extra:
            assert e.stats()["num_retractions"] > 0
    assert got == ref
    assert mixed[0].token_ids == reference(m, prompts[0], 0.0, 0.0)
    assert mixed[1].token_ids == ref[0]
