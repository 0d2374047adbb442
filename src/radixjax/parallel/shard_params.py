"""Parameters and KV pool onto the mesh, each device receiving only its shards.

KV heads fewer than the TP ranks (e.g. 2 KV heads, tp = 8) are replicated by repeating
each head r = tp / Hkv times in wk / wv / bk (and so in the pool): query head h still
meets a copy of its KV head h // (Hq / Hkv), and every rank holds exactly the KV head its
query heads need. The runner then works on `sharded_config(cfg, tp)` (Hkv * r heads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from radixjax.model.config import ModelConfig
from radixjax.model.params import Params, ParamSpec, Placer, layer_specs, top_specs
from radixjax.parallel.rules import Layout


class ShardingError(ValueError):
    """The model's heads or experts do not fit the mesh."""


def kv_repeat(cfg: ModelConfig, tp: int) -> int:
    """How many copies of each KV head the pool holds under TP size tp (MLA's one latent
    row is replicated whole instead: model/mla.py)."""
    if cfg.num_kv_heads >= tp or cfg.mla is not None:
        return 1
    if tp % cfg.num_kv_heads:
        raise ShardingError(f"tp={tp} is not a multiple of num_kv_heads={cfg.num_kv_heads}")
    return tp // cfg.num_kv_heads


def check_divisible(cfg: ModelConfig, layout: Layout) -> None:
    tp, ep = layout.tp, layout.ep
    if cfg.num_heads % tp:
        raise ShardingError(f"num_heads={cfg.num_heads} is not divisible by tp={tp}")
    if cfg.mla is None and cfg.num_kv_heads * kv_repeat(cfg, tp) % tp:
        raise ShardingError(f"num_kv_heads={cfg.num_kv_heads} is not divisible by tp={tp}")
    if cfg.num_experts and cfg.num_experts % ep:
        raise ShardingError(f"num_experts={cfg.num_experts} is not divisible by ep={ep}")
    if not cfg.num_experts and ep > 1:
        raise ShardingError(f"ep={ep} needs an MoE model; {cfg.model_type} is dense")


def sharded_config(cfg: ModelConfig, layout: Layout) -> ModelConfig:
    """The config the sharded forward runs: KV heads repeated up to the TP size."""
    check_divisible(cfg, layout)
    r = kv_repeat(cfg, layout.tp)
    return cfg if r == 1 else dataclasses.replace(cfg, num_kv_heads=cfg.num_kv_heads * r)


def _repeat_kv(arr: np.ndarray, axis: int, num_kv_heads: int, r: int) -> np.ndarray:
    """[.., Hkv * Dh, ..] -> [.., Hkv * r * Dh, ..] (each head's Dh block r times)."""
    shape = arr.shape
    heads = arr.reshape(*shape[:axis], num_kv_heads, -1, *shape[axis + 1:])
    heads = np.repeat(heads, r, axis=axis)
    return heads.reshape(*shape[:axis], -1, *shape[axis + 1:])


class ShardPlacer:
    """A `Placer` (model/params.py): host array -> jax.Array sharded as the rules say,
    built with make_array_from_callback so each device copies only its own slice."""

    def __init__(self, cfg: ModelConfig, layout: Layout) -> None:
        self.cfg, self.layout = cfg, layout
        self.r = kv_repeat(cfg, layout.tp)
        check_divisible(cfg, layout)

    def __call__(self, spec: ParamSpec, arr: np.ndarray) -> jax.Array:
        if self.r > 1 and "kv_heads" in spec.logical_axes:
            axis = spec.logical_axes.index("kv_heads")
            if arr.shape[axis] == self.cfg.kv_size:  # not yet repeated
                arr = _repeat_kv(arr, axis, self.cfg.num_kv_heads, self.r)
        sharding = self.layout.sharding(spec.logical_axes, arr.shape)
        return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def placer_for(layout: Layout) -> Callable[[ModelConfig], Placer]:
    """cfg -> Placer, for loaders that learn the config from the checkpoint."""

    def make(cfg: ModelConfig) -> Placer:
        return ShardPlacer(cfg, layout)

    return make


def shard_params(cfg: ModelConfig, params: Params, layout: Layout) -> Params:
    """Params already in memory (init_params, a notebook, or the loader's sharded output)
    -> sharded as the rules say. Leaves already in place are kept as they are."""
    place = ShardPlacer(cfg, layout)
    run_cfg = sharded_config(cfg, layout)

    def one(spec: ParamSpec, x: Any) -> jax.Array:
        shape = tuple(run_cfg.kv_size if a == "kv_heads" else d
                      for a, d in zip(spec.logical_axes, spec.shape, strict=True))
        want = layout.sharding(spec.logical_axes, shape)
        if isinstance(x, jax.Array) and x.shape == shape and x.sharding.is_equivalent_to(
                want, len(shape)):
            return x
        return place(spec, np.asarray(x))

    out: Params = {n: one(s, params[n]) for n, s in top_specs(cfg).items()}
    out["layers"] = [
        {n: one(s, lp[n]) for n, s in layer_specs(cfg, i).items()}
        for i, lp in enumerate(params["layers"])
    ]
    return out


def kv_sharding(layout: Layout, run_cfg: ModelConfig, num_slots: int) -> jax.sharding.Sharding:
    """The pool [L * num_slots, Hkv, Dh]: sharded over KV heads (MLA's single latent
    head: replicated, as Layout.partition leaves an undivided dim)."""
    shape = (run_cfg.num_layers * num_slots, run_cfg.num_kv_heads, run_cfg.head_dim)
    return layout.sharding(("slots", "kv_heads", "head_dim"), shape)
