"""oneDNN's int8 matmul inside XLA CPU programs (an FFI custom call).

XLA's CPU int8 GEMM reaches about a third of what this hardware does with int8 (an AMD
EPYC with AVX-512 VNNI: [8, 576] x [576, 3072] 182 us in XLA, 67 us in oneDNN through
torch._int_mm; at 512 rows XLA's 156-283 GOPS against oneDNN's 824-873), and inside the
layer scan XLA copies each layer's weight slice before its dot. The custom call
(onednn_int8_matmul.cc) runs oneDNN's matmul on the int8 values and reads the layer's
weight in place from the stacked array, so W8A8's products (model/quant.py) use it on
the CPU backend wherever it is built:

    w [L, N, K] int8  --pack (at load)-->  packed [L, parts, P] int8
    x [M, K] int8, packed, layer [] int32  --int8_matmul-->  x @ w[layer].T [M, N] int32

The library is the `onednn-cpu-gomp` wheel (headers: `onednn-devel-cpu-gomp`); the
handler is compiled against it and jaxlib's FFI headers by `python -m
radixjax.model.onednn --build` (scripts/setup.sh runs it) into _onednn_int8_matmul.so
next to this file. Without that file, or off the CPU backend, `available()` is False and
the products stay in XLA (a warning says so once).
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.ffi_library import compile_handler, load_handlers

TARGET = "radixjax_int8_matmul"
SOURCE = Path(__file__).with_name("onednn_int8_matmul.cc")
LIBRARY = Path(__file__).with_name("_onednn_int8_matmul.so")


def _dnnl_dir() -> Path:
    """Where the oneDNN wheels put libdnnl.so and include/: the environment's prefix."""
    return Path(sys.prefix)


def build() -> Path:
    """Compile the handler (~5 s); returns the library's path."""
    prefix = _dnnl_dir()
    return compile_handler(SOURCE, LIBRARY, [
        "-O2", "-isystem", str(prefix / "include"), f"-L{prefix / 'lib'}", "-ldnnl",
        f"-Wl,-rpath,{prefix / 'lib'}"])


@cache
def _library() -> ctypes.CDLL | None:
    """The built handler, loaded and registered with XLA (once); None if not built."""
    lib = load_handlers("radixjax.model.onednn", SOURCE, LIBRARY,
                        {TARGET: "RadixjaxInt8Matmul"},
                        "the int8 products stay in XLA's int8 GEMM")
    if lib is None:
        return None
    lib.RadixjaxInt8PackedBytes.restype = ctypes.c_int64
    lib.RadixjaxInt8PackedBytes.argtypes = [ctypes.c_int64, ctypes.c_int64,
                                            ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    lib.RadixjaxInt8Pack.restype = ctypes.c_int
    lib.RadixjaxInt8Pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_void_p]
    return lib


def available() -> bool:
    """Whether programs on this JAX backend can use the oneDNN product: the CPU
    backend, with the handler built."""
    return jax.default_backend() == "cpu" and _library() is not None


def parts(n: int) -> int:
    """How many parts an [N, K] weight's rows are split into (run in parallel on XLA's
    CPU threads): one per core this process may use, while N splits evenly."""
    p = len(os.sched_getaffinity(0))
    while p > 1 and n % p:
        p -= 1
    return p


# Row counts checked when the caller names none: powers of two and 3 x them up to 16384
STEP_ROWS = tuple(sorted({m * f for m in (2 ** i for i in range(15)) for f in (1, 3)}))


@cache
def _packed_bytes(n: int, k: int, rows: tuple[int, ...] = (1,)) -> int:
    """Bytes of one packed [N, K] part; -1 where oneDNN has no fast kernel in one
    layout at every row count of `rows` (a descriptor each: once per shape)."""
    counts = (ctypes.c_int64 * len(rows))(*rows)
    return _library().RadixjaxInt8PackedBytes(n, k, counts, len(rows))


def packable(n: int, k: int, rows: tuple[int, ...] = STEP_ROWS) -> bool:
    """Whether oneDNN runs [N, K] weights (in parts(N) parts) with a fast kernel in one
    packed layout at each row count a product will have (`rows`: the runner's step
    sizes; requires available())."""
    return _packed_bytes(n // parts(n), k, tuple(sorted(set(rows)))) > 0


def pack(w: np.ndarray, num_parts: int | None = None) -> np.ndarray:
    """w [..., N, K] int8 -> [..., parts, P] int8: each [N, K] matrix's rows split into
    num_parts (None: parts(N)) equal parts, each in the layout oneDNN's matmul reads (with
    its compensation sums). Requires available()."""
    lib = _library()
    n, k = w.shape[-2:]
    num_parts = parts(n) if num_parts is None else num_parts
    rows = n // num_parts
    size = _packed_bytes(rows, k)
    if size < 0 or rows * num_parts != n:
        raise RuntimeError(f"oneDNN has no int8 matmul for [{n}, {k}] in {num_parts} parts")
    flat = np.ascontiguousarray(w, dtype=np.int8).reshape(-1, rows, k)
    out = np.empty((flat.shape[0], size), np.int8)
    for src, dst in zip(flat, out, strict=True):
        if lib.RadixjaxInt8Pack(src.ctypes.data, rows, k, dst.ctypes.data) != 0:
            raise RuntimeError(f"oneDNN could not pack a [{rows}, {k}] weight")
    return out.reshape(*w.shape[:-2], num_parts, size)


def int8_matmul(x: jax.Array, packed: jax.Array, n: int,
                layer: jax.Array | int = 0) -> jax.Array:
    """x [M, K] int8, packed [L, parts, P] (or [parts, P]): pack() of w [L, N, K] (or
    [N, K]), layer: which of the L -> x @ w[layer].T [M, N] int32 (exact). Requires
    available()."""
    assert x.dtype == jnp.int8 and packed.dtype == jnp.int8, (x.dtype, packed.dtype)
    if packed.ndim == 2:
        packed = packed[None]
    m, parts = x.shape[0], packed.shape[-2]
    out = jax.ShapeDtypeStruct((parts, m, n // parts), jnp.int32)  # the parts' outputs
    y = jax.ffi.ffi_call(TARGET, out)(x, packed, jnp.asarray(layer, jnp.int32))
    return y.transpose(1, 0, 2).reshape(m, n)


if __name__ == "__main__":
    if sys.argv[1:] != ["--build"]:
        sys.exit("usage: python -m radixjax.model.onednn --build")
    print(build())
