"""Sampling inside the jitted step: greedy, temperature, top-k, top-p, min-p, and a
per-request seed folded with the token's position, so a request samples the same tokens
whatever batch it lands in (and after retraction)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from radixjax.sampling.params import SamplingArrays


class SampleOutput(NamedTuple):
    tokens: jax.Array  # [B] int32
    logprobs: jax.Array | None  # [B] f32, log p(token) under the unscaled model distribution
    top_ids: jax.Array | None  # [B, N] int32
    top_logprobs: jax.Array | None  # [B, N] f32


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
    choice = jax.random.categorical(key, jnp.where(keep, sorted_logits, -jnp.inf))
    sampled = order[choice]
    return jnp.where(temperature > 0.0, sampled, jnp.argmax(logits)).astype(jnp.int32)


def sample(
    logits: jax.Array,  # [B, V] f32
    sp: SamplingArrays,  # [B] arrays (as jax arrays inside jit)
    positions: jax.Array,  # [B] int32, position the sampled token will take
    *,
    do_sample: bool,
    num_top_logprobs: int,
    return_logprobs: bool,
) -> SampleOutput:
    if do_sample:
        keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(
            sp.seed, positions
        )
        tokens = jax.vmap(_sample_row)(
            logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p, keys
        )
    else:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if not return_logprobs:
        return SampleOutput(tokens, None, None, None)
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    if num_top_logprobs == 0:
        return SampleOutput(tokens, chosen, None, None)
    top_lp, top_ids = jax.lax.top_k(logp, num_top_logprobs)
    return SampleOutput(tokens, chosen, top_ids.astype(jnp.int32), top_lp)
