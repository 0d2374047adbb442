"""Speculative decoding (engine/speculative.py) is lossless: with drafts from the radix
tree and the request's own n-grams, greedy and seeded outputs (and their logprobs) are
the tokens plain decoding gives, concurrent or alone, through retraction, pages, a tight
pool, stop tokens and lengths; drafts rejected midway give their KV back at once. The
tiny model's heads are ones the CPU attention handler computes (as SmolLM2's), so a
verify step's tokens get a decode's bits."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chisquare

from radixjax import Engine, SamplingParams
from radixjax.engine import speculative
from radixjax.engine.config import EngineConfigError
from radixjax.engine.drafts import NgramIndex
from radixjax.engine.speculative import DraftState, StepCosts, num_accepted, plan
from radixjax.loaders import load_model
from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import StepOptions
from radixjax.sampling.params import SamplingArrays
from tests.model.harness import tiny_runner
from tests.tiny_models import FAST_COMPILE

BASE = dict(num_slots=2048, max_running=8, max_context=128, max_prefill_tokens=64,
            chunk_size=64, xla_options=FAST_COMPILE)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True, logprobs=True)
SEEDED = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=11,
                        ignore_eos=True, logprobs=True, top_logprobs=2)
SPEC = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=6)

PATHS = {
    "default": {},
    "overlap_off": dict(enable_overlap=False),
    "retract_every_3": dict(retract_every=3),
    "page_16": dict(page_size=16, warmup=False),
    "tight_kv": dict(num_slots=160, warmup=False),
}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    m = load_model(tiny_model_dir("llama_h64"), load_tokenizer=False)
    rng = np.random.default_rng(3)
    prompts = [list(map(int, rng.integers(3, 200, n))) for n in (5, 30, 17, 9)]
    span = list(map(int, rng.integers(3, 200, 10)))
    prompts += [span * 3, [7, 8] + span * 2]  # copy-heavy: their own n-grams draft
    kw = dict(BASE, params=m.params, model_config=m.cfg)
    with Engine(**kw) as e:
        ref = {sp.temperature: e.generate(prompts, sp) for sp in (GREEDY, SEEDED)}
    return prompts, kw, ref, m


def outputs(outs) -> list:
    return [(o.token_ids, o.logprobs, o.top_logprobs, o.finish_reason) for o in outs]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_outputs_equal_plain_decoding(tiny, path: str) -> None:
    prompts, kw, ref, _ = tiny
    with Engine(**dict(kw, **SPEC, **PATHS[path])) as e:
        for sp in (GREEDY, SEEDED):
            together = e.generate(prompts, sp)  # (the second pass drafts from the tree)
            alone = [e.generate(p, sp) for p in prompts]
            assert outputs(together) == outputs(ref[sp.temperature])
            assert outputs(alone) == outputs(ref[sp.temperature])
        e.check_integrity()
        stats = e.stats()
    assert stats["num_verify_reqs"] > 0 and stats["num_accepted_tokens"] > 0
    assert stats["num_late_compiles"] == 0
    if path in ("retract_every_3", "tight_kv"):
        assert stats["num_retractions"] > 0


def test_drafts_rejected_midway_end_as_plain_decoding(tiny, monkeypatch) -> None:
    """A drafter that knows the answer but gets one token wrong at a random place:
    verify steps accept part of their drafts, give the rest of their KV back, and
    requests end on their stop token or length exactly where plain decoding ends."""
    prompts, kw, ref, _ = tiny
    greedy = ref[0.0]
    answers = {tuple(p): o.token_ids for p, o in zip(prompts, greedy, strict=True)}
    rng = np.random.default_rng(0)

    def oracle(index: NgramIndex, k: int, tree=None, namespace=None):
        seq = index.tokens
        for prompt, answer in answers.items():
            n = len(prompt)
            if tuple(seq[:n]) == prompt:
                drafts = list(answer[len(seq) - n:][:k])
                if drafts and rng.random() < 0.7:
                    drafts[rng.integers(len(drafts))] = 1  # never a greedy token here
                return drafts, "oracle"
        return [], ""

    monkeypatch.setattr(speculative, "propose_draft", oracle)
    stop_at = greedy[1].token_ids[7]  # a token some outputs reach midway
    cases = [replace(GREEDY, max_new_tokens=n) for n in (3, 11, 24)]
    cases.append(replace(GREEDY, stop_token_ids=(stop_at,)))
    with Engine(**dict(kw, **SPEC)) as e:
        for sp in cases:
            with Engine(**kw) as plain:  # (shares the compiled programs)
                want = plain.generate(prompts, sp)
            assert outputs(e.generate(prompts, sp)) == outputs(want)
            e.check_integrity()
        stats = e.stats()
    partial = stats["num_accepted_tokens"] / stats["num_draft_tokens"]
    assert 0.1 < partial < 0.95, stats  # both accepted and rejected drafts


def test_penalized_requests_decode_plainly_beside_drafting_ones(tiny) -> None:
    prompts, kw, ref, _ = tiny
    penalized = replace(GREEDY, frequency_penalty=0.5)
    with Engine(**kw) as plain:
        want = plain.generate(prompts[-2:], penalized)
    with Engine(**dict(kw, **SPEC)) as e:
        assert outputs(e.generate(prompts[-2:], penalized)) == outputs(want)
        assert e.stats()["num_verify_reqs"] == 0  # nobody drafts beside a penalty
        e.check_integrity()


COSTS = StepCosts.default((1, 2, 4, 8, 16, 32))


def test_the_plan_drafts_where_acceptance_pays_for_the_larger_step() -> None:
    assert plan([0.95], [8], COSTS, 32) == [7]  # the 8-token bucket, not 16 for the 8th
    assert plan([0.95], [3], COSTS, 32) == [3]  # as many as proposed
    assert plan([0.1], [8], COSTS, 32) == [0]  # unlikely drafts do not pay
    assert plan([0.6, 0.0, 0.0], [1, 0, 0], COSTS, 32) == [1, 0, 0]  # a free row of the bucket
    assert plan([0.95] * 2, [8, 8], COSTS, 4) == [1, 1]  # max_rows: the batch's rows
    assert plan([0.6] * 8, [4] * 8, COSTS, 32) == [0] * 8  # a large batch: cost > gain
    assert plan([0.99] * 8, [4] * 8, COSTS, 32)[0] > 0  # unless drafts are near certain
    assert plan([0.9, 0.2], [6, 6], COSTS, 32) == [6, 0]  # the likely request's drafts
    as_large = StepCosts(COSTS.by_tokens, {t: 1.0 for t in COSTS.by_tokens})
    assert plan([0.95], [8], as_large, 32) == [0]  # a draft model as costly as the target
    small = StepCosts(COSTS.by_tokens, {t: 0.1 for t in COSTS.by_tokens})
    assert plan([0.7], [8], COSTS, 32) == [3]  # drafts that cost nothing to propose
    assert plan([0.7], [8], small, 32) == [1]  # each draft model round costs: fewer
    measured = StepCosts.relative({1: 0.010, 2: 0.009, 4: 0.016})
    assert measured.by_tokens == {1: 1.0, 2: 1.0, 4: 1.6}  # never cheaper when larger


def test_acceptance_estimate_follows_outcomes() -> None:
    state = DraftState(NgramIndex())
    start = state.alpha
    state.observe(4, 4)  # every draft accepted
    assert state.alpha > start
    for _ in range(4):
        state.observe(4, 0)  # every first draft rejected
    assert state.alpha < 0.3 and plan([state.alpha], [8], COSTS, 32) == [0]
    for _ in range(60):
        state.idle()  # steps without drafts: back toward the prior
    assert abs(state.alpha - start) < 0.05
    assert (state.num_verify_steps, state.num_drafted, state.num_accepted) == (5, 20, 4)
    assert num_accepted([5, 6, 7], [5, 6, 9, 2]) == 2
    assert num_accepted([5, 6], [5, 6, 1]) == 2
    assert num_accepted([5], [4, 0]) == 0


def test_verify_rows_sample_the_models_distribution(tiny_model_dir) -> None:
    """Chi-square: a verify step's row after a draft draws from the model's distribution
    at that draft (the target p), so accepting d while t == d and taking t otherwise is
    the rejection-sampling rule with a one-hot q (the output's distribution is p)."""
    m = load_model(tiny_model_dir("llama_h64"), load_tokenizer=False)
    runner = tiny_runner(m.cfg, m.params, num_slots=1024, max_running=32)
    seq = np.array([5, 17, 42, 99, 7, 7], np.int32)  # a prompt, x, then drafts d1 d2
    n, reqs, rows = len(seq), 8, 3
    logits = runner.all_logits(build_batch(
        [RequestSlice(seq, np.arange(1, n + 1, dtype=np.int32))], runner.buckets))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)  # [n, V]
    counts = np.zeros((rows, m.cfg.vocab_size))
    for step in range(200):
        batch = build_batch([RequestSlice(seq, 1 + i * n + np.arange(n, dtype=np.int32),
                                          row=i, num_samples=rows) for i in range(reqs)],
                            runner.buckets)
        sp = SamplingArrays.build([SamplingParams(temperature=1.0)] * (reqs * rows),
                                  [step * reqs + i // rows for i in range(reqs * rows)],
                                  batch.shape.num_reqs)
        tokens = np.asarray(runner.step(batch, sp, StepOptions(do_sample=True)).tokens)
        for i in range(reqs * rows):
            counts[i % rows, tokens[i]] += 1
    for r in range(rows):  # after x, after d1, after d2
        assert chi_square_p(counts[r], probs[n - rows + r]) > 1e-3
    assert np.abs(probs[n - 3] - probs[n - 2]).sum() > 0.3  # rows differ: the test can
    assert chi_square_p(counts[1], probs[n - 3]) < 1e-6  # tell a row from its neighbour


def chi_square_p(observed: np.ndarray, p: np.ndarray) -> float:
    """p-value of observed counts under probabilities p (bins expected >= 5, the rest
    pooled into one)."""
    expected = p.astype(np.float64) / p.sum() * observed.sum()
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # too little pooled mass for a bin of its own
        obs, exp = obs[:-1], exp[:-1] * obs[:-1].sum() / exp[:-1].sum()
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("draft", ["itself", "another model"])
def test_a_draft_model_keeps_plain_decodings_outputs(tiny, tiny_model_dir, draft) -> None:
    """speculative_algorithm "standalone": a draft model's greedy proposals, verified the
    same way (a draft model as large as its target never pays: here its cost is set to
    nothing, so that the plan drafts). The target as its own draft accepts every greedy
    draft (its KV, mirrored at the same slots, is the target's); another model's mostly
    fail; both keep the outputs plain decoding's."""
    prompts, kw, ref, _ = tiny
    # the target in memory; another model from its folder (speculative_draft_model_path)
    given = (dict(draft_params=tiny[3].params, draft_model_config=tiny[3].cfg)
             if draft == "itself" else
             dict(speculative_draft_model_path=str(tiny_model_dir("llama"))))
    with Engine(**kw, speculative_algorithm="standalone", speculative_num_draft_tokens=4,
                **given) as e:
        costs = e.scheduler.step_costs  # as if the draft were free: the plan drafts
        e.scheduler.step_costs = StepCosts(costs.by_tokens, {t: 0.0 for t in costs.draft})
        assert outputs(e.generate(prompts, GREEDY)) == outputs(ref[0.0])
        stats = e.stats()
        assert stats["num_draft_tokens"] > 0
        if draft == "itself":
            assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
        assert outputs([e.generate(p, SEEDED) for p in prompts]) == outputs(ref[1.0])
        e.check_integrity()
        assert e.stats()["num_late_compiles"] == 0


def test_a_draft_model_must_share_the_vocabulary(tiny, tiny_model_dir) -> None:
    _, kw, _, _ = tiny
    other = load_model(tiny_model_dir("qwen3"), load_tokenizer=False)
    bad = dataclasses.replace(other.cfg, vocab_size=other.cfg.vocab_size + 1)
    with pytest.raises(EngineConfigError, match="vocabulary"):
        Engine(**kw, speculative_algorithm="standalone", draft_params=other.params,
               draft_model_config=bad, warmup=False)
    with pytest.raises(EngineConfigError, match="draft model"):
        Engine(**kw, speculative_algorithm="standalone", warmup=False)
