"""Weights kept in their GGUF blocks, multiplied where they lie (`--quantization gguf`).

A decode step streams every weight once, so on the CPU its time is the bytes it reads:
a Q4_K_M file's layers are ~4.8 bits a weight, while an int8 copy of them (w8a16_int8)
reads 8 (Qwen2.5-Coder-1.5B: ~1.54 GB a token against the file's 0.98 GB). Here the
products read the file's own blocks (gguf_matmul.cc, an XLA FFI handler compiled with
-march=native: AVX-512 VNNI), so no f32 or int8 copy of a quantized matrix is ever held:

    BlockWeight(data [bytes] u8, segs [S, 2] s32, rows (S,), k)
        data: the matrix's blocks, the file's bits interleaved in tiles of 16 rows (packed:
        each 8 values of 16 rows' codes in one 64-byte register, as the products read
        them; a stacked layer group's layers one after another); segment s (q | k | v
        fused, say) starts at byte 64 * segs[s, 0], in GGML type segs[s, 1], rows[s] rows
        of k values.
    block_linear(x [T, K] f32, w) -> [T, N] f32      (N = sum(rows))
    block_rows(ids [T] s32, w) -> [T, K] f32         (the embedding's gather)

The activations enter as int8 per 32 values with an f32 scale each (llama.cpp uses 32 for
the legacy types and 256 for K-quants); one VNNI instruction multiplies 4 values of an
activation row by the same 4 values of 16 weight rows, the integer sums exact, scaled in
f32 once per group of 32 (Q6_K: 16) values, a row's bits the same in any batch. Types
with a product: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (PRODUCT_TYPES); a matrix
of another type is dequantized and takes the current path (w8a16_int8), said once at
load. The default form of a GGUF file on one CPU device (engine/config.py serving_form).
On a GPU the same form holds planes instead (model/gguf_gpu.py PlanesWeight, a Pallas
kernel); concat, stack, to_device, block_linear and block_rows hand those there.

In a layer group's scan the data stays whole (resident, like oneDNN's packed stacks:
layer_stack.split_resident) and each layer's segs row carries its offsets and types, so
layers of one group may differ in type (Q4_K_M gives some layers' ffn_down and attn_v
Q6_K)."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model import gguf_gpu
from radixjax.model.ffi_library import compile_handler, load_handlers
from radixjax.model.gguf_gpu import PlanesWeight

SOURCE = Path(__file__).with_name("gguf_matmul.cc")
LIBRARY = Path(__file__).with_name("_gguf_matmul.so")
MATMUL, ROWS = "radixjax_gguf_matmul", "radixjax_gguf_rows"
# GGML type ids with a product here (gguf.GGMLQuantizationType values)
PRODUCT_TYPES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K",
                 13: "Q5_K", 14: "Q6_K"}
ALIGN = 64  # each segment starts at a multiple of this many bytes


def build() -> Path:
    """Compile the handler (~5 s) for this CPU; returns the library's path."""
    return compile_handler(SOURCE, LIBRARY, ["-O3", "-march=native", "-ffp-contract=off"])


@cache
def _library() -> ctypes.CDLL | None:
    lib = load_handlers("radixjax.model.gguf_blocks", SOURCE, LIBRARY,
                        {MATMUL: "RadixjaxGgufMatmul", ROWS: "RadixjaxGgufRows"},
                        "GGUF matrices are dequantized and take the int8 path")
    if lib is not None:
        lib.RadixjaxGgufRowBytes.restype = ctypes.c_int64
        lib.RadixjaxGgufRowBytes.argtypes = [ctypes.c_int32, ctypes.c_int64]
        lib.RadixjaxGgufPackedBytes.restype = ctypes.c_int64
        lib.RadixjaxGgufPackedBytes.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int64]
        lib.RadixjaxGgufPack.restype = None
        lib.RadixjaxGgufPack.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p, ctypes.c_void_p]
    return lib


def available() -> bool:
    """Whether programs on this JAX backend can multiply GGUF blocks: the CPU backend,
    with the handler built."""
    return jax.default_backend() == "cpu" and _library() is not None


def has_product(qtype: int, k: int) -> bool:
    """Whether a [N, k] matrix of GGML type qtype multiplies in its blocks here."""
    return available() and qtype in PRODUCT_TYPES and _library().RadixjaxGgufRowBytes(qtype, k) > 0


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class BlockWeight:
    """A matrix [N, K] (out, in) in its GGUF blocks; see the module's docstring."""

    data: jax.Array | np.ndarray | None  # [bytes] u8 (None inside a scan: resident)
    segs: jax.Array | np.ndarray  # [S, 2] int32 ([n, S, 2] stacked)
    rows: tuple[int, ...] = field(metadata={"static": True})
    k: int = field(metadata={"static": True})

    @property
    def n(self) -> int:
        return sum(self.rows)


