"""Sparse MoE block (Qwen3-MoE, Mixtral): softmax router, top-k, optional renormalised
gates, SwiGLU experts run as a sorted ragged matmul (`jax.lax.ragged_dot`); no capacity
limit, so no token is ever dropped.

    assignments (T*k)  --sort by expert-->  [ e0 e0 e0 | e1 | e2 e2 | ... | other ]
                                              group_sizes = [3, 1, 2, ...]
    ragged_dot(x_sorted [M, D], we [E, D, F], group_sizes) -> [M, F]; rows past the
    groups (assignments to experts this device does not hold) come out 0.

Expert parallelism (a Layout): the T tokens are replicated on every device; each device
runs the same sort over its own experts [e_first, e_first + E_local) and its slice of
each expert's columns, then one psum over the expert and tensor axes combines them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from radixjax.model.config import ModelConfig
from radixjax.model.layers import linear
from radixjax.model.params import Params, layer_specs
from radixjax.parallel.rules import Layout


def route(h: jax.Array, router: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """h [T, D] f32, router [D, E] -> (gates [T, k] f32, experts [T, k] int32)."""
    probs = jax.nn.softmax(linear(h, router), axis=-1)  # [T, E]
    gates, experts = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return gates, experts.astype(jnp.int32)


def expert_ffn(
    h: jax.Array,  # [T, D] f32
    gates: jax.Array,  # [T, k] f32
    experts: jax.Array,  # [T, k] int32, global expert ids
    we_gate: jax.Array,  # [El, D, F'] the local experts (F' = F or this device's columns)
    we_up: jax.Array,  # [El, D, F']
    we_down: jax.Array,  # [El, F', D]
    first_expert: jax.Array | int,  # global id of local expert 0
) -> jax.Array:
    """sum_k gate * expert_k(h) over the assignments to the local experts -> [T, D] f32."""
    num_tokens, k = experts.shape
    num_local = we_gate.shape[0]
    local = experts.reshape(-1) - first_expert  # [M = T*k]
    mine = (local >= 0) & (local < num_local)
    key = jnp.where(mine, local, num_local)  # other experts sort last
    order = jnp.argsort(key, stable=True)  # [M]
    group_sizes = jnp.bincount(key, length=num_local + 1)[:num_local].astype(jnp.int32)
    token = order // k  # [M] the token of each sorted assignment
    xs = h[token].astype(we_gate.dtype)  # [M, D]

    def dot(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x.astype(w.dtype), w, group_sizes,
                                  preferred_element_type=jnp.float32)

    act = jax.nn.silu(dot(xs, we_gate)) * dot(xs, we_up)  # [M, F']
    y = dot(act, we_down)  # [M, D], 0 for other experts' rows
    weight = jnp.where(mine, gates.reshape(-1), 0.0)[order]  # [M]
    return jnp.zeros((num_tokens, h.shape[1]), jnp.float32).at[token].add(y * weight[:, None])


def moe_block(lp: Params, h: jax.Array, cfg: ModelConfig, layout: Layout | None,
              layer: int) -> jax.Array:
    """h [T, D] f32 (already normed) -> [T, D] f32."""
    gates, experts = route(h, lp["router"], cfg)
    w = (lp["we_gate"], lp["we_up"], lp["we_down"])
    if layout is None:
        return expert_ffn(h, gates, experts, *w, 0)
    specs = layer_specs(cfg, layer)
    parts = [layout.partition(specs[n].logical_axes, specs[n].shape)
             for n in ("we_gate", "we_up", "we_down")]
    expert_axes = _axes(parts[0][0])  # () when the experts are replicated
    reduce_axes = tuple(a for entry in parts[2] for a in _axes(entry))

    def local(h, gates, experts, wg, wu, wd):
        first = jax.lax.axis_index(expert_axes) * wg.shape[0] if expert_axes else 0
        y = expert_ffn(h, gates, experts, wg, wu, wd, first)
        return jax.lax.psum(y, reduce_axes) if reduce_axes else y

    return jax.shard_map(local, mesh=layout.mesh, in_specs=(P(), P(), P(), *parts),
                         out_specs=P())(h, gates, experts, *w)


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axes (a lone axis may come as a str)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)
