"""Grammar token bitmask inside the jitted step: bit t of mask[b] (int32 words, xgrammar's
layout, filled on the host) allows token t for row b; disallowed logits become -inf.
Rows without a grammar are all ones, so they keep every token."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row: bit t % 32 of word t // 32 is token t."""
    return (vocab_size + 31) // 32


def apply_token_bitmask(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """logits [B, V] f32, mask [B, ceil(V / 32)] int32 -> logits [B, V]."""
    vocab = logits.shape[-1]
    bit = jnp.arange(32, dtype=jnp.int32)
    allowed = (mask[:, :, None] >> bit) & 1  # [B, W, 32]; >> is arithmetic, & 1 fixes it
    allowed = allowed.reshape(mask.shape[0], -1)[:, :vocab].astype(bool)  # [B, V]
    return jnp.where(allowed, logits, -jnp.inf)
