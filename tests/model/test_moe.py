"""The MoE block against a plain per-token loop, on one device: routing with and without
renormalised gates, and the EP decomposition (each expert shard's partial sums add up
to the whole), which the sharded run relies on."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model.config import ModelConfig
from radixjax.model.moe import route
from radixjax.model.moe_ffn import expert_ffn

CFG = ModelConfig(model_type="qwen3_moe", vocab_size=64, hidden_size=16, intermediate_size=32,
                  num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, num_experts=8,
                  num_experts_per_tok=2, moe_intermediate_size=12)


def weights(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    e, d, f = CFG.num_experts, CFG.hidden_size, CFG.moe_intermediate_size
    return tuple(rng.normal(size=s).astype(np.float32) * 0.5
                 for s in ((11, d), (d, e), (e, d, f), (e, d, f), (e, f, d)))


def loop_reference(h, router, wg, wu, wd, normalise: bool) -> np.ndarray:
    probs = jax.nn.softmax(h @ router, axis=-1)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-np.asarray(probs[t]))[: CFG.num_experts_per_tok]
        g = np.asarray(probs[t])[top]
        g = g / g.sum() if normalise else g
        for gate, e in zip(g, top, strict=True):
            act = np.asarray(jax.nn.silu(h[t] @ wg[e])) * (h[t] @ wu[e])
            out[t] += gate * (act @ wd[e])
    return out


@pytest.mark.parametrize("normalise", [True, False])
def test_moe_matches_loop(normalise: bool) -> None:
    cfg = dataclasses.replace(CFG, norm_topk_prob=normalise)
    h, router, wg, wu, wd = weights()
    gates, experts = route(jnp.asarray(h), jnp.asarray(router), cfg)
    ours = expert_ffn(jnp.asarray(h), gates, experts, wg, wu, wd, 0)
    ref = loop_reference(h, router, wg, wu, wd, normalise)
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-5, atol=1e-5)


def test_expert_shards_add_up() -> None:
    """4 shards of 2 experts each, and each of those split in 2 column halves."""
    h, router, wg, wu, wd = weights(1)
    gates, experts = route(jnp.asarray(h), jnp.asarray(router), CFG)
    full = expert_ffn(jnp.asarray(h), gates, experts, wg, wu, wd, 0)
    parts = jnp.zeros_like(full)
    f = CFG.moe_intermediate_size
    for first in range(0, CFG.num_experts, 2):
        for cols in (slice(0, f // 2), slice(f // 2, f)):
            ex = slice(first, first + 2)
            parts += expert_ffn(jnp.asarray(h), gates, experts, wg[ex][:, :, cols],
                                wu[ex][:, :, cols], wd[ex][:, cols], first)
    np.testing.assert_allclose(np.asarray(parts), np.asarray(full), rtol=1e-5, atol=1e-5)
