"""Stateless building blocks: RMSNorm, RoPE, linear. Activations are float32; weights may
be bfloat16, in which case matmuls run as dot(bf16, bf16) -> f32 (shared/DESIGN.md §3),
stored transposed for the layer scan (model/dense_weights.py), or int8 (W8A8,
model/quant.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.config import LinearScaling, ModelConfig, RopeScaling, YarnScaling
from radixjax.model.dense_weights import FUSED_WEIGHTS, OutIn, out_in_linear
from radixjax.model.gguf_blocks import GGUF_WEIGHTS, BlockWeight, block_linear
from radixjax.model.params import Params
from radixjax.model.quant import Int8Weight, PackedInt8Weight, int8_linear


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x: [..., D] f32, weight: [D] -> [..., D] f32. The mean of squares is summed in a
    fixed order (row_sum), so a row's result is the same bits in any batch."""
    var = row_sum(jnp.square(x)) / x.shape[-1]
    return x * jax.lax.rsqrt(var + eps) * weight


def row_sum(x: jax.Array) -> jax.Array:
    """x [..., D] -> [..., 1]: each row summed by halving (the upper half added to the
    lower, an odd last column to the first), elementwise adds in an order fixed by D.
    XLA's own reduction sums a row in an order that changes with the number of rows (a
    [1, 576] row and the same row among 8 differ in the last bit), which the batch
    invariance of deterministic inference cannot have."""
    while x.shape[-1] > 1:
        w = x.shape[-1]
        if w % 2:
            x = jnp.concatenate([x[..., :1] + x[..., w - 1:], x[..., 1:w - 1]], axis=-1)
        else:
            x = x[..., :w // 2] + x[..., w // 2:]
    return x


def linear(x: jax.Array, w: jax.Array | OutIn | Int8Weight | PackedInt8Weight | BlockWeight,
           b: jax.Array | None = None) -> jax.Array:
    """x: [T, I] f32, w: [I, O] (f32 or bf16), the same stored [O, I] (OutIn), int8
    (model/quant.py) or in its GGUF blocks (model/gguf_blocks.py) -> [T, O] f32."""
    if isinstance(w, GGUF_WEIGHTS):
        y = block_linear(x, w)
    elif isinstance(w, OutIn):
        y = out_in_linear(x, w)
    elif isinstance(w, Int8Weight | PackedInt8Weight):
        y = int8_linear(x, w)
    else:
        y = jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32)
    return y if b is None else y + b


def fused_linear(x: jax.Array, lp: Params, name: str,
                 sizes: tuple[int, ...]) -> list[jax.Array]:
    """x [T, I] times each part of FUSED_WEIGHTS[name] (+ its bias, "wq" -> "bq") ->
    [T, O_i] each (sizes: the O_i): one product where lp holds them fused (int8 layer
    matrices, model/quant.py), else one per part."""
    parts = FUSED_WEIGHTS[name]
    biases = [lp.get("b" + p[1:]) for p in parts]
    if name not in lp:
        return [linear(x, lp[p], b) for p, b in zip(parts, biases, strict=True)]
    ys = jnp.split(linear(x, lp[name]), np.cumsum(sizes)[:-1].tolist(), axis=1)
    return [y if b is None else y + b for y, b in zip(ys, biases, strict=True)]


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> np.ndarray:
    """[rope_dim // 2] float32 inverse frequencies, with Llama-3, YaRN or linear scaling;
    local: a sliding-window layer's, where it has a base of its own (Gemma 3: unscaled)."""
    dim = cfg.rope_dim
    local = local and cfg.local_rope_theta is not None
    theta = cfg.local_rope_theta if local else cfg.rope_theta
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    s = None if local else cfg.rope_scaling
    if isinstance(s, LinearScaling):
        inv_freq = inv_freq / s.factor
    elif isinstance(s, RopeScaling):
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
    elif isinstance(s, YarnScaling):
        inv_freq = _yarn_inv_freq(s, inv_freq, dim, cfg.rope_theta)
    return inv_freq.astype(np.float32)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(cfg: ModelConfig) -> float:
    """YaRN's scale on cos/sin (1 without YaRN)."""
    s = cfg.rope_scaling
    if not isinstance(s, YarnScaling):
        return 1.0
    if s.attention_factor is not None:
        return float(s.attention_factor)
    if s.mscale and s.mscale_all_dim:
        return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    return yarn_mscale(s.factor)


def _yarn_inv_freq(s: YarnScaling, inv_freq: np.ndarray, dim: int, base: float) -> np.ndarray:
    """Extrapolated (high-frequency) dims kept, interpolated (low-frequency) dims divided
    by the factor, a linear ramp between the correction range's ends."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp
    return inv_freq / s.factor * (1 - extrapolate) + inv_freq * extrapolate


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray,
                 attention_factor: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """positions: [T] int32 -> cos, sin: [T, rope_dim] f32 (HF's rotate-half layout)."""
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    if attention_factor == 1.0:
        return jnp.cos(emb), jnp.sin(emb)
    return jnp.cos(emb) * attention_factor, jnp.sin(emb) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [T, H, Dh]; cos/sin: [T, Dh] -> [T, H, Dh]. Pairs dim i with i + Dh/2."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return exact_products_sum(x, cos[:, None, :], rotated, sin[:, None, :])


def _split12(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """f32 x -> (hi, lo), x == hi + lo exactly, each with at most 12 significant bits."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-4096)  # 0xFFFFF000
    hi = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return hi, x - hi


def exact_products_sum(a: jax.Array, b: jax.Array, c: jax.Array, d: jax.Array) -> jax.Array:
    """a * b + c * d (f32, broadcasting) from products that are all exact (12-bit halves
    of each factor), summed in a fixed order: the same bits whether or not the compiler
    fuses a product and a sum into one FMA, which XLA's CPU backend does in some programs
    and not in others (a token's rotary keys then changed with the step's batch size)."""
    (ah, al), (bh, bl), (ch, cl), (dh, dl) = (_split12(v) for v in (a, b, c, d))
    return (((ah * bh + ch * dh) + (ah * bl + al * bh + ch * dl + cl * dh))
            + (al * bl + cl * dl))
