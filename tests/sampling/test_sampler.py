"""The in-jit sampler: greedy, temperature, top-k, top-p, min-p, seeds, logprobs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.sampling.params import SamplingArrays, SamplingParams, SamplingParamsError
from radixjax.sampling.sampler import DRAW_BLOCK, _draw, _first_past, argmax, sample

VOCAB = 50
ROWS = 4000


@jax.jit
def _run(logits, sp, positions, do_sample=True):
    return sample(logits, logits, sp, positions, jnp.bool_(do_sample), jnp.bool_(True))


def draw(probs: np.ndarray, p: SamplingParams, seeds=None, positions=None) -> np.ndarray:
    """ROWS samples of the same distribution, one per (seed, position) row."""
    logits = jnp.asarray(np.log(probs), jnp.float32)[None].repeat(ROWS, 0)
    seeds = np.arange(ROWS) if seeds is None else seeds
    positions = np.zeros(ROWS, np.int32) if positions is None else positions
    sp = SamplingArrays.build([p] * ROWS, list(seeds), ROWS)
    return np.asarray(_run(logits, sp, jnp.asarray(positions, jnp.int32)).tokens)


@pytest.fixture
def probs() -> np.ndarray:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(VOCAB) * 0.5)
    return p.astype(np.float64)


def test_temperature_zero_and_top_k_one_are_greedy(probs) -> None:
    best = int(np.argmax(probs))
    assert set(draw(probs, SamplingParams(temperature=0.0))) == {best}
    assert set(draw(probs, SamplingParams(temperature=1.5, top_k=1))) == {best}


def test_top_k_restricts_support(probs) -> None:
    top3 = set(np.argsort(-probs)[:3].tolist())
    got = set(draw(probs, SamplingParams(temperature=1.0, top_k=3)).tolist())
    assert got == top3


def test_top_p_restricts_support(probs) -> None:
    order = np.argsort(-probs)
    before = np.cumsum(probs[order]) - probs[order]
    nucleus = set(order[before < 0.6].tolist())
    got = set(draw(probs, SamplingParams(temperature=1.0, top_p=0.6)).tolist())
    assert got <= nucleus and len(got) == len(nucleus) > 1


def test_min_p_restricts_support(probs) -> None:
    allowed = set(np.flatnonzero(probs >= 0.2 * probs.max()).tolist())
    got = set(draw(probs, SamplingParams(temperature=1.0, min_p=0.2)).tolist())
    assert got <= allowed and len(got) > 1


def test_temperature_one_follows_the_distribution(probs) -> None:
    counts = np.bincount(draw(probs, SamplingParams(temperature=1.0)), minlength=VOCAB)
    assert np.abs(counts / ROWS - probs).max() < 0.04
    # a high temperature flattens it
    hot = np.bincount(draw(probs, SamplingParams(temperature=5.0)), minlength=VOCAB)
    assert hot.max() < counts.max()


def test_seed_reproduces_and_differs(probs) -> None:
    p = SamplingParams(temperature=1.0)
    seeds = np.full(ROWS, 7)
    positions = np.arange(ROWS, dtype=np.int32)
    a = draw(probs, p, seeds, positions)
    b = draw(probs, p, seeds, positions)
    c = draw(probs, p, seeds + 1, positions)
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.3
    assert len(set(a.tolist())) > 5  # the position is folded in: rows are not all equal


def test_a_near_tie_between_logits_does_not_change_the_sample(probs) -> None:
    """Two tokens whose logits differ by float error (their order can flip from one batch
    shape to another) must not swap random noise: every seed draws the same token with
    the pair in either order. (Found in a server: a seeded request's text depended on its
    batch-mates.)"""
    a, b = np.argsort(-probs)[:2]  # the likeliest two: often drawn
    tie = probs.copy()
    tie[a] = tie[b] = (probs[a] + probs[b]) / 2
    up, down = tie.copy(), tie.copy()
    up[a] *= 1 + 1e-6
    down[b] *= 1 + 1e-6
    for p in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)):
        x, y = draw(up, p), draw(down, p)
        assert np.isin(x, [a, b]).mean() > 0.1
        assert (x == y).all(), int((x != y).sum())


def test_a_row_samples_the_same_whether_or_not_a_batch_mate_truncates(probs) -> None:
    """The vocabulary is sorted only when some row needs top-k / top-p / min-p; a row that
    needs none draws the same token either way (its batch-mates do not matter)."""
    logits = jnp.asarray(np.log(probs), jnp.float32)[None].repeat(ROWS, 0)
    plain = [SamplingParams(temperature=1.0)] * ROWS
    mixed = plain[:-1] + [SamplingParams(temperature=1.0, top_k=3)]
    pos = jnp.zeros(ROWS, jnp.int32)
    got = [np.asarray(_run(logits, SamplingArrays.build(ps, list(range(ROWS)), ROWS),
                           pos).tokens)[:-1] for ps in (plain, mixed)]
    assert (got[0] == got[1]).all()


def test_logprobs_are_the_model_log_softmax(probs) -> None:
    logits = jnp.asarray(np.log(probs), jnp.float32)[None].repeat(3, 0)
    sp = SamplingArrays.build([SamplingParams(temperature=1.0)] * 3, [1, 2, 3], 3)
    out = _run(logits, sp, jnp.zeros(3, jnp.int32))
    lp = np.log(probs)
    np.testing.assert_allclose(np.asarray(out.logprobs), lp[np.asarray(out.tokens)], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.top_ids)[0], np.argsort(-probs)[:20])
    np.testing.assert_allclose(np.asarray(out.top_logprobs)[0], np.sort(lp)[::-1][:20],
                               atol=1e-5)


def test_one_program_serves_greedy_and_sampled_rows(probs) -> None:
    """do_sample is a runtime flag: greedy rows stay argmax in a sampled step, and a
    greedy-only step (flag off) gives the same argmax."""
    logits = jnp.asarray(np.log(probs), jnp.float32)[None].repeat(8, 0)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)] * 4
    sp = SamplingArrays.build(params, list(range(8)), 8)
    mixed = np.asarray(_run(logits, sp, jnp.zeros(8, jnp.int32), True).tokens)
    programs = _run._cache_size()
    off = np.asarray(_run(logits, sp, jnp.zeros(8, jnp.int32), False).tokens)
    assert (mixed[::2] == np.argmax(probs)).all() and (off == np.argmax(probs)).all()
    assert _run._cache_size() == programs  # the flag did not make a second program


def test_logprobs_come_from_the_unmasked_logits(probs) -> None:
    """Sampling draws from the (grammar-masked) logits, logprobs describe the model's
    logits: finite even for a token the mask would have removed."""
    model = jnp.asarray(np.log(probs), jnp.float32)[None]
    best = int(np.argmax(probs))
    masked = jnp.full_like(model, -jnp.inf).at[0, best].set(0.0)
    sp = SamplingArrays.build([SamplingParams(temperature=1.0)], [0], 1)
    out = jax.jit(sample)(masked, model, sp, jnp.zeros(1, jnp.int32), jnp.bool_(True),
                          jnp.bool_(True))
    assert int(out.tokens[0]) == best
    assert np.isfinite(np.asarray(out.top_logprobs)).all()
    np.testing.assert_allclose(float(out.logprobs[0]), np.log(probs[best]), atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1),
    dict(max_new_tokens=-1), dict(logprob_start_len=-2), dict(seed=-3),
    dict(top_logprobs=21), dict(temperature="hot"),
])
def test_bad_params_raise(kwargs) -> None:
    with pytest.raises(SamplingParamsError):
        SamplingParams(**kwargs)


def test_the_two_level_draw_follows_a_large_vocabulary() -> None:
    """Many blocks (DRAW_BLOCK tokens each, the last one padded): block by mass, then a
    token within it; masked (-inf) tokens are never drawn, even by a uniform at 1."""
    rng = np.random.default_rng(3)
    vocab = 3 * DRAW_BLOCK + 37
    probs = rng.dirichlet(np.ones(vocab) * 0.3)
    probs[DRAW_BLOCK:2 * DRAW_BLOCK] = 0.0  # a whole block masked
    probs[-5:] = 0.0  # the tail of the padded last block too
    probs /= probs.sum()
    with np.errstate(divide="ignore"):
        logits = jnp.asarray(np.log(probs), jnp.float32)  # -inf where 0
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(11), i))(jnp.arange(20000))
    got = np.asarray(jax.jit(jax.vmap(_draw, in_axes=(0, None)))(keys, logits))
    assert probs[got].min() > 0
    counts = np.bincount(got, minlength=vocab) / len(got)
    blocks = np.add.reduceat(probs, np.arange(0, vocab, DRAW_BLOCK))
    assert np.abs(np.add.reduceat(counts, np.arange(0, vocab, DRAW_BLOCK)) - blocks).max() < 0.02
    assert np.abs(counts - probs).max() < 0.01
    # a draw rounded up to the whole mass takes the last entry of positive mass
    mass = jnp.asarray([0.5, 0.0, 0.5, 0.0, 0.0])
    assert int(_first_past(jnp.cumsum(mass), jnp.float32(1.0), mass)) == 2
    assert int(_first_past(jnp.cumsum(mass), jnp.float32(0.0), mass)) == 0
    assert int(_first_past(jnp.cumsum(mass), jnp.float32(0.5), mass)) == 2


def test_two_level_argmax_is_the_first_largest() -> None:
    rng = np.random.default_rng(5)
    for vocab in (256, 1000, 49152):
        x = rng.standard_normal((8, vocab)).astype(np.float32)
        x[1, [7, 700 % vocab, vocab - 1]] = 9.0  # a tie: the first index wins
        x[2, :] = -np.inf  # a row masked out entirely
        x[3, vocab - 1] = 50.0  # in the last (padded) block
        assert argmax(jnp.asarray(x)).tolist() == np.argmax(x, axis=1).tolist()
