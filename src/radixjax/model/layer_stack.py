"""Decoder layers stacked for `lax.scan`.

Consecutive layers of one kind (the same sliding window and MLP type: the same code) form
a group whose weights are stacked along a new leading axis; the forward scans each group.
A step program then holds one copy of each kind's code instead of num_layers copies, and
XLA's compile time follows the code: SmolLM2's forward compiled in ~8 s unrolled and
~1.7 s scanned, and ran as fast (benchmarks/README.md, bounded compilation).

    checkpoint params["layers"]: [{name: [...]}] * L       (loaders, sharding rules)
    stacked params["groups"]:    [{name: [n, ...]}] * G    (what `forward` runs)

The dense layer matrices are stacked transposed, `OutIn(wt [n, O, I])`: XLA reads them
in place for the small steps' vector products instead of copying each layer's slice
(model/dense_weights.py).

Weights packed for oneDNN (model/quant.py PackedInt8Weight) and weights in their GGUF
blocks (model/gguf_blocks.py) are not scanned: each layer's products read the whole stack
at the layer's index or offsets (`split_resident` / `join_resident`), so no slice of them
is copied.

The layers unrolled over per-layer arrays (no weight slices at all; an option until the
twelfth session) decoded SmolLM2 B = 1 in 35 ms against the scan's 60 before the scan
stored its matrices (out, in); since then the scan is the faster (B = 1 ~32 vs ~37 ms)
and compiles ~4x faster (benchmarks/README.md "Dense weights stored (out, in)").
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from radixjax.model import gguf_blocks
from radixjax.model.config import ModelConfig
from radixjax.model.dense_weights import LINEAR_WEIGHTS, OutIn
from radixjax.model.gguf_blocks import BlockWeight
from radixjax.model.params import Params
from radixjax.model.quant import PackedInt8Weight


class LayerGroup(NamedTuple):
    start: int  # first layer (its kind is the group's: window, MLP type)
    stop: int  # one past the last


def layer_kind(cfg: ModelConfig, layer: int) -> tuple:
    """What a layer's code depends on besides its weights."""
    return cfg.sliding_windows[layer], cfg.is_sparse(layer)


def layer_groups(cfg: ModelConfig) -> tuple[LayerGroup, ...]:
    """Runs of consecutive layers of one kind, in order."""
    groups: list[LayerGroup] = []
    for i in range(cfg.num_layers):
        if groups and layer_kind(cfg, i) == layer_kind(cfg, groups[-1].start):
            groups[-1] = groups[-1]._replace(stop=i + 1)
        else:
            groups.append(LayerGroup(i, i + 1))
    return tuple(groups)


def _stacked(leaves: tuple[jax.Array, ...], transpose: bool) -> jax.Array:
    """One program writes the stacked array: no per-leaf transposed temporaries (for
    SmolLM2 they would be a third copy of the layer weights while a runner is built)."""
    return jnp.stack([jnp.swapaxes(x, -1, -2) if transpose else x for x in leaves])


_stacked_jit = jax.jit(_stacked, static_argnames="transpose")


def _stack(leaves: list[jax.Array], transpose: bool = False) -> jax.Array:
    """[n] arrays of one shape -> [n, ...] (transpose: [n, ..., b, a] from [..., a, b]),
    sharded as each leaf was (layer axis whole; transposed: its last two axes swapped)."""
    sharding = getattr(leaves[0], "sharding", None)
    if isinstance(sharding, NamedSharding):
        spec = [*sharding.spec, *[None] * (leaves[0].ndim - len(sharding.spec))]
        if transpose:
            spec[-2:] = spec[-1], spec[-2]
        out = NamedSharding(sharding.mesh, PartitionSpec(None, *spec))
        return jax.jit(_stacked, static_argnames="transpose", out_shardings=out)(
            tuple(leaves), transpose=transpose)
    return _stacked_jit(tuple(leaves), transpose=transpose)


def _stack_leaf(name: str, leaves: list) -> object:
    """One leaf of a group: a dense layer matrix as OutIn, GGUF blocks one layer after
    another (gguf_blocks.stack), anything else as it is (an Int8Weight stacked field by
    field)."""
    if isinstance(leaves[0], gguf_blocks.GGUF_WEIGHTS):
        return gguf_blocks.stack(leaves)
    if name in LINEAR_WEIGHTS and isinstance(leaves[0], jax.Array):
        return OutIn(_stack(leaves, transpose=True))
    return jax.tree.map(lambda *xs: _stack(list(xs)), *leaves)


def stack_layers(cfg: ModelConfig, params: Params) -> Params:
    """Checkpoint-shaped params -> stacked (a copy of the layer weights; the other leaves
    are shared)."""
    out = {k: v for k, v in params.items() if k != "layers"}
    layers = params["layers"]
    out["groups"] = [
        {name: _stack_leaf(name, [layers[i][name] for i in range(g.start, g.stop)])
         for name in layers[g.start]}
        for g in layer_groups(cfg)
    ]
    return out


def split_resident(weights: Params) -> tuple[Params, dict[str, jax.Array]]:
    """A group's stacked weights -> (what the scan slices per layer, the stacks that stay
    whole: {name: packed int8 [n, parts, P] or GGUF blocks [bytes]})."""
    resident = {k: v.packed for k, v in weights.items() if isinstance(v, PackedInt8Weight)}
    resident |= {k: v.data for k, v in weights.items() if isinstance(v, BlockWeight)}

    def scanned(k: str, v: object) -> object:
        if isinstance(v, BlockWeight):
            return BlockWeight(None, v.segs, v.rows, v.k)  # each layer's segs row
        return v._replace(packed=None) if k in resident else v
    return {k: scanned(k, v) for k, v in weights.items()}, resident


def join_resident(lp: Params, resident: dict[str, jax.Array], layer: jax.Array) -> Params:
    """One layer's sliced weights with the resident stacks read at `layer` (its index
    within the group; GGUF blocks: at the layer's own segment offsets)."""
    def joined(v: object, w: jax.Array) -> object:
        if isinstance(v, BlockWeight):
            return BlockWeight(w, v.segs, v.rows, v.k)
        return v._replace(packed=w, layer=layer)
    return {**lp, **{k: joined(lp[k], w) for k, w in resident.items()}}
