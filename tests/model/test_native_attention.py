"""The native backend's decode path against a numpy softmax attention, for both of its
forms: few KV heads (one block-diagonal GEMM over all heads) and many (per head), in the
largest and the smallest key blocks (the block follows the batch size)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model import native_attention as na
from radixjax.model.attention import TABLE_ALIGN, AttentionMetadata
from radixjax.model.native_attention import (
    BLOCK_DIAGONAL_MAX_KV_HEADS,
    DECODE_MAX_BLOCK_K,
    DECODE_MIN_BLOCK_K,
    decode_block_k,
    native_attention,
    uses_block_diagonal,
)


def numpy_decode(q, k_pool, v_pool, slots, window):
    """q [Hq, Dh] (unscaled) over the keys at `slots` -> [Hq, Dh]."""
    hkv, dh = k_pool.shape[1:]
    group = q.shape[0] // hkv
    if window is not None:
        slots = slots[-window:]
    k, v = k_pool[slots], v_pool[slots]  # [K, Hkv, Dh]
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        s = k[:, h // group] @ q[h] * dh**-0.5
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[:, h // group]
    return out


@pytest.mark.parametrize("num_kv_heads", [2, BLOCK_DIAGONAL_MAX_KV_HEADS + 4])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("block_k", [DECODE_MAX_BLOCK_K, DECODE_MIN_BLOCK_K])
def test_decode_matches_numpy(num_kv_heads: int, window: int | None, block_k: int,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(na, "decode_block_k", lambda batch: block_k)
    rng = np.random.default_rng(num_kv_heads)
    group, dh, num_slots = 2, 8, 1300
    kv_lens = [3, 300, 900]  # across several key blocks, and a tail
    k_pool = rng.standard_normal((num_slots, num_kv_heads, dh)).astype(np.float32)
    v_pool = rng.standard_normal((num_slots, num_kv_heads, dh)).astype(np.float32)
    table = np.zeros((len(kv_lens) + 1, TABLE_ALIGN * 2), np.int32)
    perm = rng.permutation(np.arange(1, num_slots))
    rows, at = [], 0
    for i, n in enumerate(kv_lens):
        table[i, :n] = perm[at:at + n]
        rows.append(table[i, :n].copy())
        at += n
    b = len(kv_lens)
    q = rng.standard_normal((b, num_kv_heads * group, dh)).astype(np.float32)
    new_k = k_pool[[r[-1] for r in rows]]  # the step writes these (already in the pool)
    new_v = v_pool[[r[-1] for r in rows]]
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    md = AttentionMetadata(
        positions=i32([n - 1 for n in kv_lens]), out_slots=i32([r[-1] for r in rows]),
        token_req=i32(range(b)), q_start=i32(range(b)), q_len=i32([1] * b),
        kv_len=i32(kv_lens), req_row=i32(range(b)), req_to_token=jnp.asarray(table))
    out, _, _ = native_attention(jnp.asarray(q), jnp.asarray(new_k), jnp.asarray(new_v),
                                 jnp.asarray(k_pool), jnp.asarray(v_pool), md, window,
                                 dh**-0.5)
    for i, r in enumerate(rows):
        ref = numpy_decode(q[i], k_pool, v_pool, r, window)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=2e-5, atol=2e-5)


def test_decode_form_follows_kv_heads_and_batch() -> None:
    """The test above runs both forms (by KV heads, at B = 3); large batches take the
    per-head form too (measured faster at B = 64)."""
    assert uses_block_diagonal(2, 3) and uses_block_diagonal(3, 32)
    assert not uses_block_diagonal(BLOCK_DIAGONAL_MAX_KV_HEADS + 4, 3)
    assert not uses_block_diagonal(3, 64)


def test_decode_key_block_follows_batch() -> None:
    """About 2048 pool rows per loop step, in blocks of 32..256 keys (powers of two)."""
    assert [decode_block_k(b) for b in (1, 8, 9, 16, 32, 64, 1024)] == [
        256, 256, 128, 128, 64, 32, 32]
