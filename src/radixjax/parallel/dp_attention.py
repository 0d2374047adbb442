"""DP attention on the mesh: attention data-parallel over the batch, the rest of the layer
tensor/expert-parallel over the same devices (SGLang's --enable-dp-attention with
dp = tp). MLA's single latent head cannot be split over TP ranks, so under plain TP every
device holds the whole latent pool; under DP attention each holds only its own requests'.

A step carries one chunk per DP rank (engine/dp_attention.py builds it):

    tokens [T = N * Tl]    | rank 0's Tl tokens | rank 1's | ... |   split over the mesh
    requests [B = N * Bl]  | rank 0's Bl        | rank 1's | ... |
    pool rows              | rank 0: L * S      | rank 1   | ... |   (rank-major)

Slots are each rank's own (0 .. S-1, slot 0 its dummy); request rows are global (rank r's
rows r * (R + 1) ..) in a req_to_token table every device holds whole. Inside the
attention's shard_map a device sees its chunk and turns the metadata local: token_req
and q_start minus its chunk's offset, layer_base = layer * S. The projections before
attention run on each device's own tokens (`shard_tokens`); the residual stream is
gathered back to replicated after the output projection, so the MLP / MoE runs as under
TP (weights split over every device) on all tokens.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from radixjax.model.attention import AttentionBackend, AttentionMetadata
from radixjax.parallel.rules import Layout


def dp_axes(layout: Layout) -> tuple[str, ...]:
    return layout.active_axes("slots")


def shard_tokens(x: jax.Array, layout: Layout | None) -> jax.Array:
    """[T, ...] -> the same, each DP rank computing its own chunk (no-op without DP)."""
    if layout is None or not layout.dp_attention:
        return x
    spec = P(dp_axes(layout), *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(layout.mesh, spec))


def md_specs(axes: tuple[str, ...]) -> AttentionMetadata:
    """shard_map specs of the metadata: per-token and per-request arrays split into the
    ranks' chunks, the table and the layer base whole."""
    return AttentionMetadata(*(P(axes),) * 7, req_to_token=P(), layer_base=P(),
                             shared_len=P(axes))


def local_md(md: AttentionMetadata, axes: tuple[str, ...], num_layers: int,
             pool_rows: int) -> AttentionMetadata:
    """Inside the shard_map: this rank's chunk with local indices. pool_rows: the local
    pool's rows (num_layers * S)."""
    rank = jax.lax.axis_index(axes)
    num_ranks = jax.lax.axis_size(axes)
    tl, bl = md.positions.shape[0], md.q_len.shape[0]
    slots = pool_rows // num_layers
    layer = md.layer_base // (slots * num_ranks)  # the forward's base counts global slots
    return md._replace(token_req=jnp.clip(md.token_req - rank * bl, 0, bl - 1),
                       q_start=jnp.clip(md.q_start - rank * tl, 0, tl),
                       layer_base=layer * slots)


def dp_sharded_attention(backend: AttentionBackend, layout: Layout,
                         num_layers: int) -> AttentionBackend:
    """Runs `backend` on each DP rank's tokens against its own pool rows."""
    axes = dp_axes(layout)
    chunk = P(axes, None, None)  # [T, H, D] tokens and [rows, H, D] pools

    def call(q, k_new, v_new, k_pool, v_pool, md, window, scale):
        local = partial(_local, backend=backend, axes=axes, num_layers=num_layers,
                        window=window, scale=scale)
        fn = jax.shard_map(local, mesh=layout.mesh, in_specs=(chunk,) * 5 + (md_specs(axes),),
                           out_specs=(chunk,) * 3, check_vma=False)
        return fn(q, k_new, v_new, k_pool, v_pool, md)

    return call


def _local(q, k_new, v_new, k_pool, v_pool, md, *, backend, axes, num_layers, window, scale):
    md = local_md(md, axes, num_layers, k_pool.shape[0])
    return backend(q, k_new, v_new, k_pool, v_pool, md, window, scale)
