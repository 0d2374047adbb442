"""Decode attention on the CPU backend as one XLA FFI custom call per layer.

In XLA a decode token's attention over the paged pool is a loop over key blocks, each a
row gather, two small GEMMs and a handful of elementwise programs: on this 2-core AMD
EPYC ~36 us a 128-key block, so SmolLM2 at B = 1 and 850 keys spends ~6.5 of its
~17 ms step there (benchmarks/README.md, twenty-fourth session). The handler
(cpu_decode_attention.cc) reads each key's row from the pool where it lies and does the
whole (request, KV head) in registers and one scores buffer:

    q [B, Hq, D] f32 (scaled), k_pool, v_pool [N, Hkv, D] (bf16 bits or f32),
    req_to_token [R, W], req_row [B], kv_len [B] (0: not a decode row), layer_base []
        --decode_attention-->  out [B, Hq, D] f32

Each (request, KV head) is computed alone, the same way in any batch, so decode needs no
other form for deterministic inference. Compiled with -march=native by `python -m
radixjax.model.cpu_decode --build` (scripts/setup.sh) into _cpu_decode_attention.so;
without it, or off the CPU backend, `available()` is False and decode keeps its XLA
form (model/native_attention.py, also the reference the handler is tested against).
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.ffi_library import compile_handler, load_handlers

TARGET = "radixjax_decode_attention"
SOURCE = Path(__file__).with_name("cpu_decode_attention.cc")
LIBRARY = Path(__file__).with_name("_cpu_decode_attention.so")
HEAD_DIMS = (64, 128, 256)  # the head sizes the handler is compiled for


def build() -> Path:
    """Compile the handler for this machine's CPU (~3 s); returns the library's path."""
    return compile_handler(SOURCE, LIBRARY, ["-O3", "-march=native"])


@cache
def _library() -> object | None:
    return load_handlers("radixjax.model.cpu_decode", SOURCE, LIBRARY,
                         {TARGET: "RadixjaxDecodeAttention"},
                         "decode attention stays in XLA")


def available() -> bool:
    """Whether programs on this JAX backend can use the handler: the CPU backend, with it
    built."""
    return jax.default_backend() == "cpu" and _library() is not None


def supports(head_dim: int, v_dim: int) -> bool:
    """Whether the handler computes heads of these sizes (keys and values alike)."""
    return head_dim == v_dim and head_dim in HEAD_DIMS


def decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                     req_to_token: jax.Array, req_row: jax.Array, kv_len: jax.Array,
                     layer_base: jax.Array | int, window: int | None) -> jax.Array:
    """q [B, Hq, D] (scaled), pools [N, Hkv, D] (f32, or a bf16 pool's uint16 bits),
    req_to_token [R, W], req_row [B], kv_len [B] (0: no decode token; its row zeros),
    layer_base: the layer's first pool row -> [B, Hq, D] f32: each row's query over its
    keys 0 .. kv_len - 1 (the last `window` of them with a window). Requires available()."""
    if _library() is None:
        raise RuntimeError(f"{LIBRARY.name} is not built "
                           "(python -m radixjax.model.cpu_decode --build)")
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGET, out)(
        q.astype(jnp.float32), k_pool, v_pool, req_to_token.astype(jnp.int32),
        req_row.astype(jnp.int32), kv_len.astype(jnp.int32),
        jnp.asarray(layer_base, jnp.int32), window=np.int64(window or 0))


if __name__ == "__main__":
    if sys.argv[1:] != ["--build"]:
        sys.exit("usage: python -m radixjax.model.cpu_decode --build")
    print(build())
