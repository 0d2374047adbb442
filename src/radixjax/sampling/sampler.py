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


def _sample_row(
    logits: jax.Array,  # [V] f32
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array,
    key: jax.Array,
) -> jax.Array:
    vocab = logits.shape[0]
    scaled = logits / jnp.maximum(temperature, 1e-6)
    order = jnp.argsort(-scaled)  # [V], most likely first
    sorted_logits = scaled[order]
    probs = jax.nn.softmax(sorted_logits)
    rank = jnp.arange(vocab)
    keep = rank < jnp.where(top_k > 0, top_k, vocab)
    keep &= (jnp.cumsum(probs) - probs) < top_p  # mass strictly before this token
    keep &= probs >= min_p * probs[0]
    keep = keep.at[0].set(True)
    # The draw is over the vocabulary in token order, so each token meets the same noise
    # whatever the sort did: two logits within float error of each other (their order
    # may differ between batches) would otherwise swap noises and change the sample.
    keep = jnp.zeros(vocab, bool).at[order].set(keep)
    sampled = jax.random.categorical(key, jnp.where(keep, scaled, -jnp.inf))
    return jnp.where(temperature > 0.0, sampled, jnp.argmax(logits)).astype(jnp.int32)


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
        return jax.vmap(_sample_row)(logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p,
                                     keys)

    def greedy(logits: jax.Array) -> jax.Array:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

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
