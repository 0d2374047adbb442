"""The Llama-family forward pass over a ragged batch: a pure function of
(params, kv pool, batch); the caller jits it and donates the pool.

With a `Layout` (radixjax/parallel) the same forward runs tensor/expert parallel: the
params and pool arrive sharded as the rules say, attention runs per KV-head shard, the
embedding and head are vocab-parallel, MoE layers dispatch to sharded experts, and the
residual stream [T, D] stays replicated between blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.attention import AttentionBackend, AttentionMetadata, soft_capped
from radixjax.model.config import ModelConfig
from radixjax.model.gguf_blocks import GGUF_WEIGHTS, block_linear, block_rows
from radixjax.model.layer_stack import join_resident, layer_groups, split_resident
from radixjax.model.layers import (
    apply_rope,
    fused_linear,
    linear,
    rms_norm,
    rope_attention_factor,
    rope_cos_sin,
    rope_inv_freq,
)
from radixjax.model.mla import mla_attention_block
from radixjax.model.moe import moe_block
from radixjax.model.params import Params
from radixjax.model.quant import int8_head
from radixjax.parallel.collectives import (
    sharded_attention,
    vocab_parallel_embed,
    vocab_parallel_head,
)
from radixjax.parallel.dp_attention import dp_sharded_attention, shard_tokens
from radixjax.parallel.rules import Layout

# (k, v), each [L * S, Hkv, Dh]: layer l at rows l*S..; MLA: k is the latent pool
# [L * S, 1, Rkv + Dr] and v is empty [L * S, 1, 0] (model/mla.py). With a window pool
# of S_w slots (cache/window_kv.py): the full-attention layers first, each S rows, then
# the sliding-window layers, each S_w rows (layer_bases).
KVPool = tuple[jax.Array, jax.Array]


def layer_bases(cfg: ModelConfig, num_slots: int, window_slots: int = 0) -> np.ndarray:
    """[L] int: each layer's first pool row. window_slots 0: one pool (layer l at l * S);
    else the full layers' rows, then the window layers' (S_w rows each)."""
    if not window_slots:
        return np.arange(cfg.num_layers) * num_slots
    is_window = np.array([w is not None for w in cfg.sliding_windows])
    full_rank = np.cumsum(~is_window) - 1  # each full layer's index among the full ones
    window_rank = np.cumsum(is_window) - 1
    num_full = int((~is_window).sum())
    return np.where(is_window, num_full * num_slots + window_rank * window_slots,
                    full_rank * num_slots)


def pool_rows(cfg: ModelConfig, num_slots: int, window_slots: int = 0) -> int:
    num_window = sum(w is not None for w in cfg.sliding_windows) if window_slots else 0
    return (cfg.num_layers - num_window) * num_slots + num_window * window_slots


def init_kv_pool(cfg: ModelConfig, num_slots: int, dtype: jnp.dtype,
                 sharding: jax.sharding.Sharding | None = None,
                 window_slots: int = 0) -> KVPool:
    """num_slots per layer (window_slots per sliding-window layer where nonzero);
    sharding: where each [rows, Hkv, Dh] array lives (parallel.kv_sharding)."""
    rows = pool_rows(cfg, num_slots, window_slots)
    k_shape = (rows, cfg.num_kv_heads, cfg.head_dim)
    v_shape = (rows, cfg.num_kv_heads, cfg.v_pool_width)
    return (jnp.zeros(k_shape, dtype, device=sharding),
            jnp.zeros(v_shape, dtype, device=sharding))


def kv_pool_bytes(cfg: ModelConfig, num_slots: int, dtype: jnp.dtype,
                  window_slots: int = 0) -> int:
    per_slot = cfg.num_kv_heads * (cfg.head_dim + cfg.v_pool_width)
    return pool_rows(cfg, num_slots, window_slots) * per_slot * jnp.dtype(dtype).itemsize


def window_metadata(md: AttentionMetadata) -> AttentionMetadata:
    """The metadata of the window layers' own pool: each request's row of req_to_token
    mapped to window slots ([B, C], rows 0..B-1: only this step's), the new tokens'
    window slots. Positions whose window KV is gone map to the dummy slot 0: they lie
    outside every window that reads them (masked)."""
    rows = md.window_of[md.req_to_token[md.req_row]]  # [B, C]
    return md._replace(req_to_token=rows, out_slots=md.window_out_slots,
                       req_row=jnp.arange(md.req_row.shape[0], dtype=jnp.int32))


def _attention_block(
    lp: Params, x: jax.Array, kv: tuple[jax.Array, jax.Array], md: AttentionMetadata,
    cos: jax.Array, sin: jax.Array, cfg: ModelConfig, backend: AttentionBackend,
    window: int | None, layout: Layout | None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    t = x.shape[0]
    h = shard_tokens(rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps), layout)
    kv_size = cfg.num_kv_heads * cfg.head_dim
    q, k, v = fused_linear(h, lp, "wqkv", (cfg.q_size, kv_size, kv_size))
    q = q.reshape(t, cfg.num_heads, cfg.head_dim)
    k, v = (x.reshape(t, cfg.num_kv_heads, cfg.head_dim) for x in (k, v))
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    o, k_pool, v_pool = backend(q, k, v, kv[0], kv[1], md, window, cfg.softmax_scale)
    return linear(o.reshape(t, cfg.q_size), lp["wo"], lp.get("bo")), (k_pool, v_pool)


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def _mlp_block(lp: Params, x: jax.Array, cfg: ModelConfig, layout: Layout | None,
               layer: int) -> jax.Array:
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
    if cfg.is_sparse(layer):
        return moe_block(lp, h, cfg, layout, layer)
    gate, up = fused_linear(h, lp, "w_gate_up", (cfg.intermediate_size,) * 2)
    return linear(_ACTIVATIONS[cfg.hidden_act](gate) * up, lp["w_down"], lp.get("b_down"))


def vocab_blocks(vocab: int, max_block: int = 1024) -> int:
    """Fewest blocks of at most max_block rows that split the vocab evenly."""
    return next(c for c in range(1, vocab + 1) if vocab % c == 0 and vocab // c <= max_block)


def _head_rows(w: jax.Array, h: jax.Array) -> jax.Array:
    """w [V', D] (all or one shard of the head), h [N, D] f32 -> [N, V'] f32.

    Computed over vocab blocks [C, V'/C, D] with the block axis leading the output: on the
    CPU backend this ran 2x faster at batch 8 than one [N, D] x [D, V] dot (measured,
    benchmarks/README.md), and the same at batch 1 and 64."""
    vocab, hidden = w.shape
    c = vocab_blocks(vocab)
    wb = w.reshape(c, vocab // c, hidden)
    out = jnp.einsum("nd,cvd->cnv", h.astype(w.dtype), wb, preferred_element_type=jnp.float32)
    return out.transpose(1, 0, 2).reshape(h.shape[0], vocab)


def lm_head(params: Params, h: jax.Array, cfg: ModelConfig,
            layout: Layout | None = None) -> jax.Array:
    """h: [N, D] f32 -> logits [N, V] f32. The head is [V, D] (tied: the embedding itself);
    vocab-parallel when the layout shards the vocabulary; its int8 copy when quantized
    (model/quant.py int8_head)."""
    w = params["embed"] if cfg.tie_word_embeddings else params["lm_head"]
    if "lm_head_int8" in params:
        logits = int8_head(h, params["lm_head_int8"])
    elif isinstance(w, GGUF_WEIGHTS):  # in its GGUF blocks
        logits = block_linear(h, w)
    else:
        if layout is not None and layout.is_sharded("vocab", cfg.vocab_size):
            logits = vocab_parallel_head(w, h, layout, _head_rows)
        else:
            logits = _head_rows(w, h)
    return soft_capped(logits, cfg.final_soft_cap)  # Gemma 2


def _embed(params: Params, input_ids: jax.Array, cfg: ModelConfig,
           layout: Layout | None) -> jax.Array:
    """[T] int32 -> [T, D] f32."""
    if isinstance(params["embed"], GGUF_WEIGHTS):  # rows dequantized from their blocks
        x = block_rows(input_ids, params["embed"])
    elif layout is not None and layout.is_sharded("vocab", cfg.vocab_size):
        x = vocab_parallel_embed(params["embed"], input_ids, layout)
    else:
        x = params["embed"][input_ids].astype(jnp.float32)
    return x if cfg.embed_scale == 1.0 else x * jnp.float32(cfg.embed_scale)


def _decoder_layer(
    lp: Params, x: jax.Array, kv: KVPool, md: AttentionMetadata,
    cos: jax.Array, sin: jax.Array, cfg: ModelConfig, backend: AttentionBackend,
    layout: Layout | None, kind: int, mla_absorb: bool = True,
) -> tuple[jax.Array, KVPool]:
    """One decoder layer (md.layer_base says which); `kind` is a layer of its kind (the
    first of its group when scanned, layer_stack.py): what the layer's code depends on
    besides its weights."""
    replicate = (lambda a: a) if layout is None else (
        lambda a: jax.lax.with_sharding_constraint(a, layout.replicated))
    if cfg.mla is not None:
        attn, k_pool = mla_attention_block(lp, x, kv[0], md, cos, sin, cfg, layout, mla_absorb)
        kv = (k_pool, kv[1])
    else:
        attn, kv = _attention_block(lp, x, kv, md, cos, sin, cfg, backend,
                                    cfg.sliding_windows[kind], layout)
    if cfg.gemma_style:  # each block's output normed before the residual add
        attn = rms_norm(attn, lp["post_attn_norm"], cfg.rms_norm_eps)
    x = replicate(x + attn)
    mlp = _mlp_block(lp, x, cfg, layout, kind)
    if cfg.gemma_style:
        mlp = rms_norm(mlp, lp["post_mlp_norm"], cfg.rms_norm_eps)
    return replicate(x + mlp), kv


def forward_hidden(
    params: Params,
    kv: KVPool,
    input_ids: jax.Array,  # [T] int32
    md: AttentionMetadata,
    *,
    cfg: ModelConfig,
    backend: AttentionBackend,
    layout: Layout | None = None,
    mla_absorb: bool = True,
    window_slots: int = 0,
) -> tuple[jax.Array, KVPool]:
    """params: stacked (layer_stack.stack_layers): the layers of each group run in one
    lax.scan.
    Returns (the final-normed hidden state of every token [T, D], new kv pool).
    layout: run sharded (cfg must then be parallel.sharded_config(...) of the model).
    mla_absorb=False: MLA decodes expanded too (the reference for the absorbed form).
    window_slots: the sliding-window layers' own pool of that many slots (layer_bases;
    md then carries window_out_slots and window_of); 0: every layer in one pool."""
    if layout is not None and layout.dp_attention:
        backend = dp_sharded_attention(backend, layout, cfg.num_layers)
    elif layout is not None:
        backend = sharded_attention(backend, layout)
    x = _embed(params, input_ids, cfg, layout)  # [T, D]
    factor = rope_attention_factor(cfg)
    rope = rope_cos_sin(md.positions, rope_inv_freq(cfg), factor)  # each [T, rope_dim]
    # a sliding-window layer's RoPE, where it has a base of its own (Gemma 3)
    local_rope = rope if cfg.local_rope_theta is None else rope_cos_sin(
        md.positions, rope_inv_freq(cfg, local=True), factor)
    num_window = sum(w is not None for w in cfg.sliding_windows) if window_slots else 0
    num_full = cfg.num_layers - num_window
    num_slots = (kv[0].shape[0] - num_window * window_slots) // max(num_full, 1)
    bases = jnp.asarray(layer_bases(cfg, num_slots, window_slots), jnp.int32)  # [L]
    md_window = window_metadata(md) if window_slots else md
    for group, weights in zip(layer_groups(cfg), params["groups"], strict=True):
        is_window = cfg.sliding_windows[group.start] is not None
        cos, sin = local_rope if is_window else rope
        md_group = md_window if is_window else md

        scanned, resident = split_resident(weights)

        def layer(carry: tuple, xs: tuple, kind: int = group.start,
                  resident: dict = resident, cos: jax.Array = cos,
                  sin: jax.Array = sin, md: AttentionMetadata = md_group) -> tuple:
            x, kv = carry
            lp, i = xs
            lp = join_resident(lp, resident, i - kind)
            md_i = md._replace(layer_base=bases[i])
            return _decoder_layer(lp, x, kv, md_i, cos, sin, cfg, backend, layout, kind,
                                  mla_absorb), None

        ids = jnp.arange(group.start, group.stop, dtype=jnp.int32)
        (x, kv), _ = jax.lax.scan(layer, (x, kv), (scanned, ids))
    return rms_norm(x, params["final_norm"], cfg.rms_norm_eps), kv


def last_token_rows(md: AttentionMetadata) -> jax.Array:
    """[B] int32: each request's last new token in the packed axis (padding: row 0)."""
    return jnp.maximum(md.q_start + md.q_len - 1, 0)


def forward(
    params: Params,
    kv: KVPool,
    input_ids: jax.Array,  # [T] int32
    md: AttentionMetadata,
    *,
    cfg: ModelConfig,
    backend: AttentionBackend,
    all_logits: bool = False,
    layout: Layout | None = None,
    mla_absorb: bool = True,
    window_slots: int = 0,
) -> tuple[jax.Array, KVPool]:
    """forward_hidden, then the LM head. Returns (logits, new kv pool): logits are [B, V]
    at each request's last new token, or [T, V] for every token when `all_logits`
    (parity tests)."""
    x, kv = forward_hidden(params, kv, input_ids, md, cfg=cfg, backend=backend,
                           layout=layout, mla_absorb=mla_absorb, window_slots=window_slots)
    if not all_logits:
        x = x[last_token_rows(md)]
    return lm_head(params, x, cfg, layout), kv
