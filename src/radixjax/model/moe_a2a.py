"""Expert parallelism by all-to-all (`Layout.moe_dispatch == "all_to_all"`), beside the
psum form in moe.py. Inside one shard_map over the mesh, per device on the expert axis
(ep of them, each holding El = E / ep experts):

    my tokens      h[me*Tl : (me+1)*Tl]                 Tl = T / ep (T padded to a multiple)
    dispatch       each (token, choice) row goes to the device holding its expert:
                   send [ep, C, D] (block j: rows for device j, C = Tl*k, so none is ever
                   dropped) + their local expert ids [ep, C] (El: an empty row)
    all_to_all     recv [ep, C, D]: block j = the rows device j sent me
    experts        expert_ffn over the received rows (gate 1 each); the tensor axis's
                   column halves add up with one psum
    all_to_all     back: block j = my rows' results from device j
    combine        out_mine[token] += gate * result; all_gather over the expert axis ->
                   [T, D] replicated, as the residual stream is

Communication per device: 2 x T*k*D / ep rows' worth in, the same out, and one all_gather
of [T, D], instead of the psum's all-reduce of [T, D] over every device; the expert
compute runs over T*k rows either way (no capacity limit). Which is faster here is
measured (benchmarks/moe_dispatch.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixjax.model.moe_ffn import expert_ffn


def all_to_all_experts(
    h: jax.Array,  # [T, D] f32, replicated
    gates: jax.Array,  # [T, k] f32
    experts: jax.Array,  # [T, k] int32 global expert ids
    wg: jax.Array,  # [El, D, F'] this device's experts (F': its columns)
    wu: jax.Array,  # [El, D, F']
    wd: jax.Array,  # [El, F', D]
    *,
    expert_axes: tuple[str, ...],
    ep: int,
    reduce_axes: tuple[str, ...],
) -> jax.Array:
    """The shard_map body: -> [T, D] f32 replicated."""
    num_tokens, k = experts.shape
    num_local = wg.shape[0]
    pad = -num_tokens % ep
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        gates = jnp.pad(gates, ((0, pad), (0, 0)))  # gate 0: padded rows add nothing
        experts = jnp.pad(experts, ((0, pad), (0, 0)))
    tl = h.shape[0] // ep
    me = jax.lax.axis_index(expert_axes)
    h_mine = jax.lax.dynamic_slice_in_dim(h, me * tl, tl)  # [Tl, D]
    g_mine = jax.lax.dynamic_slice_in_dim(gates, me * tl, tl).reshape(-1)  # [M = Tl*k]
    e_mine = jax.lax.dynamic_slice_in_dim(experts, me * tl, tl).reshape(-1)  # [M]
    m = tl * k
    dest = e_mine // num_local  # [M] the device holding each row's expert
    order = jnp.argsort(dest, stable=True)
    sorted_dest = dest[order]
    counts = jnp.bincount(dest, length=ep)
    pos = jnp.arange(m) - (jnp.cumsum(counts) - counts)[sorted_dest]  # place in its block
    token = order // k  # [M] the token of each sorted row
    send = jnp.zeros((ep, m, h.shape[1]), jnp.float32).at[sorted_dest, pos].set(h_mine[token])
    send_ids = jnp.full((ep, m), num_local, jnp.int32).at[sorted_dest, pos].set(
        e_mine[order] % num_local)

    def a2a(x: jax.Array) -> jax.Array:
        return jax.lax.all_to_all(x, expert_axes, 0, 0, tiled=True)

    recv, recv_ids = a2a(send), a2a(send_ids)  # [ep, M, D], [ep, M]
    rows = recv.reshape(ep * m, -1)
    y = expert_ffn(rows, jnp.ones((ep * m, 1), jnp.float32), recv_ids.reshape(-1, 1),
                   wg, wu, wd, 0)  # [ep*M, D]; empty rows (id El) come out 0
    if reduce_axes:
        y = jax.lax.psum(y, reduce_axes)
    back = a2a(y.reshape(ep, m, -1))  # [ep, M, D]: my rows' results
    weighted = back[sorted_dest, pos] * g_mine[order][:, None]  # [M, D]
    out = jnp.zeros((tl, h.shape[1]), jnp.float32).at[token].add(weighted)
    full = jax.lax.all_gather(out, expert_axes, tiled=True)  # [T + pad, D]
    return full[:num_tokens]
