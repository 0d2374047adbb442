"""Sparse MoE block (Qwen3-MoE, Mixtral, Qwen2-MoE, DeepSeek-V2/V3): a router, top-k
(optionally within the best expert groups), SwiGLU experts run as a sorted ragged matmul
(moe_ffn.py), plus an always-on shared expert where the model has one; no
capacity limit, so no token is ever dropped.

Routing (`route`), by config:
    scores   softmax(h @ router) | sigmoid(h @ router) (V3)
    choice   top-k of the scores (+ V3's selection bias), among the experts of the
             moe_topk_group best groups when grouped (V2: a group's best score; V3: the
             sum of its best two, bias included)
    gates    the chosen experts' scores (no bias), renormalised if norm_topk_prob, times
             routed_scaling_factor

Expert parallelism (a Layout), two forms (Layout.moe_dispatch):
    "psum": the T tokens are replicated on every device; each device runs the same sort
        over its own experts [e_first, e_first + E_local) and its slice of each expert's
        columns, then one psum over the expert and tensor axes combines them.
    "all_to_all": each device routes its share of the tokens to the experts' devices
        and back (moe_a2a.py).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from radixjax.model.config import ModelConfig
from radixjax.model.layers import linear
from radixjax.model.moe_a2a import all_to_all_experts
from radixjax.model.moe_ffn import expert_ffn
from radixjax.model.params import Params, layer_specs
from radixjax.parallel.rules import Layout


def route(h: jax.Array, router: jax.Array, cfg: ModelConfig,
          bias: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """h [T, D] f32, router [D, E], bias [E] (V3) -> (gates [T, k] f32, experts [T, k])."""
    logits = linear(h, router)  # [T, E]
    scores = jax.nn.sigmoid(logits) if cfg.moe_scoring == "sigmoid" else jax.nn.softmax(
        logits, axis=-1)
    choice = scores if bias is None else scores + bias
    if cfg.moe_topk_method != "greedy":
        t, e = choice.shape
        grouped = choice.reshape(t, cfg.moe_n_group, e // cfg.moe_n_group)
        if cfg.moe_topk_method == "noaux_tc":
            group_score = jax.lax.top_k(grouped, 2)[0].sum(axis=-1)  # [T, G]
        else:
            group_score = grouped.max(axis=-1)
        _, best = jax.lax.top_k(group_score, cfg.moe_topk_group)  # [T, topk_group]
        keep = jnp.zeros_like(group_score, dtype=bool).at[
            jnp.arange(t)[:, None], best].set(True)  # [T, G]
        keep = jnp.repeat(keep, e // cfg.moe_n_group, axis=1)  # [T, E]
        choice = jnp.where(keep, choice, -jnp.inf)
    _, experts = jax.lax.top_k(choice, cfg.num_experts_per_tok)
    gates = jnp.take_along_axis(scores, experts, axis=-1)
    if cfg.norm_topk_prob:
        gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
    return gates * cfg.routed_scaling_factor, experts.astype(jnp.int32)


def shared_expert(lp: Params, h: jax.Array) -> jax.Array:
    """The always-on expert (a dense SwiGLU MLP, TP-sharded like one) -> [T, D] f32;
    Qwen2-MoE scales it by sigmoid(h @ shared_gate)."""
    y = linear(jax.nn.silu(linear(h, lp["ws_gate"])) * linear(h, lp["ws_up"]), lp["ws_down"])
    if "shared_gate" in lp:
        y = y * jax.nn.sigmoid(linear(h, lp["shared_gate"]))
    return y


def moe_block(lp: Params, h: jax.Array, cfg: ModelConfig, layout: Layout | None,
              layer: int) -> jax.Array:
    """h [T, D] f32 (already normed) -> [T, D] f32: routed experts + the shared one."""
    y = _routed(lp, h, cfg, layout, layer)
    return y + shared_expert(lp, h) if "ws_gate" in lp else y


def _routed(lp: Params, h: jax.Array, cfg: ModelConfig, layout: Layout | None,
            layer: int) -> jax.Array:
    gates, experts = route(h, lp["router"], cfg, lp.get("router_bias"))
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

    if layout.moe_dispatch == "all_to_all" and expert_axes:
        tensor_axes = tuple(a for a in reduce_axes if a not in expert_axes)
        local = partial(all_to_all_experts, expert_axes=expert_axes,
                        ep=layout.axes_size(expert_axes), reduce_axes=tensor_axes)

    # check_vma off for the all-to-all form: its all_gather'd output is replicated, which
    # shard_map's static check cannot see
    return jax.shard_map(local, mesh=layout.mesh, in_specs=(P(), P(), P(), *parts),
                         out_specs=P(), check_vma=False)(h, gates, experts, *w)


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axes (a lone axis may come as a str)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)
