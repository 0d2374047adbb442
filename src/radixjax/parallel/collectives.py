"""The explicit collectives (shard_map) of the TP forward, where GSPMD alone could pick a
slow or memory-hungry plan: attention per KV-head shard, the vocab-parallel embedding
lookup, and the vocab-parallel head. Dense matmuls (wq/wk/wv/wo, MLP) are left to GSPMD:
column-parallel in, row-parallel out, one all-reduce per block."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from radixjax.model.attention import AttentionBackend, AttentionMetadata
from radixjax.parallel.rules import Layout


def sharded_attention(backend: AttentionBackend, layout: Layout) -> AttentionBackend:
    """Runs `backend` on each device's KV heads (and their query heads): no collective,
    the pool never leaves its shard. Works for the native and the pallas backend."""
    axes = layout.active_axes("kv_heads")
    heads = P(None, axes or None, None)  # [T or S, H, Dh] split over H

    def call(q: jax.Array, k_new: jax.Array, v_new: jax.Array, k_pool: jax.Array,
             v_pool: jax.Array, md: AttentionMetadata, window: int | None,
             scale: float) -> tuple[jax.Array, jax.Array, jax.Array]:
        local = partial(_local_attention, backend=backend, window=window, scale=scale)
        fn = jax.shard_map(local, mesh=layout.mesh, in_specs=(heads,) * 5 + (P(),),
                           out_specs=(heads, heads, heads), check_vma=False)
        return fn(q, k_new, v_new, k_pool, v_pool, md)

    return call


def _local_attention(q, k_new, v_new, k_pool, v_pool, md, *, backend, window, scale):
    return backend(q, k_new, v_new, k_pool, v_pool, md, window, scale)


def vocab_parallel_embed(table: jax.Array, ids: jax.Array, layout: Layout) -> jax.Array:
    """table [V, D] split over V, ids [T] -> [T, D] f32 replicated: each device looks up
    the ids in its rows (zeros elsewhere), one psum adds the pieces (exact)."""
    axes = layout.active_axes("vocab")

    def local(tab: jax.Array, ids: jax.Array) -> jax.Array:  # tab [V/n, D]
        rows = tab.shape[0]
        off = ids - jax.lax.axis_index(axes) * rows
        ok = (off >= 0) & (off < rows)
        x = jnp.where(ok[:, None], tab[jnp.clip(off, 0, rows - 1)], 0).astype(jnp.float32)
        return jax.lax.psum(x, axes)

    return jax.shard_map(local, mesh=layout.mesh, in_specs=(P(axes, None), P()),
                         out_specs=P())(table, ids)


def vocab_parallel_head(w: jax.Array, h: jax.Array, layout: Layout, head_fn) -> jax.Array:
    """w [V, D] split over V, h [N, D] -> logits [N, V] f32 split over V (no gather here;
    sampling gathers what it needs). head_fn(w_local, h) is the single-device head."""
    axes = layout.active_axes("vocab")
    return jax.shard_map(head_fn, mesh=layout.mesh, in_specs=(P(axes, None), P()),
                         out_specs=P(None, axes))(w, h)
