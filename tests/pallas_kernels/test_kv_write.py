"""The KV-write kernel (interpret mode on CPU): rows land at their flat slots, every
other row is untouched, the cast to the pool dtype, and the write is in place under a
donating jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.kv_write import write_kv_pages
from pallas_kernels.ref import write_kv_pages_ref


def _inputs(num_tokens: int, page_size: int, pool_dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    num_pages, kv_heads, head_dim = 48 // page_size, 3, 16  # Triton: D a power >= 16
    shape = (num_pages, page_size, kv_heads, head_dim)
    k = jnp.asarray(rng.standard_normal(shape), pool_dtype)
    v = jnp.asarray(rng.standard_normal(shape), pool_dtype)
    num_real = num_tokens - 3  # three padded tokens, all aimed at the dummy slot 0
    real = rng.permutation(np.arange(page_size, num_pages * page_size))[:num_real]
    slots = jnp.asarray(np.concatenate([real, [0, 0, 0]]), jnp.int32)
    k_new = jnp.asarray(rng.standard_normal((num_tokens, kv_heads, head_dim)), jnp.float32)
    v_new = jnp.asarray(rng.standard_normal((num_tokens, kv_heads, head_dim)), jnp.float32)
    return k, v, k_new, v_new, slots


@pytest.mark.parametrize(("num_tokens", "page_size", "dtype"),
                         [(16, 1, jnp.float32), (13, 16, jnp.float32), (8, 16, jnp.bfloat16)])
def test_write_matches_reference(num_tokens: int, page_size: int, dtype) -> None:
    k, v, k_new, v_new, slots = _inputs(num_tokens, page_size, dtype, seed=num_tokens)
    ours = write_kv_pages(k, v, k_new, v_new, slots)
    ref = write_kv_pages_ref(k, v, k_new, v_new, slots)
    for o, r, before in zip(ours, ref, (k, v), strict=True):
        assert o.dtype == dtype
        o, r = np.asarray(o, np.float32), np.asarray(r, np.float32)
        flat = o.reshape(-1, *o.shape[2:])
        # Slot 0 holds one of the padded tokens (which one is a race); all else is exact.
        np.testing.assert_array_equal(flat[1:], r.reshape(flat.shape)[1:])
        untouched = np.setdiff1d(np.arange(1, flat.shape[0]), np.asarray(slots))
        np.testing.assert_array_equal(
            flat[untouched], np.asarray(before, np.float32).reshape(flat.shape)[untouched])


def test_write_is_in_place_under_donation() -> None:
    k, v, k_new, v_new, slots = _inputs(16, 16, jnp.float32)
    ptrs = (k.unsafe_buffer_pointer(), v.unsafe_buffer_pointer())
    step = jax.jit(write_kv_pages, donate_argnums=(0, 1))
    k2, v2 = step(k, v, k_new, v_new, slots)
    assert (k2.unsafe_buffer_pointer(), v2.unsafe_buffer_pointer()) == ptrs
    assert k.is_deleted() and v.is_deleted()
