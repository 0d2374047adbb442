"""The one table of logical-axis -> mesh-axis rules, and `Layout`: a mesh with that
table, which turns a leaf's logical axes into a PartitionSpec / NamedSharding.

| logical axis | mesh axes            | leaves                                         |
|--------------|----------------------|------------------------------------------------|
| q_heads      | (expert, tensor)     | wq, bq columns; wo rows                        |
| kv_heads     | (expert, tensor)     | wk, wv, bk, bv; the KV pool's head axis        |
| mlp          | (expert, tensor)     | dense w_gate / w_up columns, w_down rows       |
| vocab        | (expert, tensor)     | embedding and head rows (vocab-parallel)       |
| experts      | (expert,)            | we_gate / we_up / we_down expert axis          |
| expert_mlp   | (tensor,)            | each expert's columns (gate/up) / rows (down)  |
| embed, head_dim, router, slots, latent | replicated | norms, router, MLA latents |

DP attention (`layout_for(.., dp_attention=True)`, parallel/dp_attention.py) swaps three
rows: q_heads and kv_heads replicated (each device attends its own requests with every
head), slots split over (expert, tensor): the pool's rows, one chunk per device.

A dimension the mesh axes do not divide is replicated (vocab, mlp, expert_mlp, experts);
heads never are: `shard_params.check_divisible` rejects such a layout first, and KV heads
fewer than the TP ranks are replicated by repeating them (shard_params.kv_repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from radixjax.model.forms import MOE_DISPATCH
from radixjax.parallel.mesh import EXPERT_AXIS, TENSOR_AXIS, MeshConfig, make_mesh

Rules = tuple[tuple[str, tuple[str, ...]], ...]

TP_AXES = (EXPERT_AXIS, TENSOR_AXIS)
DEFAULT_RULES: Rules = (
    ("q_heads", TP_AXES),
    ("kv_heads", TP_AXES),
    ("mlp", TP_AXES),
    ("vocab", TP_AXES),
    ("experts", (EXPERT_AXIS,)),
    ("expert_mlp", (TENSOR_AXIS,)),
    ("embed", ()),
    ("head_dim", ()),
    ("router", ()),
    ("slots", ()),
    ("latent", ()),
)
DP_ATTENTION_RULES: Rules = tuple(
    (name, {"q_heads": (), "kv_heads": (), "slots": TP_AXES}.get(name, axes))
    for name, axes in DEFAULT_RULES)


@dataclass(frozen=True)
class Layout:
    """A mesh and its rules; hashable, so jitted functions can close over it."""

    mesh: Mesh
    rules: Rules = DEFAULT_RULES
    moe_dispatch: str = "psum"  # EP: "psum" | "all_to_all" (model/moe.py, moe_a2a.py)

    def __post_init__(self) -> None:
        if self.moe_dispatch not in MOE_DISPATCH:
            raise ValueError(f"moe_dispatch must be one of {MOE_DISPATCH}")

    def mesh_axes(self, logical: str) -> tuple[str, ...]:
        for name, axes in self.rules:
            if name == logical:
                return axes
        raise KeyError(f"no sharding rule for logical axis {logical!r}")

    def active_axes(self, logical: str) -> tuple[str, ...]:
        """The rule's mesh axes of size > 1 (a size-1 axis shards nothing, and JAX drops
        it from shard_map's view of the mesh)."""
        return tuple(a for a in self.mesh_axes(logical) if self.mesh.shape[a] > 1)

    def axes_size(self, axes: tuple[str, ...]) -> int:
        return int(np.prod([self.mesh.shape[a] for a in axes], dtype=np.int64))

    def size(self, logical: str) -> int:
        return self.axes_size(self.mesh_axes(logical))

    @property
    def tp(self) -> int:
        return self.size("q_heads")

    @property
    def ep(self) -> int:
        return self.size("experts")

    def partition(self, logical_axes: tuple[str, ...], shape: tuple[int, ...]) -> PartitionSpec:
        """One entry per dim: its mesh axes, or None where they do not divide the dim."""
        entries = []
        for logical, dim in zip(logical_axes, shape, strict=True):
            axes = self.active_axes(logical)
            entries.append(axes if axes and dim % self.axes_size(axes) == 0 else None)
        return PartitionSpec(*entries)

    def sharding(self, logical_axes: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, self.partition(logical_axes, shape))

    @property
    def dp_attention(self) -> bool:
        """Attention runs data-parallel: each device its own requests and pool rows."""
        return bool(self.active_axes("slots"))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def is_sharded(self, logical: str, dim: int) -> bool:
        return self.partition((logical,), (dim,))[0] is not None


def layout_for(tp: int, ep: int, devices: Sequence[jax.Device] | None = None,
               moe_dispatch: str = "psum", dp_attention: bool = False) -> Layout | None:
    """The layout of a --tp / --ep pair over `devices` (default: every visible one; a
    data-parallel replica passes its slice); tp = ep = 1: None, the single-device path
    (no mesh at all)."""
    if tp == 1 and ep == 1:
        return None
    rules = DP_ATTENTION_RULES if dp_attention else DEFAULT_RULES
    return Layout(make_mesh(MeshConfig(tp=tp, ep=ep), devices), rules, moe_dispatch)
