"""Every GGUF tensor type the downloaded files use, through our reader and loader: written
by the `gguf` package's writer (as llama.cpp lays them out), read back by
loaders/gguf_reader.py, dequantized by loaders/gguf_file.py equal to the `gguf` package's
reference on the same bytes. K-quants (which the `gguf` package cannot quantize) as
random blocks with valid float16 scales."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from radixjax.loaders.gguf_file import dequantize
from radixjax.loaders.gguf_reader import read_gguf
from radixjax.model.config import UnsupportedModelError

# per K-quant block: the byte offsets of its float16 scales (d, dmin), llama.cpp's layout
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
QUANTIZABLE = (Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
SHAPE = (6, 512)  # [rows, cols]: two K-quant blocks per row


def raw_tensor(qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Bytes of a [6, 512] tensor of this type, [rows, bytes per row] uint8."""
    if qtype in QUANTIZABLE:
        x = rng.standard_normal(SHAPE).astype(np.float32)
        out = gguf.quants.quantize(x, qtype)
        return out.view(np.uint8).reshape(SHAPE[0], -1)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (SHAPE[0] * SHAPE[1] // block, size), dtype=np.uint8)
    for at in K_SCALES[qtype]:
        scales = rng.uniform(1e-3, 0.1, len(blocks)).astype(np.float16)
        blocks[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(SHAPE[0], -1)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, tuple[Q, np.ndarray]]]:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("quants") / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    tensors = {}
    for qtype in (*QUANTIZABLE, *K_SCALES):
        raw = raw_tensor(qtype, rng)
        tensors[f"t.{qtype.name}"] = (qtype, raw)
        w.add_tensor(f"t.{qtype.name}", raw, raw_shape=raw.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, tensors


@pytest.mark.parametrize("qtype", [*QUANTIZABLE, *K_SCALES], ids=lambda q: q.name)
def test_read_and_dequantized_as_the_reference(written, qtype: Q) -> None:
    path, tensors = written
    _, raw = tensors[f"t.{qtype.name}"]
    t = next(t for t in read_gguf(path).tensors if t.name == f"t.{qtype.name}")
    assert t.tensor_type == qtype
    ours = dequantize(t)
    ref = gguf.quants.dequantize(raw, qtype)
    assert ours.shape == SHAPE and ours.dtype == np.float32
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    np.testing.assert_array_equal(ours, ref)


def test_a_type_without_a_dequantizer_is_named(written, monkeypatch) -> None:
    """A type the gguf package cannot dequantize (as it cannot some IQ types) is refused
    with the tensor and the type named."""
    path, _ = written
    t = next(t for t in read_gguf(path).tensors if t.name == "t.Q4_K")

    def missing(data: np.ndarray, qtype: Q) -> np.ndarray:
        raise NotImplementedError(f"Dequantization for {qtype.name} is not yet implemented")

    monkeypatch.setattr(gguf.quants, "dequantize", missing)
    with pytest.raises(UnsupportedModelError, match=r"t\.Q4_K: GGUF type Q4_K"):
        dequantize(t)
