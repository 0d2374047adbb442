"""Multi-head latent attention (MLA: DeepSeek-V2/V3).

Per token the pool keeps one row, the latent [Rkv + Dr] shared by every head:

    c, k_pe   = split(h @ wkv_a)                       [T, Rkv], [T, Dr]
    latent    = [rms_norm(c), rope(k_pe)]              [T, 1, Rkv + Dr]  -> pool row
    q         = h @ wq, or rms_norm(h @ wq_a) @ wq_b    [T, H, Dn + Dr] = [q_nope, rope(q_pe)]
    wkv_b     = [W_UK | W_UV]                          [Rkv, H, Dn + Dv]

    decode, absorbed (q_len == 1): attend in the latent space, an MQA over the pool
        q_lat = q_nope . W_UK^T [B, H, Rkv]; scores = [q_lat, q_pe] . latent;
        o = (softmax . latent[:Rkv]) . W_UV   [B, H, Dv]
    extend, expanded (q_len > 1): each key block of the pool is expanded per head,
        k = [c . W_UK, k_pe], v = c . W_UV, then plain MHA (cheaper per query when many
        queries share the keys, as in a prefill)

Both read the pool through native_attention's blockwise loops, so no program depends on
the context length; the pool is [L * S, 1, Rkv + Dr] with a zero-width V pool
(ModelConfig.v_pool_width). The softmax scale is qk_head_dim^-0.5, times YaRN's
mscale(factor, mscale_all_dim)^2 when configured. `absorb=False` runs every request
expanded: the reference the absorbed decode is tested against.

Under TP the heads split over the mesh (wq_b / wq columns, wkv_b columns, wo rows) and the
latent pool is replicated: each device writes the same rows and reads them for its heads.
Under DP attention (parallel/dp_attention.py) each device runs every head for its own
requests over its own rows of the pool.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from radixjax.model.attention import AttentionMetadata, write_rows
from radixjax.model.config import ModelConfig, YarnScaling
from radixjax.model.layers import apply_rope, linear, rms_norm, yarn_mscale
from radixjax.model.native_attention import (
    EXTEND_BLOCK_K,
    EXTEND_BLOCK_Q,
    decode_attention,
    extend_attention,
    gather_rows,
    sharing,
)
from radixjax.model.params import Params
from radixjax.parallel.dp_attention import dp_axes, local_md, md_specs, shard_tokens
from radixjax.parallel.rules import Layout

LORA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: HF builds them with the default eps


def softmax_scale(cfg: ModelConfig) -> float:
    m = cfg.mla
    assert m is not None
    scale = m.qk_head_dim**-0.5
    s = cfg.rope_scaling
    if isinstance(s, YarnScaling) and s.mscale_all_dim:
        scale *= yarn_mscale(s.factor, s.mscale_all_dim) ** 2
    return scale


def mla_attend(
    q_nope: jax.Array,  # [T, H, Dn] f32 (H: all heads, or this device's)
    q_pe: jax.Array,  # [T, H, Dr] f32, roped
    latent: jax.Array,  # [T, 1, Rkv + Dr] f32, this step's new pool rows
    pool: jax.Array,  # [L * S, 1, Rkv + Dr]
    wkv_b: jax.Array,  # [Rkv, H * (Dn + Dv)]
    md: AttentionMetadata,
    *,
    scale: float,
    absorb: bool,
) -> tuple[jax.Array, jax.Array]:
    """Writes the new latents, attends. Returns (out [T, H, Dv] f32, pool)."""
    pool = write_rows(pool, md.out_slots + md.layer_base, latent)
    md = sharing(md)
    num_tokens, heads, dn = q_nope.shape
    rank = pool.shape[2] - q_pe.shape[2]
    w = wkv_b.astype(jnp.float32).reshape(rank, heads, -1)
    w_uk, w_uv = w[..., :dn], w[..., dn:]  # [Rkv, H, Dn], [Rkv, H, Dv]
    dv = w_uv.shape[2]

    def expand(slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        lat = gather_rows(pool, slots)[:, 0]  # [BK, Rkv + Dr]
        c, k_pe = lat[:, :rank], lat[:, rank:]
        k_nope = jnp.einsum("kr,rhn->khn", c, w_uk)
        k_pe = jnp.broadcast_to(k_pe[:, None, :], (*k_nope.shape[:2], k_pe.shape[1]))
        return jnp.concatenate([k_nope, k_pe], axis=-1), jnp.einsum("kr,rhv->khv", c, w_uv)

    q = jnp.concatenate([q_nope, q_pe], axis=-1) * scale  # [T, H, Dn + Dr]
    ext = extend_attention(q, expand, heads, dv, md, None, EXTEND_BLOCK_Q, EXTEND_BLOCK_K,
                           min_q_len=2 if absorb else 1)  # [T, H, Dv]
    if not absorb:
        return ext, pool
    b = md.q_len.shape[0]
    rows = jnp.clip(md.q_start, 0, num_tokens - 1)  # each request's first (decode: only) token
    q_lat = jnp.einsum("bhn,rhn->bhr", q_nope[rows], w_uk)  # [B, H, Rkv]
    qa = jnp.concatenate([q_lat, q_pe[rows]], axis=-1) * scale  # [B, H, Rkv + Dr]
    md_b = md._replace(q_start=jnp.arange(b, dtype=jnp.int32))
    o_lat = decode_attention(qa, pool, pool, md_b, None)  # [B, H, Rkv + Dr]
    dec = jnp.einsum("bhr,rhv->bhv", o_lat[..., :rank], w_uv)  # [B, H, Dv]
    is_decode_token = (md.q_len == 1)[md.token_req]  # [T]
    return jnp.where(is_decode_token[:, None, None], dec[md.token_req], ext), pool


def mla_attention_block(
    lp: Params, x: jax.Array, pool: jax.Array, md: AttentionMetadata,
    cos: jax.Array, sin: jax.Array, cfg: ModelConfig, layout: Layout | None,
    absorb: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """x [T, D] f32 (the residual) -> (attention output [T, D] f32, pool)."""
    m = cfg.mla
    assert m is not None
    t = x.shape[0]
    h = shard_tokens(rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps), layout)
    if "wq" in lp:
        q = linear(h, lp["wq"])
    else:
        q = linear(rms_norm(linear(h, lp["wq_a"]), lp["q_a_norm"], LORA_NORM_EPS), lp["wq_b"])
    q = q.reshape(t, cfg.num_heads, m.qk_head_dim)
    q_nope, q_pe = q[..., :m.qk_nope_head_dim], apply_rope(q[..., m.qk_nope_head_dim:], cos, sin)
    kv = linear(h, lp["wkv_a"])  # [T, Rkv + Dr]
    c = rms_norm(kv[:, :m.kv_lora_rank], lp["kv_a_norm"], LORA_NORM_EPS)
    k_pe = apply_rope(kv[:, None, m.kv_lora_rank:], cos, sin)  # [T, 1, Dr]
    latent = jnp.concatenate([c[:, None, :], k_pe], axis=-1)  # [T, 1, Rkv + Dr]

    def attend(q_nope, q_pe, latent, pool, wkv_b, md, ranks: tuple[str, ...] = ()):
        if ranks:  # DP attention: this rank's chunk, with local indices
            md = local_md(md, ranks, cfg.num_layers, pool.shape[0])
        return mla_attend(q_nope, q_pe, latent, pool, wkv_b, md, scale=softmax_scale(cfg),
                          absorb=absorb)

    if layout is not None and layout.dp_attention:  # each rank: its tokens, its pool rows
        axes = dp_axes(layout)
        chunk = P(axes, None, None)
        attend = jax.shard_map(partial(attend, ranks=axes), mesh=layout.mesh,
                               in_specs=(chunk, chunk, chunk, chunk, P(), md_specs(axes)),
                               out_specs=(chunk, chunk), check_vma=False)
    elif layout is not None and layout.is_sharded("q_heads", cfg.num_heads):
        axes = layout.active_axes("q_heads")
        heads = P(None, axes, None)
        attend = jax.shard_map(attend, mesh=layout.mesh,
                               in_specs=(heads, heads, P(), P(), P(None, axes), P()),
                               out_specs=(heads, P()), check_vma=False)
    o, pool = attend(q_nope, q_pe, latent, pool, lp["wkv_b"], md)  # [T, H, Dv]
    return linear(o.reshape(t, cfg.num_heads * m.v_head_dim), lp["wo"]), pool
