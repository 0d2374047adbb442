"""Pure-jnp references with exactly the kernels' interfaces: the kernels' tests compare
against these. Dense and simple on purpose (a [T, K] gather per token): tiny shapes only."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.blocks import DEFAULT_BLOCKS, AttentionBlocks


def ragged_paged_attention_ref(
    q: jax.Array,  # [T, Hq, D]
    k_pages: jax.Array,  # [N, P, Hkv, D]
    v_pages: jax.Array,  # [N, P, Hkv, D]
    page_table: jax.Array,  # [B, max_pages] int32
    cu_q_lens: jax.Array,  # [B + 1] int32
    kv_lens: jax.Array,  # [B] int32
    *,
    scale: float,
    max_q: int | None = None,
    window: int | None = None,
    soft_cap: float | None = None,
    blocks: AttentionBlocks = DEFAULT_BLOCKS,
    interpret: bool | None = None,
) -> jax.Array:
    """Same contract as `ragged_attention.ragged_paged_attention` (max_q, blocks and
    interpret are accepted and ignored)."""
    del max_q, blocks, interpret
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    t = jnp.arange(num_tokens)
    req = jnp.clip(jnp.searchsorted(cu_q_lens, t, side="right") - 1, 0, kv_lens.shape[0] - 1)
    q_len = cu_q_lens[req + 1] - cu_q_lens[req]  # [T]
    q_pos = kv_lens[req] - q_len + (t - cu_q_lens[req])  # [T]

    k_seq = k_pages[page_table]  # [B, max_pages, P, Hkv, D]
    k_seq = k_seq.reshape(k_seq.shape[0], -1, num_kv_heads, head_dim).astype(jnp.float32)
    v_seq = v_pages[page_table].reshape(k_seq.shape).astype(jnp.float32)
    k_tok, v_tok = k_seq[req], v_seq[req]  # [T, K, Hkv, D]
    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim)
    s = jnp.einsum("thgd,tkhd->thgk", qg, k_tok, precision="highest") * scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    k_pos = jnp.arange(k_tok.shape[1])[None, :]  # [1, K]
    mask = (k_pos <= q_pos[:, None]) & (k_pos < kv_lens[req][:, None])  # [T, K]
    if window is not None:
        mask &= k_pos > q_pos[:, None] - window
    s = jnp.where(mask[:, None, None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("thgk,tkhd->thgd", p, v_tok, precision="highest")
    out = out.reshape(num_tokens, num_q_heads, head_dim)
    is_real = t < cu_q_lens[-1]
    return jnp.where(is_real[:, None, None], out, 0.0)


def write_kv_pages_ref(
    k_pages: jax.Array,  # [N, P, Hkv, D]
    v_pages: jax.Array,  # [N, P, Hkv, D]
    k_new: jax.Array,  # [T, Hkv, D]
    v_new: jax.Array,  # [T, Hkv, D]
    slots: jax.Array,  # [T] int32
    *,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Same contract as `kv_write.write_kv_pages` (interpret is ignored)."""
    del interpret
    shape = k_pages.shape
    flat = (shape[0] * shape[1], *shape[2:])
    k = k_pages.reshape(flat).at[slots].set(k_new.astype(k_pages.dtype))
    v = v_pages.reshape(flat).at[slots].set(v_new.astype(v_pages.dtype))
    return k.reshape(shape), v.reshape(shape)
