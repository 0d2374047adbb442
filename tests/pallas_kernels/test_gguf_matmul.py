"""The GPU form of GGUF products (pallas_kernels/gguf_planes.py, gguf_matmul.py): every
type's planes dequantize to the gguf package's numbers bit for bit; the kernel
(interpreted here, tiny shapes) equals its reference, the planes dequantized and
multiplied in f64; it lowers for CUDA with the planes read in place (no float copy)."""

from __future__ import annotations

import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.compat import lower_for_cuda
from pallas_kernels.gguf_matmul import BLOCK_N, gguf_matmul, pad_rows
from pallas_kernels.gguf_planes import FILE_BYTES, FORMS, Planes, common_form, dequantize, to_planes
from tests.model.test_gguf_blocks import T, dequantized, random_blocks

TYPES = sorted(FORMS)
IDS = [T(t).name for t in TYPES]


def _k(qtype: int) -> int:
    return 512 if FORMS[qtype].sblock == 256 else 128


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_planes_dequantize_as_the_gguf_package_does(qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    k = _k(qtype)
    raw = random_blocks(rng, T(qtype), 24, k)
    p = to_planes(raw, qtype, k)
    np.testing.assert_array_equal(dequantize(p), dequantized(raw, T(qtype)))
    assert p.nbytes() * 8 / (24 * k) <= FORMS[qtype].bits + 2.5  # bits a weight: no copy


def _on_device(p: Planes) -> Planes:
    return jax.tree.map(jnp.asarray, pad_rows(p), is_leaf=lambda a: isinstance(a, np.ndarray))


@pytest.mark.parametrize("pair", [(12, 14), (2, 8), (6, 3), (13, 12)],
                         ids=["Q4_K+Q6_K", "Q4_0+Q8_0", "Q5_0+Q4_1", "Q5_K+Q4_K"])
def test_a_common_form_holds_each_type_exactly(pair: tuple[int, int]) -> None:
    """Layers of one stack whose types differ (Q4_K_M: Q4_K and Q6_K ffn_down) share a
    form their planes convert to with the same weights, bit for bit."""
    rng = np.random.default_rng(sum(pair))
    form = common_form([FORMS[t] for t in pair])
    k = max(_k(t) for t in pair)
    for qtype in pair:
        raw = random_blocks(rng, T(qtype), 8, k)
        p = to_planes(raw, qtype, k, form)
        assert p.form == form
        np.testing.assert_array_equal(dequantize(p), dequantized(raw, T(qtype)))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_kernel_equals_the_dequantized_product(qtype: int) -> None:
    rng = np.random.default_rng(100 + qtype)
    k, n, m = _k(qtype), 80, 3  # n: one padded block of rows past the first
    p = to_planes(random_blocks(rng, T(qtype), n, k), qtype, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = np.asarray(gguf_matmul(jnp.asarray(x), _on_device(p), interpret=True))
    ref = x.astype(np.float64) @ dequantize(p).astype(np.float64).T
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize(("qtype", "k"), [(12, 1536), (14, 8960), (6, 896), (8, 896)],
                         ids=["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_lowers_for_cuda_reading_the_planes_in_place(qtype: int, k: int,
                                                             dtype) -> None:
    """Qwen2.5-Coder's shapes (1.5B: Q4_K at K 1536, Q6_K ffn_down at 8960; 0.5B: Q5_0,
    Q8_0 at 896): one Triton call; nothing [N, K]-sized in a float type outside it."""
    n, m = 1536, 8
    planes = jax.eval_shape(lambda: _on_device(to_planes(
        np.zeros((n, k // FORMS[qtype].sblock * FILE_BYTES[qtype]), np.uint8),
        qtype, k)))
    text = lower_for_cuda(partial(gguf_matmul, interpret=False),
                          jax.ShapeDtypeStruct((m, k), dtype), planes).as_text()
    assert text.count("stablehlo.custom_call @__gpu$xla.gpu.triton") == 1
    assert not re.search(rf"tensor<{n}x{k}x(f32|bf16|f16)>", text)
    grid = re.search(r"grid_x = (\d+) : i32, grid_y = (\d+) : i32", text)
    assert grid and (int(grid[1]), int(grid[2])) == (1, n // BLOCK_N)
