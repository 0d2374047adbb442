"""The parameter pytree and its one abstract description.

Params are a plain nested dict (a pytree):

    {"embed": [V, D], "final_norm": [D], "lm_head": [V, D] (untied only),
     "layers": [ {"attn_norm": [D], "wq": [D, Hq*Dh], "wk": [D, Hkv*Dh], "wv": [D, Hkv*Dh],
                  "wo": [Hq*Dh, D], "mlp_norm": [D],
                  "w_gate": [D, F], "w_up": [D, F],
                  "w_down": [F, D], optional "bq"/"bk"/"bv"/"bo", "q_norm"/"k_norm" [Dh],
                  Gemma's "post_attn_norm"/"post_mlp_norm" [D]} ] }
Gemma's norm weights are stored as (1 + w), the factor the forward multiplies by.

An MoE layer (cfg.is_sparse(i)) has, instead of w_gate/w_up/w_down:
    "router": [D, E], "we_gate": [E, D, Fe], "we_up": [E, D, Fe], "we_down": [E, Fe, D]
    + shared expert "ws_gate"/"ws_up" [D, Fs], "ws_down" [Fs, D] (DeepSeek, Qwen2-MoE),
    "shared_gate" [D, 1] (Qwen2-MoE), "router_bias" [E] (DeepSeek-V3)
An MLA layer (cfg.mla, model/mla.py) has, instead of wq/wk/wv:
    "wq_a" [D, Rq], "q_a_norm" [Rq], "wq_b" [Rq, H*(Dn+Dr)]  (or "wq" [D, H*(Dn+Dr)]),
    "wkv_a" [D, Rkv+Dr], "kv_a_norm" [Rkv], "wkv_b" [Rkv, H*(Dn+Dv)], "wo" [H*Dv, D]

Matrices are stored (in, out) so the forward is `x @ w`, except the output head, kept
(V, D) like the embedding it may be tied to (see `lm_head` in llama.py). `layer_specs` and
`top_specs` give every leaf's shape and logical axes; init, loading and sharding
(radixjax/parallel/rules.py maps logical axes to mesh axes) derive from them.
Per-layer arrays (a list, as checkpoints hold them); the runner stacks them for its layer
scan (model/layer_stack.py). A GGUF loaded in the "gguf" form holds its quantized
matrices as BlockWeight leaves (model/gguf_blocks.py: (out, in) in the file's blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.config import ModelConfig
from radixjax.model.gguf_blocks import GGUF_WEIGHTS, to_device

Params = dict[str, Any]


class ParamSpec(NamedTuple):
    shape: tuple[int, ...]
    logical_axes: tuple[str, ...]  # e.g. ("embed", "heads"); used by the sharding rules
    is_norm: bool = False  # norm weights stay float32 whatever the weight dtype


def _mla_specs(cfg: ModelConfig) -> dict[str, ParamSpec]:
    m, d, h = cfg.mla, cfg.hidden_size, cfg.num_heads
    assert m is not None
    specs = {}
    if m.q_lora_rank is None:
        specs["wq"] = ParamSpec((d, h * m.qk_head_dim), ("embed", "q_heads"))
    else:
        specs["wq_a"] = ParamSpec((d, m.q_lora_rank), ("embed", "latent"))
        specs["q_a_norm"] = ParamSpec((m.q_lora_rank,), ("latent",), True)
        specs["wq_b"] = ParamSpec((m.q_lora_rank, h * m.qk_head_dim), ("latent", "q_heads"))
    specs["wkv_a"] = ParamSpec((d, m.kv_lora_rank + m.qk_rope_head_dim), ("embed", "latent"))
    specs["kv_a_norm"] = ParamSpec((m.kv_lora_rank,), ("latent",), True)
    specs["wkv_b"] = ParamSpec((m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim)),
                               ("latent", "q_heads"))
    specs["wo"] = ParamSpec((h * m.v_head_dim, d), ("q_heads", "embed"))
    return specs


def layer_specs(cfg: ModelConfig, layer: int = 0) -> dict[str, ParamSpec]:
    d, f = cfg.hidden_size, cfg.intermediate_size
    specs = {"attn_norm": ParamSpec((d,), ("embed",), True)}
    if cfg.mla is not None:
        specs.update(_mla_specs(cfg))
    else:
        specs.update({
            "wq": ParamSpec((d, cfg.q_size), ("embed", "q_heads")),
            "wk": ParamSpec((d, cfg.kv_size), ("embed", "kv_heads")),
            "wv": ParamSpec((d, cfg.kv_size), ("embed", "kv_heads")),
            "wo": ParamSpec((cfg.q_size, d), ("q_heads", "embed")),
        })
    specs["mlp_norm"] = ParamSpec((d,), ("embed",), True)
    if cfg.is_sparse(layer):
        e, fe = cfg.num_experts, cfg.moe_intermediate_size
        specs["router"] = ParamSpec((d, e), ("embed", "router"))
        specs["we_gate"] = ParamSpec((e, d, fe), ("experts", "embed", "expert_mlp"))
        specs["we_up"] = ParamSpec((e, d, fe), ("experts", "embed", "expert_mlp"))
        specs["we_down"] = ParamSpec((e, fe, d), ("experts", "expert_mlp", "embed"))
        if cfg.moe_router_bias:
            specs["router_bias"] = ParamSpec((e,), ("router",), True)
        if cfg.shared_expert_size:
            fs = cfg.shared_expert_size
            specs["ws_gate"] = ParamSpec((d, fs), ("embed", "mlp"))
            specs["ws_up"] = ParamSpec((d, fs), ("embed", "mlp"))
            specs["ws_down"] = ParamSpec((fs, d), ("mlp", "embed"))
        if cfg.shared_expert_gate:
            specs["shared_gate"] = ParamSpec((d, 1), ("embed", "router"))
    else:
        specs["w_gate"] = ParamSpec((d, f), ("embed", "mlp"))
        specs["w_up"] = ParamSpec((d, f), ("embed", "mlp"))
        specs["w_down"] = ParamSpec((f, d), ("mlp", "embed"))
    if cfg.qkv_bias:
        specs["bq"] = ParamSpec((cfg.q_size,), ("q_heads",), True)
        specs["bk"] = ParamSpec((cfg.kv_size,), ("kv_heads",), True)
        specs["bv"] = ParamSpec((cfg.kv_size,), ("kv_heads",), True)
    if cfg.o_bias:
        specs["bo"] = ParamSpec((d,), ("embed",), True)
    if cfg.mlp_bias and not cfg.is_sparse(layer):
        specs["b_gate"] = ParamSpec((f,), ("mlp",), True)
        specs["b_up"] = ParamSpec((f,), ("mlp",), True)
        specs["b_down"] = ParamSpec((d,), ("embed",), True)
    if cfg.qk_norm:
        specs["q_norm"] = ParamSpec((cfg.head_dim,), ("head_dim",), True)
        specs["k_norm"] = ParamSpec((cfg.head_dim,), ("head_dim",), True)
    if cfg.gemma_style:  # norms of the attention's and the MLP's outputs too
        specs["post_attn_norm"] = ParamSpec((d,), ("embed",), True)
        specs["post_mlp_norm"] = ParamSpec((d,), ("embed",), True)
    return specs


def top_specs(cfg: ModelConfig) -> dict[str, ParamSpec]:
    specs = {
        "embed": ParamSpec((cfg.vocab_size, cfg.hidden_size), ("vocab", "embed")),
        "final_norm": ParamSpec((cfg.hidden_size,), ("embed",), True),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))
    return specs


def leaf_dtype(spec: ParamSpec, dtype: jnp.dtype) -> jnp.dtype:
    return jnp.float32 if spec.is_norm else dtype


def init_params(cfg: ModelConfig, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random params (normal * 0.02, norms around 1): for tests and benchmarks."""

    def init(spec: ParamSpec, k: jax.Array) -> jax.Array:
        if spec.is_norm:
            return (1.0 + 0.1 * jax.random.normal(k, spec.shape)).astype(jnp.float32)
        return (0.02 * jax.random.normal(k, spec.shape)).astype(dtype)

    keys = iter(jax.random.split(key, 4 + cfg.num_layers * 32))
    params: Params = {name: init(s, next(keys)) for name, s in top_specs(cfg).items()}
    params["layers"] = [
        {name: init(s, next(keys)) for name, s in layer_specs(cfg, i).items()}
        for i in range(cfg.num_layers)
    ]
    return params


