"""The step's new tokens over the step's new keys (model/new_keys.py): the lower triangle
of token blocks against a numpy causal softmax per request, with requests packed across
block boundaries, padding, a window, and bf16 operands."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model.new_keys import block_tokens, merge, new_key_carry


def _finish(carry: tuple) -> np.ndarray:
    _, denom, acc = (np.asarray(x) for x in carry)
    return acc / denom[..., None]


def _numpy(q, k, v, req, pos, window):
    """[T, Hkv, G, D] each token over the keys of its request at or before it."""
    out = np.zeros(q.shape[:3] + (v.shape[-1],), np.float64)
    for t in range(q.shape[0]):
        keys = [u for u in range(t + 1) if req[u] == req[t]
                and (window is None or pos[u] > pos[t] - window)]
        s = np.einsum("hgd,khd->hgk", q[t], k[keys])
        p = np.exp(s - s.max(-1, keepdims=True))
        out[t] = np.einsum("hgk,khd->hgd", p / p.sum(-1, keepdims=True), v[keys])
    return out


@pytest.mark.parametrize("block, window, dtype, scale", [
    (4, None, jnp.float32, 1), (4, 3, jnp.float32, 1), (None, None, jnp.float32, 1),
    (4, None, jnp.float32, 40),  # scores past exp's f32 range: the maxima matter
    (8, None, jnp.bfloat16, 1)])
def test_new_keys_match_numpy(block: int | None, window: int | None,
                              dtype: jnp.dtype, scale: float) -> None:
    rng = np.random.default_rng(0)
    lens = [5, 1, 9, 3]  # crossing blocks of 4 and 8; a one-token (decode) request
    req = np.repeat(np.arange(len(lens)), lens)
    pos = np.concatenate([np.arange(7, 7 + n) for n in lens])  # after a cached prefix
    t = len(req) + 2  # two padded tokens (their request: the last one, as a step pads)
    req = np.concatenate([req, [len(lens) - 1] * 2]).astype(np.int32)
    pos = np.concatenate([pos, [0, 0]]).astype(np.int32)
    q = (rng.standard_normal((t, 2, 3, 8)) * scale).astype(np.float32)
    k = rng.standard_normal((t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((t, 2, 6)).astype(np.float32)
    carry = new_key_carry(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(req),
                          jnp.asarray(pos), window, dtype, block)
    ref = _numpy(q, k, v, req, pos, window)[:t - 2]
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(_finish(carry)[:t - 2], ref, rtol=tol, atol=tol)


def test_merged_carries_equal_one_softmax() -> None:
    """Two carries over disjoint keys merge into the softmax over all of them."""
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal(10) * 4, rng.standard_normal((10, 3))

    def carry(idx):
        m = s[idx].max()
        p = np.exp(s[idx] - m)
        return jnp.asarray([m]), jnp.asarray([p.sum()]), jnp.asarray([p @ v[idx]])

    p = np.exp(s - s.max())
    np.testing.assert_allclose(_finish(merge(carry(slice(0, 4)), carry(slice(4, 10))))[0],
                               p @ v / p.sum(), rtol=1e-6)


def test_block_is_half_the_tokens_within_bounds() -> None:
    assert [block_tokens(t) for t in (16, 128, 256, 384, 512, 1024, 2048)] == \
        [16, 128, 128, 192, 256, 512, 512]
