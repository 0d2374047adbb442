"""Sampling inside the jitted step: greedy, temperature, top-k, top-p, min-p, and a
per-request seed folded with the token's position, so a request samples the same tokens
whatever batch it lands in (and after retraction)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from radixjax.sampling.params import MAX_TOP_LOGPROBS, SamplingArrays


class SampleOutput(NamedTuple):
    tokens: jax.Array  # [B] int32
    logprobs: jax.Array  # [B] f32, log p(token) under the model distribution (zeros when
    # not asked for); "model distribution": the logits before temperature and grammar mask
    top_ids: jax.Array  # [B, MAX_TOP_LOGPROBS] int32
    top_logprobs: jax.Array  # [B, MAX_TOP_LOGPROBS] f32


class StepFlags(NamedTuple):
    """[] bool runtime flags of one step (StepOptions on the host)."""

    do_sample: jax.Array
    return_logprobs: jax.Array
    use_penalties: jax.Array
    use_grammar: jax.Array
    prompt_logprobs: jax.Array
    use_logit_bias: jax.Array


def _kept(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array,
          min_p: jax.Array) -> jax.Array:
    """[V] bool: the tokens top-k / top-p / min-p keep. Each keeps a prefix of the tokens
    sorted by logit, so together they keep every token at or above one cutoff logit
    (decided by value: a near-tie's order cannot matter)."""
    vocab = scaled.shape[0]
    sorted_logits = jnp.sort(scaled)[::-1]  # most likely first (values only)
    probs = jax.nn.softmax(sorted_logits)
    keep = jnp.arange(vocab) < jnp.where(top_k > 0, top_k, vocab)
    keep &= (jnp.cumsum(probs) - probs) < top_p  # mass strictly before this token
    keep &= probs >= min_p * probs[0]
    cutoff = sorted_logits[jnp.maximum(jnp.sum(keep), 1) - 1]
    return scaled >= cutoff


DRAW_BLOCK = 128  # tokens per block of the two-level draw


def _first_past(cum: jax.Array, frac: jax.Array, mass: jax.Array) -> jax.Array:
    """Index of the first entry whose cumulative mass passes frac * total ([] int32); never
    an entry of zero mass (a draw rounded up to the total takes the last positive one)."""
    first = jnp.sum(cum <= frac * cum[-1])
    last_positive = mass.shape[0] - 1 - jnp.argmax(mass[::-1] > 0)
    return jnp.minimum(first, last_positive)


def _draw(key: jax.Array, scaled: jax.Array) -> jax.Array:
    """One token ~ softmax(scaled) ([V] f32, -inf = excluded) by inverse CDF in two levels:
    a block of DRAW_BLOCK tokens by its mass, then a token in it; two uniforms per row.
    jax.random.categorical draws one Gumbel per token instead: 49152 threefry draws per
    row cost ~1.2 ms on the CPU (B = 32: ~37 ms of a step), this ~0.07 ms."""
    vocab = scaled.shape[0]
    p = jnp.exp(scaled - jnp.max(scaled))  # [V], the largest is 1
    p = jnp.pad(p, (0, -vocab % DRAW_BLOCK)).reshape(-1, DRAW_BLOCK)  # [nb, BLOCK]
    u_block, u_token = jax.random.uniform(key, (2,))
    mass = jnp.sum(p, axis=1)  # [nb]
    b = _first_past(jnp.cumsum(mass), u_block, mass)
    row = p[b]  # [BLOCK]
    return (b * DRAW_BLOCK + _first_past(jnp.cumsum(row), u_token, row)).astype(jnp.int32)


def argmax(logits: jax.Array) -> jax.Array:
    """[B, V] -> [B] int32, the first index of each row's largest value (jnp.argmax's
    answer) in two levels: the first block of DRAW_BLOCK holding the row's max, then the
    first max in it. XLA's CPU argmax over [B, 49152] is a scalar loop (~0.9 ms at B = 8,
    a verify step's rows); a max per block is a vectorized reduce."""
    b, vocab = logits.shape
    blocks = jnp.pad(logits, ((0, 0), (0, -vocab % DRAW_BLOCK)),
                     constant_values=-jnp.inf).reshape(b, -1, DRAW_BLOCK)  # [B, nb, BLOCK]
    first = jnp.argmax(jnp.max(blocks, axis=2), axis=1)  # [B]
    row = jnp.take_along_axis(blocks, first[:, None, None], axis=1)[:, 0]  # [B, BLOCK]
    return (first * DRAW_BLOCK + jnp.argmax(row, axis=1)).astype(jnp.int32)


def _sample_row(
    logits: jax.Array,  # [V] f32
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array,
    key: jax.Array,
    truncate: jax.Array,  # [] bool: some row of the step truncates (else skip the sort)
) -> jax.Array:
    scaled = logits / jnp.maximum(temperature, 1e-6)
    # A row that keeps every token draws from the same logits whether or not the sort ran
    # (for another row of its step): the same token.
    scaled = jax.lax.cond(
        truncate, lambda x: jnp.where(_kept(x, top_k, top_p, min_p), x, -jnp.inf),
        lambda x: x, scaled)
    return _draw(key, scaled)  # (a temperature 0 row's token: sample()'s argmax instead)


def sample(
    logits: jax.Array,  # [B, V] f32, what the tokens are drawn from (grammar-masked)
    model_logits: jax.Array,  # [B, V] f32, what logprobs report (before the mask)
    sp: SamplingArrays,  # [B] arrays (as jax arrays inside jit)
    positions: jax.Array,  # [B] int32, position the sampled token will take
    do_sample: jax.Array,  # [] bool: some row has temperature > 0 (else skip the sort)
    return_logprobs: jax.Array,  # [] bool
) -> SampleOutput:
    def draw(logits: jax.Array) -> jax.Array:
        keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(
            sp.seed, positions
        )
        # OpenAI's defaults (temperature 1, top_p 1) need no sort of the vocabulary
        truncate = jnp.any(sp.top_k > 0) | jnp.any(sp.top_p < 1.0) | jnp.any(sp.min_p > 0.0)
        sampled = jax.vmap(_sample_row, in_axes=(0, 0, 0, 0, 0, 0, None))(
            logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p, keys, truncate)
        # the argmax only where some row is greedy (XLA's CPU argmax: ~0.9 ms at B = 8,
        # 2 % of a SmolLM2 w8a8 decode step at OpenAI's default temperature 1)
        argmax = jax.lax.cond(jnp.any(sp.temperature <= 0.0), greedy,
                              lambda lg: jnp.zeros(lg.shape[0], jnp.int32), logits)
        return jnp.where(sp.temperature > 0.0, sampled, argmax)

    def greedy(logits: jax.Array) -> jax.Array:
        return argmax(logits)

    tokens = jax.lax.cond(do_sample, draw, greedy, logits)
    b = logits.shape[0]

    def logprobs(tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        logp = jax.nn.log_softmax(model_logits, axis=-1)
        chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
        top_lp, top_ids = jax.lax.top_k(logp, MAX_TOP_LOGPROBS)
        return chosen, top_ids.astype(jnp.int32), top_lp

    def none(tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return (jnp.zeros(b, jnp.float32), jnp.zeros((b, MAX_TOP_LOGPROBS), jnp.int32),
                jnp.zeros((b, MAX_TOP_LOGPROBS), jnp.float32))

    return SampleOutput(tokens, *jax.lax.cond(return_logprobs, logprobs, none, tokens))
