"""Products with weights in their GGUF blocks (model/gguf_blocks.py, gguf_matmul.cc): every
block type's rows dequantize to the gguf package's numbers bit for bit; products equal
the exact sums of the dequantized weights with the activations as the kernel rounds them
(int8 per 32 values), for every row count, and a row's bits do not depend on its batch;
mixed-type segments and a layer scan over a stack read in place."""

from __future__ import annotations

import gc

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model import gguf_blocks
from radixjax.model.gguf_blocks import (
    PRODUCT_TYPES,
    block_linear,
    block_rows,
    concat,
    from_blocks,
    stack,
    to_device,
)


def _vnni() -> bool:
    return "avx512_vnni" in open("/proc/cpuinfo").read()  # noqa: SIM115


def test_built_on_this_machine() -> None:
    """scripts/setup.sh builds the handler wherever the CPU has AVX-512 VNNI (these
    machines): a missing build would silently turn --quantization gguf into w8a16."""
    if _vnni():
        assert gguf_blocks.available(), f"{gguf_blocks.LIBRARY} missing: python -m " \
            "radixjax.model.gguf_blocks --build"


needs_handler = pytest.mark.skipif(not gguf_blocks.available(),
                                   reason="the GGUF product handler is not built (no VNNI)")

T = gguf.GGMLQuantizationType
# each type's f16 fields (byte offsets in a block): d, and dmin / m where it has one
_F16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
               T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(rng: np.random.Generator, qtype: T, n: int, k: int) -> np.ndarray:
    """[n, row_bytes] u8: random codes and scales, every f16 field a finite value."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, k // values, size), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        f16 = (rng.standard_normal((n, k // values)) * 0.01).astype(np.float16)
        blocks[..., off:off + 2] = f16.view(np.uint8).reshape(n, k // values, 2)
    return blocks.reshape(n, -1)


def dequantized(raw: np.ndarray, qtype: T) -> np.ndarray:
    return gguf.quants.dequantize(raw, qtype).astype(np.float32)


def activations_as_rounded(x: np.ndarray) -> np.ndarray:
    """x [M, K] -> what the kernel multiplies: each 32 values int8 at amax / 127."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(b * inv), -127, 127)
    return (q * (amax / np.float32(127))).reshape(x.shape).astype(np.float64)


TYPES = sorted(PRODUCT_TYPES)


@needs_handler
@pytest.mark.parametrize("qtype", TYPES, ids=[PRODUCT_TYPES[t] for t in TYPES])
def test_rows_dequantize_as_the_gguf_package_does(qtype: int) -> None:
    qtype = T(qtype)
    k = 512 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 96  # 96: a half 64-chunk
    raw = random_blocks(np.random.default_rng(qtype), qtype, 40, k)
    w = to_device(from_blocks(raw, qtype, k))
    ids = jnp.asarray([0, 39, 7, 7, 21], jnp.int32)
    got = np.asarray(jax.jit(block_rows)(ids, w))
    np.testing.assert_array_equal(got, dequantized(raw, qtype)[np.asarray(ids)])


@needs_handler
@pytest.mark.parametrize("qtype", TYPES, ids=[PRODUCT_TYPES[t] for t in TYPES])
def test_products_equal_exact_sums_at_every_row_count(qtype: int) -> None:
    qtype = T(qtype)
    rng = np.random.default_rng(100 + qtype)
    k = 768 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 352  # 352: a half chunk
    n = 70  # more than one task of 32 rows, not a multiple of it
    raw = random_blocks(rng, qtype, n, k)
    w = to_device(from_blocks(raw, qtype, k))
    wf = dequantized(raw, qtype).astype(np.float64)
    f = jax.jit(block_linear)
    x_all = rng.standard_normal((19, k)).astype(np.float32)
    x_all[3, 40] = 30.0  # an outlier channel
    x_all[5] = 0.0  # an all-zero row
    for m in (1, 2, 8, 9, 19):
        x = x_all[:m]
        got = np.asarray(f(jnp.asarray(x), w))
        want = activations_as_rounded(x) @ wf.T
        scale = np.abs(activations_as_rounded(x)) @ np.abs(wf).T + 1e-30
        assert np.max(np.abs(got - want) / scale) < 1e-5, (PRODUCT_TYPES[qtype], m)
        # a row's bits do not depend on its batch
        np.testing.assert_array_equal(got[0], np.asarray(f(jnp.asarray(x[:1]), w))[0])
    # against f32 activations (rows without an outlier): the int8 rounding's error only
    x = x_all[:3]
    err = np.abs(np.asarray(f(jnp.asarray(x), w)) - x.astype(np.float64) @ wf.T).max()
    assert err / np.abs(x.astype(np.float64) @ wf.T).max() < 0.01


