"""Write the new tokens' K/V into the paged pool in place (Pallas, Triton backend).

The pools are aliased input -> output (`input_output_aliases`), so under a jit that
donates them XLA writes into the same buffers: the cost is the T new rows, never a copy
of the pool and never a dense gather. Grid (T / BT, Hkv): program (i, h) scatters rows
[BT, D] of KV head h to their slots.

Slots are flat: slot = page * P + offset, as in `AttentionMetadata.out_slots`. Padded
tokens all target the dummy slot 0; their concurrent writes race harmlessly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.compat import check_triton_dim, resolve_interpret, triton_params

MAX_BLOCK_TOKENS = 16


def _kernel(
    slots_ref,  # [T] int32
    k_new_ref,  # [T, Hkv, D]
    v_new_ref,  # [T, Hkv, D]
    k_in_ref,  # [N*P, Hkv, D] aliased with k_ref
    v_in_ref,  # [N*P, Hkv, D] aliased with v_ref
    k_ref,  # [N*P, Hkv, D]
    v_ref,  # [N*P, Hkv, D]
    *, block_t: int,
):
    del k_in_ref, v_in_ref  # same buffers as the outputs
    h = pl.program_id(1)
    t = pl.ds(pl.program_id(0) * block_t, block_t)
    slots = slots_ref[t]  # [BT]
    k_ref[slots, h, :] = k_new_ref[t, h, :].astype(k_ref.dtype)  # [BT, D]
    v_ref[slots, h, :] = v_new_ref[t, h, :].astype(v_ref.dtype)


def _token_block(num_tokens: int) -> int:
    """Largest power of two <= MAX_BLOCK_TOKENS dividing T (T buckets are powers of two,
    except a non-power largest bucket, which falls back to smaller blocks)."""
    bt = MAX_BLOCK_TOKENS
    while num_tokens % bt:
        bt //= 2
    return bt


@functools.partial(jax.jit, static_argnames=("interpret",))
def write_kv_pages(
    k_pages: jax.Array,  # [N, P, Hkv, D]
    v_pages: jax.Array,  # [N, P, Hkv, D]
    k_new: jax.Array,  # [T, Hkv, D]
    v_new: jax.Array,  # [T, Hkv, D]
    slots: jax.Array,  # [T] int32, flat slot (page * P + offset) of each new token
    *,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Returns the pools with row `slots[t]` set to token t's K/V (cast to the pool dtype).
    Donate the pools (jit donate_argnums) to make the write in place."""
    num_pages, page_size, num_kv_heads, head_dim = k_pages.shape
    num_tokens = k_new.shape[0]
    flat = (num_pages * page_size, num_kv_heads, head_dim)
    block_t = _token_block(num_tokens)
    interpret = resolve_interpret(interpret)
    check_triton_dim("head_dim", head_dim, interpret)
    k_flat, v_flat = pl.pallas_call(
        functools.partial(_kernel, block_t=block_t),
        out_shape=(jax.ShapeDtypeStruct(flat, k_pages.dtype),
                   jax.ShapeDtypeStruct(flat, v_pages.dtype)),
        grid=(num_tokens // block_t, num_kv_heads),
        input_output_aliases={3: 0, 4: 1},
        compiler_params=triton_params(num_warps=1, num_stages=1),
        interpret=interpret,
        name="write_kv_pages",
    )(slots.astype(jnp.int32), k_new, v_new, k_pages.reshape(flat), v_pages.reshape(flat))
    return k_flat.reshape(k_pages.shape), v_flat.reshape(v_pages.shape)