# (spec, host array already in its final dtype) -> device array, e.g. straight into its
# shards (radixjax.parallel.shard_params.ShardPlacer); None: one default device.
Placer = Callable[[ParamSpec, np.ndarray], jax.Array]


def params_from_numpy(
    cfg: ModelConfig, arrays: dict[str, np.ndarray], layers: list[dict[str, np.ndarray]],
    dtype: Any, placer: Placer | None = None,
) -> Params:
    """Check every leaf against its spec and move it to the device(s) in its dtype."""

    def put(name: str, spec: ParamSpec, arr: Any) -> Any:
        if isinstance(arr, GGUF_WEIGHTS):  # a matrix in its GGUF blocks: (out, in)
            shape = (arr.n, arr.k) if name.startswith("model.") else (arr.k, arr.n)
            if shape != spec.shape:
                raise ValueError(f"weight {name}: shape {shape}, expected {spec.shape}")
            if placer is not None:
                raise ValueError("weights in GGUF blocks run on one device (no sharding)")
            # the layers' stay on the host until stacked (layer_stack.py)
            return to_device(arr) if name.startswith("model.") else arr
        if tuple(arr.shape) != spec.shape:
            raise ValueError(f"weight {name}: shape {arr.shape}, expected {spec.shape}")
        if placer is not None:
            return placer(spec, np.asarray(arr).astype(leaf_dtype(spec, dtype), copy=False))
        return jnp.asarray(arr, dtype=leaf_dtype(spec, dtype))

    def take(source: dict[str, np.ndarray], specs: dict[str, ParamSpec], where: str) -> Params:
        missing = set(specs) - set(source)
        if missing:
            raise ValueError(f"checkpoint is missing {where} weights: {sorted(missing)}")
        return {name: put(f"{where}.{name}", s, source[name]) for name, s in specs.items()}

    params = take(arrays, top_specs(cfg), "model")
    if len(layers) != cfg.num_layers:
        raise ValueError(f"checkpoint has {len(layers)} layers, config says {cfg.num_layers}")
    params["layers"] = [
        take(lw, layer_specs(cfg, i), f"layers.{i}") for i, lw in enumerate(layers)
    ]
    return params


def num_param_bytes(params: Params) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
