"""Ragged paged attention: metadata and the backend interface (the backends:
native_attention.py, pallas_backend.py; choosing one: backends.py).

A step packs the new tokens of B requests along one axis of T tokens:

    tokens   |<-- req 0 -->|<- req 1 ->|<-- req 2 -->|<pad>|
             q_start[0]    q_start[1]  q_start[2]          T

Request b owns positions 0 .. kv_len[b]-1; the last q_len[b] of them are new in this
step (positions kv_len-q_len .. kv_len-1). The slot holding position j of request b is
`req_to_token[req_row[b], j]`: a device table with one row per running request, kept on
the device across steps (the step writes its new tokens' slots into it; the host uploads
a row only when a request is admitted or its slots are replaced). Slots may be scattered
anywhere in the pool. Padded tokens write to slot 0, the reserved dummy; padded requests
have q_len = kv_len = 0.

The pool stacks the layers along its rows, [L * S, Hkv, Dh]: slot s of layer l is row
l * S + s. The forward scans the layers and sets `layer_base` = l * S for each; backends
add it to every slot they read or write (the req_to_token table holds layer-free slots).

The compiled shape holds T and B only: no backend's program depends on the context length
(each reads a request's keys in blocks up to its own kv_len).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

MASK_VALUE = -1e30  # finite, so fully masked (padded) rows give a harmless uniform softmax
TABLE_ALIGN = 512  # req_to_token rows are a multiple of this wide (every backend's key block)


class AttentionMetadata(NamedTuple):
    positions: jax.Array  # [T] int32, position of each new token within its request
    out_slots: jax.Array  # [T] int32, pool slot each new token's K/V is written to
    token_req: jax.Array  # [T] int32, request index of each token (padding: any valid b)
    q_start: jax.Array  # [B] int32, first token of each request in the packed axis
    q_len: jax.Array  # [B] int32, new tokens of each request (0 = padded request)
    kv_len: jax.Array  # [B] int32, keys after this step (cached prefix + new)
    req_row: jax.Array  # [B] int32, the request's row of req_to_token (padding: spare row)
    req_to_token: jax.Array  # [R, C] int32 device table, C a multiple of TABLE_ALIGN
    layer_base: jax.Array | int = 0  # [] int32, pool row of this layer's slot 0 (per layer)
    # [B] int32: positions 0 .. shared_len[b]-1 of request b are the step's shared prefix,
    # the same slots in every request where this is > 0 (all such values are equal);
    # 0: none. The native backend reads those keys once for all of them, in programs of
    # at least SHARED_PREFIX_MIN_BATCH requests (the host leaves smaller steps at 0).
    shared_len: jax.Array | None = None
    # Sliding-window layers with a pool of their own (cache/window_kv.py): [T] int32 the
    # window-pool slot each new token's K/V goes to in those layers, and the device map
    # window_of [S] int32 (full slot -> window slot) the step keeps; None: one pool
    window_out_slots: jax.Array | None = None
    window_of: jax.Array | None = None


# Steps of fewer requests read every key per request: a shared-prefix pass gains little
# there (decode B = 4: 1.09x f32, 1.18x w8a8) and costs every program compile time
# (~0.4 s per SmolLM2 step program; benchmarks/README.md, shared-prefix attention).
SHARED_PREFIX_MIN_BATCH = 8


def soft_capped(s: jax.Array, cap: float | None) -> jax.Array:
    """Logits (attention scores already scaled, or the LM head's) -> cap * tanh(s / cap)
    (Gemma 2's soft caps; scores before the mask); None: s itself."""
    return s if cap is None else jnp.tanh(s / cap) * cap


@dataclass(frozen=True)
class BatchShape:
    """Static (bucketed) sizes of one step; one compiled program per distinct value."""

    num_tokens: int  # T
    num_reqs: int  # B


class AttentionBackend(Protocol):
    """Writes the new K/V into the pool, then attends each token over its request's keys.

    Pools hold every layer, [L * S, kv_heads, head_dim] (this layer's rows from
    md.layer_base); the caller donates them, so the write is in place.
    Returns (out [T, q_heads, head_dim] f32, k_pool, v_pool).
    Must hold: causal within a request (key pos <= query pos), keys pos < kv_len only,
    and with a window w, key pos > query pos - w.
    """

    def __call__(
        self,
        q: jax.Array,  # [T, Hq, Dh] f32
        k_new: jax.Array,  # [T, Hkv, Dh]
        v_new: jax.Array,  # [T, Hkv, Dh]
        k_pool: jax.Array,  # [L * S, Hkv, Dh]
        v_pool: jax.Array,  # [L * S, Hkv, Dh]
        md: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> tuple[jax.Array, jax.Array, jax.Array]: ...


def write_kv(
    k_pool: jax.Array, v_pool: jax.Array, k_new: jax.Array, v_new: jax.Array, slots: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Scatter [T, Hkv, Dh] rows into the pools at rows [T] (slots + layer_base; padding
    rows hit the layer's slot 0)."""
    return write_rows(k_pool, slots, k_new), write_rows(v_pool, slots, v_new)


def write_rows(pool: jax.Array, slots: jax.Array, rows: jax.Array) -> jax.Array:
    """pool [N, ...] with rows [T, ...] (any float) written at slots [T], in the pool's
    storage (to_pool)."""
    return pool.at[slots].set(to_pool(rows, pool.dtype))


# A bfloat16 KV pool on the native backend is stored as its uint16 bits: XLA's CPU gather
# and scatter upcast a bf16 operand whole (the entire pool, every layer of every step: ~5
# s per decode step), and a bitcast of the pool is a copy there too, while integer rows
# move as they are. Gathered rows become f32 by a 16-bit shift (exact).
BF16_BITS = jnp.uint16


def pool_dtype(kv_dtype: jnp.dtype, backend: str) -> jnp.dtype:
    """The pool arrays' dtype for KV kept in kv_dtype (float32 or bfloat16) under a
    backend ("native" | "pallas"): bf16 bits on the native backend, else kv_dtype."""
    bits = backend == "native" and jnp.dtype(kv_dtype) == jnp.bfloat16
    return BF16_BITS if bits else kv_dtype


def to_pool(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Rows (any float) -> the pool's dtype (BF16_BITS: rounded to bf16, as bits)."""
    if dtype == BF16_BITS:
        return lax.bitcast_convert_type(x.astype(jnp.bfloat16), BF16_BITS)
    return x.astype(dtype)


def from_pool(rows: jax.Array) -> jax.Array:
    """Rows read from a pool -> f32."""
    if rows.dtype == BF16_BITS:
        return lax.bitcast_convert_type(rows.astype(jnp.uint32) << 16, jnp.float32)
    return rows.astype(jnp.float32)


def einsum_in(dtype: jnp.dtype, spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """jnp.einsum with both operands in dtype (bf16 beside a bf16 pool), f32 sums."""
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                      preferred_element_type=jnp.float32)
