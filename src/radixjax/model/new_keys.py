"""Attention of a step's new tokens over the step's new keys: no loop, no pool reads.

A request's new tokens see each other causally, and their keys are this step's own K/V
(already in registers' reach: [T, Hkv, Dh], packed like the tokens). Over the packed
token axis cut into n blocks of BT tokens, a token's new keys lie in its own block or an
earlier one, so every pair of blocks (i, j <= i) - the static lower triangle, P =
n (n + 1) / 2 pairs - is scored as one batched GEMM:

    q blocks [P, Hkv, G, BT, Dk] x key blocks [P, Hkv, BT, Dk] -> s [P, Hkv, G, BT, BT]

masked to the same request, causal, and the window. Each pair gives a local softmax
(max, sum, p @ v); each query block's pairs are then combined by a [n, P] one-hot
product. Pairs across requests are computed and masked: the triangle's cost is T^2 / 2
whatever the packing.

Why (benchmarks/README.md, eighteenth session): the blockwise extend loop ran one
64 x 128 tile at a time, ~20 loop steps a layer for a fresh 512-token prompt, ~220 of a
~680 ms SmolLM2 prefill step on the 2-core CPU (~2.8 of 4.6 s at 2048 tokens).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.attention import MASK_VALUE, einsum_in, soft_capped

# Tokens per block of the packed axis (BT): half the step's tokens, from 128 to 512
# (P = 3 pairs up to 1024 tokens, 10 at 2048). SmolLM2 w8a8 + bf16 KV, fresh 512-token
# prefill, min / median ms of 8 alternating rounds: the loop 661 / 697; blocks of 128
# 564 / 580, of 256 546 / 564 (bf16 operands; f32: 609 / 628, 580 / 601).
MIN_BLOCK, MAX_BLOCK = 128, 512


def block_tokens(num_tokens: int) -> int:
    return min(max(num_tokens // 2, MIN_BLOCK), MAX_BLOCK, num_tokens)


def new_key_carry(q: jax.Array, k: jax.Array, v: jax.Array, same: jax.Array,
                  positions: jax.Array, window: int | None,
                  dot_dtype: jnp.dtype = jnp.float32, block: int | None = None,
                  soft_cap: float | None = None) -> tuple:
    """q [T, Hkv, G, Dk] (scaled), k [T, Hkv, Dk], v [T, Hkv, Dv]: the step's tokens and
    their keys in packed order; same [T] int32: a token's request (tokens see keys of the
    same value at or before them); positions [T] (for the window) -> the online-softmax
    carry of each token over those keys, (m [T, Hkv, G], denom [T, Hkv, G],
    acc [T, Hkv, G, Dv]), to merge with the carry over the cached keys. dot_dtype: the
    two products' operands (bfloat16 beside a bf16 pool, as GPU attention kernels do;
    f32 accumulation either way); block: BT (default block_tokens(T)); soft_cap: the
    scores' (attention.soft_capped)."""
    num_tokens, num_kv_heads, group, head_dim = q.shape
    v_dim = v.shape[-1]
    bt = block or block_tokens(num_tokens)
    n = -(-num_tokens // bt)
    pad = n * bt - num_tokens
    if pad:  # padded tokens: a request of their own (-1), never seen by real tokens
        q, k, v, positions = (jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
                              for x in (q, k, v, positions))
        same = jnp.pad(same, (0, pad), constant_values=-1)
    qb = q.reshape(n, bt, num_kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    kb = k.reshape(n, bt, num_kv_heads, head_dim).transpose(0, 2, 1, 3)  # [n, Hkv, BT, Dk]
    vb = v.reshape(n, bt, num_kv_heads, v_dim).transpose(0, 2, 1, 3)
    pi, pj = np.tril_indices(n)  # the pairs (query block, key block), by query block
    s = einsum_in(dot_dtype, "phgqd,phkd->phgqk", qb[pi], kb[pj])  # [P, Hkv, G, BT, BT]
    tq = pi[:, None] * bt + np.arange(bt)  # [P, BT] token index of each query row
    tk = pj[:, None] * bt + np.arange(bt)
    valid = jnp.asarray(tk[:, None, :] <= tq[:, :, None])  # [P, BT, BT] causal
    valid &= same[tq][:, :, None] == same[tk][:, None, :]
    if window is not None:
        valid &= positions[tk][:, None, :] > positions[tq][:, :, None] - window
    s = jnp.where(valid[:, None, None], soft_capped(s, soft_cap), MASK_VALUE)
    m = s.max(axis=-1)  # [P, Hkv, G, BT]
    p = jnp.exp(s - m[..., None]).astype(dot_dtype)  # the sums below read it as rounded
    acc = einsum_in(dot_dtype, "phgqk,phkd->phgqd", p, vb[pj])  # [P, Hkv, G, BT, Dv]
    # each query block's pairs: max over them, then the rescaled sums
    onehot = pi[None, :] == np.arange(n)[:, None]  # [n, P]
    m_blk = jnp.max(jnp.where(onehot[:, :, None, None, None], m[None], MASK_VALUE), axis=1)
    w = jnp.exp(m - m_blk[pi])  # [P, Hkv, G, BT]
    hot = jnp.asarray(onehot, jnp.float32)
    denom = jnp.einsum("ip,phgq->ihgq", hot, w * p.sum(axis=-1, dtype=jnp.float32))
    acc = jnp.einsum("ip,phgqd->ihgqd", hot, w[..., None] * acc)

    def tokens(x: jax.Array) -> jax.Array:  # [n, Hkv, G, BT, ...] -> [T, Hkv, G, ...]
        x = jnp.moveaxis(x, 3, 1)
        return x.reshape(n * bt, *x.shape[2:])[:num_tokens]

    return tokens(m_blk), tokens(denom), tokens(acc)


def merge(a: tuple, b: tuple) -> tuple:
    """Two online-softmax carries (m, denom, acc) over disjoint keys -> over both."""
    (ma, da, xa), (mb, db, xb) = a, b
    m = jnp.maximum(ma, mb)
    wa, wb = jnp.exp(ma - m), jnp.exp(mb - m)
    return m, da * wa + db * wb, xa * wa[..., None] + xb * wb[..., None]
