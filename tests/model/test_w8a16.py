"""w8a16 (model/quant.py, `quantization="w8a16_int8"`): the int8 weights of W8A8, each
token's activations as two int8 parts at power-of-two scales, multiplied as one int8
product of twice the rows. Exact integer math, so a row's result is the same bits alone
or in any batch, through oneDNN's product and XLA's int8 GEMM alike (one token is two
rows here, so XLA's one-row vector product is not used)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.engine.config import EngineConfig
from radixjax.engine.engine import runner_config_for
from radixjax.loaders import load_model
from radixjax.model import onednn
from radixjax.model.dense_weights import LINEAR_WEIGHTS
from radixjax.model.quant import (
    A16Int8Weight,
    A16PackedInt8Weight,
    Int8Weight,
    int8_linear,
    is_a16,
    pack_int8,
    quantize_int8,
    quantize_params,
)
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import ScatteredSlots, rel_err, tiny_runner


def _inputs(rows: int, i: int, seed: int) -> np.ndarray:
    """Activations with an outlier channel 200x the rest, as in real models."""
    x = np.random.default_rng(seed).standard_normal((rows, i)).astype(np.float32)
    x[:, 5] *= 200.0
    return x


def _numpy_a16(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    def pow2(v: np.ndarray) -> np.ndarray:
        m = np.maximum(np.abs(v).max(-1, keepdims=True), np.float32(1e-30))
        return (np.float32(2.0) ** np.floor(np.log2(m))).astype(np.float32) / 64

    a = pow2(x)
    hi = np.clip(np.round(x / a), -127, 127)
    r = x - hi * a
    b = pow2(r)
    lo = np.clip(np.round(r / b), -127, 127)
    qt = q.astype(np.int64).T
    return ((hi.astype(np.int64) @ qt) * a + (lo.astype(np.int64) @ qt) * b) * scale


def test_two_int8_parts_keep_the_small_channels_beside_an_outlier() -> None:
    """Equal to numpy's integer math at power-of-two scales; with an outlier channel the
    product is ~100x closer to f32's than W8A8's one part (whose other channels round to
    a few levels)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    x = _inputs(6, 96, seed=1)
    x[4] = 0.0  # an all-zero row stays zero
    q8 = quantize_int8(jnp.asarray(w))
    a16 = A16Int8Weight(*q8)
    ours = np.asarray(int8_linear(jnp.asarray(x), a16))
    np.testing.assert_allclose(ours, _numpy_a16(x, np.asarray(q8.q), np.asarray(q8.scale)),
                               rtol=1e-6, atol=1e-5)
    assert not ours[4].any()
    exact = x @ (np.asarray(q8.q, np.float32) * np.asarray(q8.scale)[:, None]).T
    w8a8 = np.asarray(int8_linear(jnp.asarray(x), q8))
    assert rel_err(ours, exact) < 1e-3 < 1e-2 < rel_err(w8a8, exact)  # measured 1.2e-4 / 1.3e-2


@pytest.mark.parametrize("packed", [False, True])
def test_a_row_is_the_same_bits_alone_or_in_any_batch(packed: bool) -> None:
    """Batch invariance of the product: each row of batches of 1 .. 130 rows equals the
    same row computed alone (and, packed for oneDNN, XLA's forms' bits)."""
    if packed and not onednn.available():
        pytest.skip("oneDNN's handler is not built here (scripts/setup.sh)")
    w = np.random.default_rng(3).standard_normal((576, 192)).astype(np.float32)
    xla = A16Int8Weight(*quantize_int8(jnp.asarray(w)))
    weight = pack_int8(xla) if packed else xla
    assert isinstance(weight, A16PackedInt8Weight if packed else A16Int8Weight)
    f = jax.jit(int8_linear)
    x = jnp.asarray(_inputs(130, 576, seed=4))
    alone = np.concatenate([np.asarray(f(x[i:i + 1], weight)) for i in range(130)])
    for rows in (2, 3, 8, 37, 130):
        np.testing.assert_array_equal(np.asarray(f(x[:rows], weight)), alone[:rows])
    if packed:
        np.testing.assert_array_equal(np.asarray(f(x, xla)), alone)


def _int8_weights_in_f32(params: dict) -> dict:
    """The layer matrices replaced by their int8 values times scale, in f32: the product
    of the int8 weights with exact activations (the head is the model's own)."""
    def back(w: jax.Array) -> jax.Array:
        q = quantize_int8(w)
        return (q.q.astype(jnp.float32) * q.scale[:, None]).T

    return {**params, "layers": [{k: back(v) if k in LINEAR_WEIGHTS else v
                                  for k, v in lp.items()} for lp in params["layers"]]}


def test_w8a16_runner_tracks_exact_activations_where_w8a8_does_not(tiny_model_dir) -> None:
    """A tiny llama3 (GQA) model: every layer matrix and the head in the two-part form.
    Against the same int8 weights with exact f32 activations, a prefill and a decode
    batch's logits are ~4x closer than W8A8's (what is left is mostly the int8 head's
    weight rounding, the same in both)."""
    m = load_model(tiny_model_dir("llama3"), load_tokenizer=False)
    layer = quantize_params(m.params, "w8a16_int8")["layers"][0]
    assert all(is_a16(v) for v in layer.values() if isinstance(v, Int8Weight))
    runners = {q: tiny_runner(m.cfg, _int8_weights_in_f32(m.params) if q == "none"
                              else m.params, quantization=q)
               for q in ("none", "w8a8_int8", "w8a16_int8")}
    assert is_a16(runners["w8a16_int8"].params["lm_head_int8"])
    rng = np.random.default_rng(2)
    seqs = [list(rng.integers(3, m.cfg.vocab_size, n)) for n in (9, 14)]
    slots = ScatteredSlots(512, seed=4)
    rows = [slots.take(len(s) + 1) for s in seqs]
    prefill = build_batch([RequestSlice(np.array(s, np.int32), r[: len(s)])
                           for s, r in zip(seqs, rows, strict=True)], runners["none"].buckets)
    decode = build_batch([RequestSlice(np.array([7], np.int32), r) for r in rows],
                         runners["none"].buckets)
    for batch in (prefill, decode):
        ref, w8a8, w8a16 = (r.all_logits(batch) for r in runners.values())
        assert rel_err(w8a16, ref) < 0.01 < 0.02 < rel_err(w8a8, ref)  # 0.7 % / 2.8-3.0 %
    assert runner_config_for(EngineConfig(quantization="w8a16_int8")).quantization == \
        "w8a16_int8"
