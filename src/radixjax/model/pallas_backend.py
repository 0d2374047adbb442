"""The "pallas" attention backend: `AttentionMetadata` in, the Pallas kernels of
`pallas_kernels/` underneath (KV write, then ragged paged attention).

With page size P the allocator hands out whole pages, so a request's slots are
page-aligned and its page table is every P-th slot of its req_to_token row divided by P:

    req_to_token[row] = [p0*P, p0*P+1, .., p0*P+P-1, p1*P, ..]  ->  pages = [p0, p1, ..]

and the pool [L * S, Hkv, Dh] is viewed (free reshape) as [L * S/P, P, Hkv, Dh]; this
layer's pages start at page layer_base / P (S is a multiple of P).
P = 1 is always valid (every slot its own page), whatever the allocator's page size.
Interpret mode (CPU) is decided once, in `pallas_kernels.compat`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.blocks import choose_blocks
from pallas_kernels.kv_write import write_kv_pages
from pallas_kernels.ragged_attention import ragged_paged_attention
from radixjax.model.attention import AttentionMetadata


def page_table_from_slots(kv_slots: jax.Array, page_size: int) -> jax.Array:
    """[B, K] page-aligned slots -> [B, ceil(K / P)] page ids (padding: the dummy page 0)."""
    return kv_slots[:, ::page_size] // page_size


def page_table(md: AttentionMetadata, page_size: int) -> jax.Array:
    """[B, C / P] page ids of each request's req_to_token row (C: the table width), in
    this layer's pages."""
    return page_table_from_slots(md.req_to_token[md.req_row] + md.layer_base, page_size)


def cu_q_lens_from(md: AttentionMetadata) -> jax.Array:
    """[B + 1]: requests are packed back to back (padded ones empty, at the end)."""
    return jnp.concatenate([md.q_start, (md.q_start[-1] + md.q_len[-1])[None]])


def pallas_attention(
    q: jax.Array,  # [T, Hq, Dh] f32
    k_new: jax.Array,  # [T, Hkv, Dh]
    v_new: jax.Array,  # [T, Hkv, Dh]
    k_pool: jax.Array,  # [L * S, Hkv, Dh], donated by the caller
    v_pool: jax.Array,  # [L * S, Hkv, Dh]
    md: AttentionMetadata,
    window: int | None,
    scale: float,
    *,
    page_size: int = 1,
    soft_cap: float | None = None,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`AttentionBackend` contract (see model/attention.py); out [T, Hq, Dh] f32, zeros
    for padded tokens. soft_cap: optional logit cap (no supported family uses one)."""
    num_slots, num_kv_heads, head_dim = k_pool.shape
    if num_slots % page_size:
        raise ValueError(f"pool of {num_slots} slots is not a multiple of page {page_size}")
    paged = (num_slots // page_size, page_size, num_kv_heads, head_dim)
    k_pages, v_pages = write_kv_pages(
        k_pool.reshape(paged), v_pool.reshape(paged), k_new, v_new, md.out_slots + md.layer_base,
        interpret=interpret,
    )
    # Static bounds from the step's shape only (T tokens, the table's width): the kernel
    # skips tiles past each request's q_len and key blocks past its kv_len.
    num_tokens = q.shape[0]
    blocks = choose_blocks(md.q_len.shape[0], num_kv_heads, num_tokens,
                           md.req_to_token.shape[1])
    out = ragged_paged_attention(
        q, k_pages, v_pages, page_table(md, page_size),
        cu_q_lens_from(md), md.kv_len, scale=scale, max_q=num_tokens, window=window,
        soft_cap=soft_cap, blocks=blocks, interpret=interpret,
    )
    return out, k_pages.reshape(k_pool.shape), v_pages.reshape(v_pool.shape)
