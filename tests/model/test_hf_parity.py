"""Logits parity with HF transformers (torch, float32, eager attention) on tiny random
models of every family: a ragged prefill batch, 8 batched decode steps, and an extend
over a cached prefix, all with KV slots scattered through the pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # a test dependency (scripts/setup.sh test): missing, collection fails
import transformers  # noqa: E402 - a test dependency, as torch

from radixjax.loaders import load_model
from radixjax.runtime.batch import Buckets, RequestSlice, build_batch
from tests.model.harness import ScatteredSlots, rel_err, tiny_runner
from tests.tiny_models import FAMILIES

TOL = 1e-4
# Every step below (prefill, decodes, extend) padded to one 64-token bucket: one compiled
# program per model instead of one per size.
ONE_BUCKET = Buckets(tokens=(64,), max_reqs=4)


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_hf(family: str, tiny_model_dir) -> None:
    folder = tiny_model_dir(family)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    m = load_model(folder, load_tokenizer=False)
    runner = tiny_runner(m.cfg, m.params)
    slots = ScatteredSlots(512, seed=1)
    rng = np.random.default_rng(0)

    # Ragged prefill: three prompts of different lengths in one step.
    seqs = [list(rng.integers(3, m.cfg.vocab_size, n)) for n in (5, 17, 11)]
    rows = [slots.take(len(s) + 8) for s in seqs]
    batch = build_batch(
        [RequestSlice(np.array(s, np.int32), r[: len(s)]) for s, r in zip(seqs, rows, strict=True)],
        ONE_BUCKET,
    )
    ours = runner.all_logits(batch)
    ref = np.concatenate([hf_logits(hf, s) for s in seqs])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < TOL

    # Eight batched decode steps, one new token per request.
    for _ in range(8):
        new = [int(rng.integers(3, m.cfg.vocab_size)) for _ in seqs]
        batch = build_batch(
            [
                RequestSlice(np.array([t], np.int32), r[: len(s) + 1])
                for s, r, t in zip(seqs, rows, new, strict=True)
            ],
            ONE_BUCKET,
        )
        ours = runner.all_logits(batch)
        for s, t in zip(seqs, new, strict=True):
            s.append(t)
        ref = np.stack([hf_logits(hf, s)[-1] for s in seqs])
        assert rel_err(ours, ref) < TOL

    # Extend over a cached prefix: reuse request 1's first 9 slots, add 7 new tokens.
    prefix_len = 9
    new_tokens = list(rng.integers(3, m.cfg.vocab_size, 7))
    row = np.concatenate([rows[1][:prefix_len], slots.take(7)])
    batch = build_batch([RequestSlice(np.array(new_tokens, np.int32), row)], ONE_BUCKET)
    ours = runner.all_logits(batch)
    ref = hf_logits(hf, seqs[1][:prefix_len] + new_tokens)[prefix_len:]
    assert rel_err(ours, ref) < TOL


def test_bfloat16_weights_stay_close_to_float32(tiny_model_dir) -> None:
    folder = tiny_model_dir("qwen3")
    f32 = load_model(folder, dtype="float32", load_tokenizer=False)
    bf16 = load_model(folder, dtype="bfloat16", load_tokenizer=False)
    assert str(bf16.params["layers"][0]["wq"].dtype) == "bfloat16"
    ids = np.random.default_rng(3).integers(3, f32.cfg.vocab_size, 20).astype(np.int32)
    out = []
    for m in (f32, bf16):
        runner = tiny_runner(m.cfg, m.params)
        batch = build_batch([RequestSlice(ids, np.arange(1, 21, dtype=np.int32))], ONE_BUCKET)
        out.append(runner.all_logits(batch))
    err = rel_err(out[1], out[0])
    assert 1e-5 < err < 5e-2  # really rounded, and still close


def test_mla_absorbed_decode_equals_expanded(tiny_model_dir) -> None:
    """DeepSeek-V3 (MLA): decode in the latent space (weights absorbed) gives the logits
    of the expanded form (every key block expanded per head), over a ragged prefill and
    4 decode steps; the pool holds one latent row per token."""
    m = load_model(tiny_model_dir("deepseek_v3"), load_tokenizer=False)
    mla = m.cfg.mla
    runners = [tiny_runner(m.cfg, m.params, mla_absorb=a) for a in (True, False)]
    pool = runners[0].kv
    assert pool[0].shape[1:] == (1, mla.kv_lora_rank + mla.qk_rope_head_dim)
    assert pool[1].size == 0  # no separate V pool
    rng = np.random.default_rng(4)
    seqs = [list(rng.integers(3, m.cfg.vocab_size, n)) for n in (6, 13)]
    slots = ScatteredSlots(512, seed=2)
    rows = [slots.take(len(s) + 4) for s in seqs]
    batches = [build_batch([RequestSlice(np.array(s, np.int32), r[: len(s)])
                            for s, r in zip(seqs, rows, strict=True)], ONE_BUCKET)]
    for step in range(4):
        batches.append(build_batch(
            [RequestSlice(np.array([int(rng.integers(3, 200))], np.int32), r[: len(s) + step + 1])
             for s, r in zip(seqs, rows, strict=True)], ONE_BUCKET))
    for batch in batches:
        absorbed, expanded = (r.all_logits(batch) for r in runners)
        assert rel_err(absorbed, expanded) < 1e-5
