"""Ragged paged attention for NVIDIA GPUs (Pallas, Triton backend): decode, prefill and
extend-with-prefix in one kernel.

Why Triton and not Mosaic GPU: Mosaic GPU reaches Hopper's wgmma/TMA directly, but needs
warpgroup-level layouts, a 128-row M tile and TMA-friendly (contiguous, page-aligned)
K/V blocks, and its API changes every JAX release. A paged pool read through a page
table is a gather, which Triton expresses as pointer arithmetic (`ref[slots, h, :]`)
and pipelines with `num_stages`; decode, the case that matters most for serving, is
HBM-bound, where Triton's loads reach the bandwidth a Mosaic kernel would. So: Triton.

Layout (the wrapper builds it; all reshapes but the q/out re-layout are free):

    q      [T, Hq, D]         -> q_rows [Hkv, T*Gp + R, D]   row t*Gp + g = token t, q-head
                                 h*G + g (G = Hq/Hkv padded to Gp, a power of two;
                                 R spare rows so the last tile never reads out of bounds)
    pool   [N, P, Hkv, D]     -> [N*P, Hkv, D]; position j of request b lives in slot
                                 page_table[b, j // P] * P + j % P

Grid (B * num_q_blocks, Hkv, num_splits); program (b, qb, h, s) takes the rows of tokens
qb*BQ .. qb*BQ+BQ-1 of request b (BQ = R / Gp) against KV head h, and walks split s of
the key blocks those tokens can see, with an online softmax. Programs whose tile starts
past q_len[b] (a short request in a batch bucketed for a long one) exit at once.

    keys      0 ........ lo ...................... hi = last query pos + 1 ... kv_len
    blocks             |blk|blk|blk|blk|blk|blk|blk|
    splits             |<- s=0 ->|<- s=1 ->|<- 2 ->|     each writes (o / l, lse)

With one split the kernel writes the normalized output; with more, the wrapper merges
the partial outputs with their log-sum-exps (FlashDecoding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.blocks import DEFAULT_BLOCKS, AttentionBlocks
from pallas_kernels.compat import (
    check_triton_dim,
    dot,
    masked_store,
    resolve_interpret,
    triton_params,
)

MASK_VALUE = -1e30  # finite: exp(MASK - m) underflows to 0 without inf - inf = NaN


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _kernel(
    cu_ref,  # [B + 1] int32
    kv_lens_ref,  # [B] int32
    page_table_ref,  # [B, max_pages] int32
    q_ref,  # [Hkv, T*Gp + R, D]
    k_ref,  # [N*P, Hkv, D]
    v_ref,  # [N*P, Hkv, D]
    o_ref,  # [S, Hkv, T*Gp + R, D] f32
    lse_ref,  # [S, Hkv, T*Gp + R] f32
    *, group: int, group_pad: int, rows: int, block_k: int, page_size: int,
    num_q_blocks: int, num_splits: int, scale: float, window: int | None,
    soft_cap: float | None,
):
    b = pl.program_id(0) // num_q_blocks
    qb = pl.program_id(0) % num_q_blocks
    h = pl.program_id(1)
    s = pl.program_id(2)
    block_q = rows // group_pad
    q_start = cu_ref[b]
    q_len = cu_ref[b + 1] - q_start
    kv_len = kv_lens_ref[b]
    tok0 = qb * block_q  # first token of this tile, within the request

    @pl.when(tok0 < q_len)
    def _():
        r = jnp.arange(rows, dtype=jnp.int32)
        tok = tok0 + r // group_pad  # [R]
        row_ok = (tok < q_len) & (r % group_pad < group)  # [R]
        q_pos = kv_len - q_len + tok  # [R] position of each row's token
        row0 = (q_start + tok0) * group_pad
        q = q_ref[h, pl.ds(row0, rows), :]  # [R, D]
        compute_dtype = k_ref.dtype
        q = q.astype(compute_dtype)

        first = kv_len - q_len + tok0
        hi = kv_len - q_len + jnp.minimum(tok0 + block_q, q_len)  # causal: last pos + 1
        lo = 0 if window is None else jnp.maximum(first - window + 1, 0)
        blk_lo = lo // block_k
        blk_hi = pl.cdiv(hi, block_k)
        per_split = pl.cdiv(blk_hi - blk_lo, num_splits)
        j_begin = blk_lo + s * per_split
        j_end = jnp.minimum(j_begin + per_split, blk_hi)

        def body(j, carry):
            o, m, denom = carry  # [R, D], [R] running max, [R] softmax sum; f32
            pos = j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
            # Clamped, so every load hits a real key of this request (masked below):
            # no out-of-bounds reads, and garbage in unused pages (the dummy page 0)
            # never meets a zero probability as 0 * NaN.
            pos_c = jnp.minimum(pos, kv_len - 1)
            if page_size == 1:
                slot = page_table_ref[b, pos_c]  # [BK]
            else:
                slot = page_table_ref[b, pos_c // page_size] * page_size + pos_c % page_size
            k = k_ref[slot, h, :]  # [BK, D]
            v = v_ref[slot, h, :]  # [BK, D]
            sc = dot(q, k, trans_b=True)  # [R, BK]
            sc = sc.astype(jnp.float32) * scale
            if soft_cap is not None:
                sc = soft_cap * jnp.tanh(sc / soft_cap)
            mask = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] < kv_len)
            if window is not None:
                mask &= pos[None, :] > q_pos[:, None] - window
            sc = jnp.where(mask, sc, MASK_VALUE)
            m_new = jnp.maximum(m, jnp.max(sc, axis=1))
            p = jnp.where(mask, jnp.exp(sc - m_new[:, None]), 0.0)  # [R, BK]
            alpha = jnp.exp(m - m_new)
            pv = dot(p.astype(compute_dtype), v)  # [R, D]
            o = o * alpha[:, None] + pv.astype(jnp.float32)
            return o, m_new, denom * alpha + jnp.sum(p, axis=1)

        head_dim = q_ref.shape[-1]
        init = (jnp.zeros((rows, head_dim), jnp.float32),
                jnp.full((rows,), MASK_VALUE, jnp.float32), jnp.zeros((rows,), jnp.float32))
        o, m, denom = lax.fori_loop(j_begin, j_end, body, init)
        seen = denom > 0.0  # a split may see no key of a row
        denom = jnp.where(seen, denom, 1.0)
        o = jnp.where(seen[:, None], o / denom[:, None], 0.0)
        lse = jnp.where(seen, m + jnp.log(denom), MASK_VALUE)
        mask_od = jnp.broadcast_to(row_ok[:, None], o.shape)
        masked_store(o_ref.at[s, h, pl.ds(row0, rows), :], o, mask_od)
        masked_store(lse_ref.at[s, h, pl.ds(row0, rows)], lse, row_ok)


def _merge_splits(o: jax.Array, lse: jax.Array) -> jax.Array:
    """o [S, ..., D], lse [S, ...] -> [..., D]: the log-sum-exp weighted sum of splits."""
    lse_max = jnp.max(lse, axis=0)
    w = jnp.exp(lse - lse_max[None])  # [S, ...]
    return jnp.sum(o * w[..., None], axis=0) / jnp.sum(w, axis=0)[..., None]


@functools.partial(
    jax.jit,
    static_argnames=("scale", "max_q", "window", "soft_cap", "blocks", "interpret"),
)
def ragged_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pages: jax.Array,  # [N, P, Hkv, D]
    v_pages: jax.Array,  # [N, P, Hkv, D]
    page_table: jax.Array,  # [B, max_pages] int32, pages of each request in order
    cu_q_lens: jax.Array,  # [B + 1] int32, request b's tokens are cu[b] .. cu[b+1]-1
    kv_lens: jax.Array,  # [B] int32, keys of each request, new tokens included
    *,
    scale: float,
    max_q: int | None = None,
    window: int | None = None,
    soft_cap: float | None = None,
    blocks: AttentionBlocks = DEFAULT_BLOCKS,
    interpret: bool | None = None,
) -> jax.Array:
    """[T, Hq, D] f32 attention of each token over its request's keys.

    Token i of request b (0 <= i < q_len = cu[b+1] - cu[b]) sits at position
    kv_len[b] - q_len + i and sees keys at positions <= its own (causal within the new
    tokens, all of the cached prefix), > pos - window when a window is given. Logits are
    soft-capped as cap * tanh(x / cap) when soft_cap is given. max_q (static) must bound
    every q_len; tokens past cu[B] (padding) get zeros. The new tokens' K/V must already
    be in the pool (`kv_write.write_kv_pages`). Does not modify its inputs.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_pages.shape
    num_reqs = kv_lens.shape[0]
    group = num_q_heads // num_kv_heads
    group_pad = _next_pow2(group)
    rows = max(blocks.rows, group_pad)
    num_q_blocks = pl.cdiv(max_q or num_tokens, rows // group_pad)
    num_splits = blocks.num_splits
    n_rows = num_tokens * group_pad + rows
    interpret = resolve_interpret(interpret)
    for name, size in (("head_dim", head_dim), ("rows", rows), ("block_k", blocks.block_k)):
        check_triton_dim(name, size, interpret)

    qr = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    qr = jnp.pad(qr, ((0, 0), (0, 0), (0, group_pad - group), (0, 0)))
    qr = qr.transpose(1, 0, 2, 3).reshape(num_kv_heads, num_tokens * group_pad, head_dim)
    qr = jnp.pad(qr, ((0, 0), (0, rows), (0, 0)))  # [Hkv, T*Gp + R, D]
    k_flat = k_pages.reshape(num_pages * page_size, num_kv_heads, head_dim)
    v_flat = v_pages.reshape(num_pages * page_size, num_kv_heads, head_dim)

    kernel = functools.partial(
        _kernel, group=group, group_pad=group_pad, rows=rows, block_k=blocks.block_k,
        page_size=page_size, num_q_blocks=num_q_blocks, num_splits=num_splits,
        scale=scale, window=window, soft_cap=soft_cap,
    )
    o, lse = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((num_splits, num_kv_heads, n_rows, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((num_splits, num_kv_heads, n_rows), jnp.float32),
        ),
        grid=(num_reqs * num_q_blocks, num_kv_heads, num_splits),
        compiler_params=triton_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret,
        name="ragged_paged_attention",
    )(cu_q_lens.astype(jnp.int32), kv_lens.astype(jnp.int32), page_table.astype(jnp.int32),
      qr, k_flat, v_flat)

    def unrows(x: jax.Array) -> jax.Array:  # [S, Hkv, T*Gp + R, ...] -> [S, T, Hq, ...]
        x = x[:, :, : num_tokens * group_pad]
        x = x.reshape(num_splits, num_kv_heads, num_tokens, group_pad, *x.shape[3:])
        x = jnp.moveaxis(x[:, :, :, :group], 2, 1)
        return x.reshape(num_splits, num_tokens, num_q_heads, *x.shape[4:])

    out = unrows(o)[0] if num_splits == 1 else _merge_splits(unrows(o), unrows(lse))
    # Rows no program wrote (padding tokens) hold garbage (NaN in interpret mode).
    is_real = jnp.arange(num_tokens) < cu_q_lens[-1]
    return jnp.where(is_real[:, None, None], out, 0.0)