@needs_handler
def test_mixed_type_segments_and_a_layer_scan() -> None:
    """q | k | v of different types in one product; a stack of 3 layers whose types
    differ per layer, scanned: each layer's product as its own matrix's."""
    rng = np.random.default_rng(5)
    k, rows = 256, (64, 32, 32)
    layer_types = [(T.Q4_K, T.Q4_K, T.Q6_K), (T.Q4_K, T.Q4_K, T.Q4_K), (T.Q8_0, T.Q5_0, T.Q6_K)]
    layers, refs = [], []
    for types in layer_types:
        raws = [random_blocks(rng, t, r, k) for t, r in zip(types, rows, strict=True)]
        layers.append(concat([from_blocks(r, t, k) for r, t in zip(raws, types, strict=True)]))
        refs.append(np.concatenate([dequantized(r, t) for r, t in zip(raws, types, strict=True)]))
    stacked = stack(layers)
    x = rng.standard_normal((4, k)).astype(np.float32)

    def run(x: jax.Array, w: gguf_blocks.BlockWeight) -> jax.Array:
        def body(c: jax.Array, segs: jax.Array) -> tuple:
            return c, block_linear(x, gguf_blocks.BlockWeight(w.data, segs, w.rows, w.k))
        return jax.lax.scan(body, 0, w.segs)[1]

    got = np.asarray(jax.jit(run)(jnp.asarray(x), stacked))  # [3, 4, 128]
    for layer, ref in enumerate(refs):
        one = np.asarray(jax.jit(block_linear)(jnp.asarray(x), to_device(layers[layer])))
        np.testing.assert_array_equal(got[layer], one)
        want = activations_as_rounded(x) @ ref.astype(np.float64).T
        np.testing.assert_allclose(got[layer], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _real_files() -> list:
    from radixjax.loaders import default_model_path, resolve_model_path
    return [default_model_path(), resolve_model_path("gemma3-270m")]


@needs_handler
def test_real_files_tensors_multiply_in_their_blocks() -> None:
    """Each block type of the two shipped GGUFs (SmolLM2 Q4_1, Gemma 3 270M Q4_K_M): a
    tensor's rows dequantize as the gguf package does, its product equals the exact one."""
    from radixjax.loaders.gguf_reader import read_gguf
    seen = set()
    rng = np.random.default_rng(3)
    for path in _real_files():
        for t in read_gguf(path).tensors:
            if int(t.tensor_type) not in PRODUCT_TYPES or t.tensor_type in seen:
                continue
            seen.add(t.tensor_type)
            values, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            raw = np.asarray(t.data[:48])
            k = raw.shape[1] // size * values
            w = to_device(from_blocks(raw, int(t.tensor_type), k))
            ref = dequantized(raw, t.tensor_type)
            np.testing.assert_array_equal(
                np.asarray(block_rows(jnp.arange(48, dtype=jnp.int32), w)), ref)
            x = rng.standard_normal((3, k)).astype(np.float32)
            want = activations_as_rounded(x) @ ref.astype(np.float64).T
            np.testing.assert_allclose(np.asarray(block_linear(jnp.asarray(x), w)), want,
                                       rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert {T.Q4_1, T.Q4_K, T.Q6_K} <= seen, seen


@needs_handler
def test_smollm2_in_its_blocks_tracks_float32(smollm2) -> None:
    """The default model loaded in the gguf form: its quantized matrices, embedding and
    (tied) head stay in their blocks; prompt logits track the float32 form's (which
    equals HF's, test_smollm2_gguf.py), and with deterministic inference (the serving
    default) a request's logits are the same bits alone or beside others."""
    from radixjax.loaders import default_model_path, load_model
    from radixjax.runtime.batch import RequestSlice, build_batch
    from tests.model.harness import rel_err, tiny_runner

    m = load_model(None, load_tokenizer=False, gguf_blocks=True)
    gc.collect()  # nothing loaded keeps the file mapped (its pages would stay resident)
    path = str(default_model_path())
    assert not [line for line in open("/proc/self/maps") if path in line]  # noqa: SIM115
    assert isinstance(m.params["embed"], gguf_blocks.BlockWeight)
    assert all(isinstance(m.params["layers"][0][n], gguf_blocks.BlockWeight)
               for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
    ids = np.asarray(smollm2.tokenizer("def fib(n):\n    return n if n < 2 else").input_ids,
                     np.int32)

    def logits(runner, prompts: list[np.ndarray]) -> np.ndarray:
        slices, start = [], 1
        for p in prompts:
            slices.append(RequestSlice(p, np.arange(start, start + len(p), dtype=np.int32)))
            start += len(p)
        return runner.all_logits(build_batch(slices, runner.buckets))

    ours = tiny_runner(m.cfg, m.params, quantization="gguf", max_batch_tokens=64,
                       num_slots=256, deterministic=True, kv_dtype="bfloat16")
    ref = logits(tiny_runner(smollm2.cfg, smollm2.params, quantization="none",
                             max_batch_tokens=64, num_slots=256), [ids])
    got = logits(ours, [ids])
    assert rel_err(got, ref) < 0.12
    assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.9
    other = np.arange(5, 25, dtype=np.int32)
    both = logits(ours, [other, ids, other[:7]])
    np.testing.assert_array_equal(both[len(other):len(other) + len(ids)], got)
