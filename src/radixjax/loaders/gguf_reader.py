"""A fast GGUF reader: the metadata as a Python dict and each tensor as a numpy view of the
memory-mapped file.

Why not `gguf.GGUFReader`: it builds one numpy memmap slice per value, so a GGUF whose
metadata holds a 49k-token vocabulary and 48k merges (SmolLM2's) takes ~5 s to open on
this CPU, paid by every server start; this reader walks the same bytes with `struct` in
~0.3 s. The `gguf` package still supplies the format's constants and the dequantization.
Little-endian files only (what llama.cpp writes).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC
from gguf.quants import quant_shape_to_byte_shape

# scalar value types -> struct format
_SCALARS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d", GGUFValueType.BOOL: "?",
}
# unquantized tensor types -> numpy element type
_PLAIN = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # plain types: [*dims reversed]; quantized: the raw bytes, per row


class GGUFFile(NamedTuple):
    metadata: dict[str, Any]  # strings decoded; arrays as lists
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads GGUF values from a buffer, front to back."""

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        self.pos += n
        return str(self.buf[self.pos - n: self.pos], "utf-8")

    def value(self, vtype: int) -> Any:
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type, n = self.unpack("I"), self.unpack("Q")
            fmt = _SCALARS.get(GGUFValueType(item_type))
            if fmt is None:  # strings or nested arrays: one by one
                return [self.value(item_type) for _ in range(n)]
            out = list(struct.unpack_from(f"<{n}{fmt}", self.buf, self.pos))
            self.pos += n * struct.calcsize(fmt)
            return out
        return self.unpack(_SCALARS[vtype])


def read_gguf(path: str | Path) -> GGUFFile:
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(memoryview(mapped))
    if cur.unpack("I") != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (or a big-endian one)")
    version, num_tensors, num_kv = cur.unpack("I"), cur.unpack("Q"), cur.unpack("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    metadata: dict[str, Any] = {}
    for _ in range(num_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("I"))
    infos = []
    for _ in range(num_tensors):
        name = cur.string()
        dims = [cur.unpack("Q") for _ in range(cur.unpack("I"))]
        infos.append((name, dims, GGMLQuantizationType(cur.unpack("I")), cur.unpack("Q")))
    align = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    start = -(-cur.pos // align) * align
    raw = np.frombuffer(mapped, np.uint8)
    tensors = []
    for name, dims, ttype, offset in infos:
        shape = tuple(reversed(dims))  # GGUF lists the fastest-moving dimension first
        count = int(np.prod(shape))
        block, type_size = GGML_QUANT_SIZES[ttype]
        nbytes = count * type_size // block
        data = raw[start + offset: start + offset + nbytes]
        if ttype in _PLAIN:
            data = data.view(_PLAIN[ttype]).reshape(shape)
        else:
            data = data.reshape(quant_shape_to_byte_shape(shape, ttype))
        tensors.append(GGUFTensor(name, ttype, data))
    return GGUFFile(metadata, tensors)
