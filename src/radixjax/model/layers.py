"""Stateless building blocks: RMSNorm, RoPE, linear. Activations are float32; weights may
be bfloat16, in which case matmuls run as dot(bf16, bf16) -> f32 (shared/DESIGN.md §3)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.config import ModelConfig


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x: [..., D] f32, weight: [D] -> [..., D] f32."""
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + eps) * weight


def linear(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """x: [T, I] f32, w: [I, O] (f32 or bf16) -> [T, O] f32."""
    y = jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32)
    return y if b is None else y + b


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """[head_dim // 2] float32 inverse frequencies, with Llama-3 scaling when configured."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    s = cfg.rope_scaling
    if s is not None:
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(is_medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """positions: [T] int32 -> cos, sin: [T, head_dim] f32 (HF's rotate-half layout)."""
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [T, H, Dh]; cos/sin: [T, Dh] -> [T, H, Dh]. Pairs dim i with i + Dh/2."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