# a matrix in its GGUF blocks: tiles for the CPU handler, or planes for the GPU kernel
# (model/gguf_gpu.py), whose functions these hand it to
GGUF_WEIGHTS = (BlockWeight, PlanesWeight)


def servable_here() -> bool:
    """Whether this JAX backend multiplies GGUF blocks: a GPU (the Pallas kernel), or
    the CPU with the handler built."""
    return jax.default_backend() == "gpu" or available()


def holds_blocks(params: object) -> bool:
    """Whether a parameter tree has matrices in their GGUF blocks."""
    leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, GGUF_WEIGHTS))
    return any(isinstance(x, GGUF_WEIGHTS) for x in leaves)


def packed(raw: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """One GGUF matrix's rows (raw [N, row_bytes] u8, as the file holds them) -> the same
    bits in the handler's tiles of 16 rows ([bytes] u8, zero-padded to a multiple of
    ALIGN)."""
    _require()
    lib = _library()
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.shape[0]
    assert raw.shape[1] == lib.RadixjaxGgufRowBytes(qtype, k), (raw.shape, qtype, k)
    size = lib.RadixjaxGgufPackedBytes(qtype, n, k)
    out = np.zeros(size + -size % ALIGN, np.uint8)
    lib.RadixjaxGgufPack(qtype, n, k, raw.ctypes.data, out.ctypes.data)
    return out


def from_blocks(raw: np.ndarray, qtype: int, k: int) -> BlockWeight:
    """One GGUF matrix's rows (raw [N, row_bytes] u8, as the file holds them) -> a
    BlockWeight on the host (numpy: moved to the device when stacked or used)."""
    return BlockWeight(packed(raw, qtype, k), np.array([[0, qtype]], np.int32),
                       (raw.shape[0],), k)


def concat(parts: list[BlockWeight]) -> BlockWeight:
    """Matrices of one K (same-layer parts: q, k, v) -> one with their rows in order,
    each part's segments kept with their types."""
    if isinstance(parts[0], PlanesWeight):
        return gguf_gpu.concat(parts)
    datas, segs, rows, base = [], [], [], 0
    for p in parts:
        assert p.k == parts[0].k
        data = np.asarray(p.data)
        datas.append(data)
        segs.append(np.asarray(p.segs) + np.array([base // ALIGN, 0], np.int32))
        rows.extend(p.rows)
        base += data.size
    return BlockWeight(np.concatenate(datas), np.concatenate(segs), tuple(rows), parts[0].k)


def stack(layers: list[BlockWeight]) -> BlockWeight:
    """One matrix per layer of a group -> data one after another (on the device), segs
    [n, S, 2]."""
    if isinstance(layers[0], PlanesWeight):
        return gguf_gpu.stack(layers)
    one = concat(layers)  # the same bytes; its segs [n * S, 2]
    segs = np.asarray(one.segs).reshape(len(layers), -1, 2)
    return BlockWeight(jnp.asarray(one.data), jnp.asarray(segs), layers[0].rows, one.k)


def to_device(w: BlockWeight) -> BlockWeight:
    if isinstance(w, PlanesWeight):
        return gguf_gpu.to_device(w)
    return BlockWeight(jnp.asarray(w.data), jnp.asarray(w.segs), w.rows, w.k)


def _require() -> None:
    if _library() is None:
        raise RuntimeError(f"{LIBRARY.name} is not built (python -m radixjax.model.gguf_blocks "
                           "--build)")


def block_linear(x: jax.Array, w: BlockWeight) -> jax.Array:
    """x [T, K] f32 -> x @ w.T [T, N] f32 (w's segs: [S, 2], one layer's)."""
    if isinstance(w, PlanesWeight):
        return gguf_gpu.planes_linear(x, w)
    _require()
    out = jax.ShapeDtypeStruct((x.shape[0], w.n), jnp.float32)
    return jax.ffi.ffi_call(MATMUL, out)(x.astype(jnp.float32), w.data, w.segs,
                                         rows=np.asarray(w.rows, np.int64))


def block_rows(ids: jax.Array, w: BlockWeight) -> jax.Array:
    """ids [T] int32 -> rows [T, K] f32 of w (one segment), dequantized as the gguf
    package does (the same bits)."""
    if isinstance(w, PlanesWeight):
        return gguf_gpu.planes_rows(ids, w)
    _require()
    out = jax.ShapeDtypeStruct((ids.shape[0], w.k), jnp.float32)
    return jax.ffi.ffi_call(ROWS, out)(ids.astype(jnp.int32), w.data, w.segs,
                                       rows=np.asarray(w.rows, np.int64))


if __name__ == "__main__":
    if sys.argv[1:] != ["--build"]:
        sys.exit("usage: python -m radixjax.model.gguf_blocks --build")
    print(build())
