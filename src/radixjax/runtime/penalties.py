"""Logits processors of the step: logit_bias (apply_logit_bias), and frequency /
presence penalties from a device-side count of each request's output
tokens: `counts [num_token_rows, V] int32`, one row per request row (like the token
buffer), updated inside the jitted step so no [B, V] array crosses the host link.

Per step with a penalized request (a lax.cond on StepOptions.use_penalties), for the
batch's rows: zero rows of new admissions, add fed output tokens (a re-prefill after
retraction re-feeds its outputs), store them, and penalize the logits. Every step adds
the sampled tokens that are real outputs ([B] scatter, cheap). Rows of requests without
penalties may hold stale counts: a penalized request resets its row on admission.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixjax.model.attention import AttentionMetadata
from radixjax.runtime.batch import TokenSource
from radixjax.sampling.params import SamplingArrays


def gather_counts(counts: jax.Array, input_ids: jax.Array, src: TokenSource,
                  md: AttentionMetadata) -> jax.Array:
    """-> [B, V] counts of the batch's requests, after resets and fed output tokens."""
    rows = jnp.where(src.reset_row[:, None], 0, counts[src.req_row])  # [B, V]
    return rows.at[md.token_req, input_ids].add(src.count_input.astype(jnp.int32))


def apply_penalties(logits: jax.Array, rows: jax.Array, sp: SamplingArrays) -> jax.Array:
    """logits, rows: [B, V] -> logits - freq * count - pres * (count > 0)."""
    c = rows.astype(jnp.float32)
    return (logits - sp.frequency_penalty[:, None] * c
            - sp.presence_penalty[:, None] * (c > 0).astype(jnp.float32))


def apply_logit_bias(logits: jax.Array, sp: SamplingArrays) -> jax.Array:
    """logits [B, V] + each row's logit_bias (sp.bias_ids / bias_values [B, K]; padding
    adds 0 to token 0). Like the penalties, before sampling and before logprobs."""
    rows = jnp.arange(logits.shape[0])[:, None]
    return logits.at[rows, sp.bias_ids].add(sp.bias_values)


def count_sampled(counts: jax.Array, tokens: jax.Array, src: TokenSource) -> jax.Array:
    """Add each request's sampled token [B] to its row when it is a real output."""
    return counts.at[src.req_row, tokens].add(src.count_sampled.astype(jnp.int32))
