"""Ragged paged attention: metadata, the backend interface, and the gather-based "native"
backend for CPU.

A step packs the new tokens of B requests along one axis of T tokens:

    tokens   |<-- req 0 -->|<- req 1 ->|<-- req 2 -->|<pad>|
             q_start[0]    q_start[1]  q_start[2]          T

Request b owns positions 0 .. kv_len[b]-1; the last q_len[b] of them are new in this
step (positions kv_len-q_len .. kv_len-1). kv_slots[b, j] is the KV-pool slot holding
position j (a row of the host req_to_token table), so slots may be scattered anywhere in
the pool. Padded tokens write to slot 0, the reserved dummy; padded requests have
q_len = kv_len = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

MASK_VALUE = -1e30  # finite, so fully masked (padded) rows give a harmless uniform softmax


class AttentionMetadata(NamedTuple):
    positions: jax.Array  # [T] int32, position of each new token within its request
    out_slots: jax.Array  # [T] int32, pool slot each new token's K/V is written to
    token_req: jax.Array  # [T] int32, request index of each token (padding: any valid b)
    q_start: jax.Array  # [B] int32, first token of each request in the packed axis
    q_len: jax.Array  # [B] int32, new tokens of each request (0 = padded request)
    kv_len: jax.Array  # [B] int32, keys after this step (cached prefix + new)
    kv_slots: jax.Array  # [B, K] int32, slot of position j of request b (padding: 0)


@dataclass(frozen=True)
class BatchShape:
    """Static (bucketed) sizes of one step; one compiled program per distinct value."""

    num_tokens: int  # T
    num_reqs: int  # B
    max_q: int  # Q >= max(q_len)
    max_kv: int  # K >= max(kv_len)


class AttentionBackend(Protocol):
    """Writes the new K/V into the pool, then attends each token over its request's keys.

    Pools are per layer, [num_slots, kv_heads, head_dim]; the caller donates them, so the
    write is in place. Returns (out [T, q_heads, head_dim] f32, k_pool, v_pool).
    Must hold: causal within a request (key pos <= query pos), keys pos < kv_len only,
    and with a window w, key pos > query pos - w.
    """

    def __call__(
        self,
        q: jax.Array,  # [T, Hq, Dh] f32
        k_new: jax.Array,  # [T, Hkv, Dh]
        v_new: jax.Array,  # [T, Hkv, Dh]
        k_pool: jax.Array,  # [S, Hkv, Dh]
        v_pool: jax.Array,  # [S, Hkv, Dh]
        md: AttentionMetadata,
        shape: BatchShape,
        window: int | None,
        scale: float,
    ) -> tuple[jax.Array, jax.Array, jax.Array]: ...


def write_kv(
    k_pool: jax.Array, v_pool: jax.Array, k_new: jax.Array, v_new: jax.Array, slots: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Scatter [T, Hkv, Dh] rows into the pools at slots [T] (padding rows hit slot 0)."""
    k_pool = k_pool.at[slots].set(k_new.astype(k_pool.dtype))
    v_pool = v_pool.at[slots].set(v_new.astype(v_pool.dtype))
    return k_pool, v_pool


def native_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    md: AttentionMetadata,
    shape: BatchShape,
    window: int | None,
    scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Gather-based reference backend: per request, a dense [Q, K] masked softmax."""
    k_pool, v_pool = write_kv(k_pool, v_pool, k_new, v_new, md.out_slots)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_q_heads // num_kv_heads
    b, qmax, kmax = shape.num_reqs, shape.max_q, shape.max_kv

    qi = jnp.arange(qmax, dtype=jnp.int32)
    q_idx = jnp.clip(md.q_start[:, None] + qi[None, :], 0, num_tokens - 1)  # [B, Q]
    q_pos = (md.kv_len - md.q_len)[:, None] + qi[None, :]  # [B, Q]
    qb = q[q_idx].reshape(b, qmax, num_kv_heads, group, head_dim)
    k = k_pool[md.kv_slots].astype(jnp.float32)  # [B, K, Hkv, Dh]
    v = v_pool[md.kv_slots].astype(jnp.float32)

    k_pos = jnp.arange(kmax, dtype=jnp.int32)[None, None, :]
    mask = (k_pos <= q_pos[:, :, None]) & (k_pos < md.kv_len[:, None, None])  # [B, Q, K]
    if window is not None:
        mask &= k_pos > q_pos[:, :, None] - window
    if qmax == 1 and b > 1:
        # Decode, B > 1: a broadcast multiply-reduce ran ~2.5x faster than the batched
        # einsum on the CPU backend (tiny per-request matmuls); same math. At B = 1 it
        # compiled to something 13x slower, so B = 1 keeps the einsum (measured).
        s = jnp.sum(qb[:, 0, None] * k[:, :, :, None, :], axis=-1) * scale  # [B, K, Hkv, G]
        s = jnp.where(mask[:, 0, :, None, None], s, MASK_VALUE)
        p = jax.nn.softmax(s, axis=1)
        o = jnp.sum(p[..., None] * v[:, :, :, None, :], axis=1)  # [B, Hkv, G, Dh]
        o = o.reshape(b, 1, num_q_heads, head_dim)
    else:
        s = jnp.einsum("bqhgd,bkhd->bhgqk", qb, k) * scale  # [B, Hkv, G, Q, K]
        s = jnp.where(mask[:, None, None], s, MASK_VALUE)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v).reshape(b, qmax, num_q_heads, head_dim)

    t_off = jnp.arange(num_tokens, dtype=jnp.int32) - md.q_start[md.token_req]  # [T]
    out = o[md.token_req, jnp.clip(t_off, 0, qmax - 1)]  # [T, Hq, Dh]
    return out, k_pool, v_pool


BACKEND_NAMES = ("auto", "native", "pallas")  # auto: pallas on a GPU, native elsewhere


def resolve_backend_name(name: str) -> str:
    """"auto" -> "pallas" when JAX's default backend is a GPU, else "native"."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose from {BACKEND_NAMES}")
    if name == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "native"
    return name


def get_backend(name: str, page_size: int = 1) -> AttentionBackend:
    """The backend function; page_size must be the allocator's page size, or 1 (always
    valid; only the pallas backend uses it)."""
    name = resolve_backend_name(name)
    if name == "native":
        return native_attention
    from radixjax.model.pallas_backend import pallas_attention  # Pallas only when asked

    return partial(pallas_attention, page_size=page_size)
