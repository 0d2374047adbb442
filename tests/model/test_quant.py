"""W8A8 int8 (model/quant.py, RunnerConfig / EngineConfig `quantization="w8a8_int8"`):
the weight rounding, the int8 product against the same integer math in numpy, and tiny
models of the families it touches against f32. The default model in int8 against HF
transformers: tests/model/test_smollm2_gguf.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.engine.engine import runner_config_for
from radixjax.loaders import load_model
from radixjax.model import cpu
from radixjax.model.dense_weights import LINEAR_WEIGHTS
from radixjax.model.llama import lm_head
from radixjax.model.quant import (
    BF16_GEMM_ROWS_MIN,
    HEAD_ROWS_MAX,
    ONE_ROW_GEMM_ROWS,
    Int8Weight,
    PackedInt8Weight,
    bf16_gemm,
    head_rows_max,
    int8_head,
    int8_linear,
    quantize_int8,
    quantize_params,
)
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import ScatteredSlots, rel_err, tiny_runner


def test_int8_rounds_each_output_column_to_its_own_scale() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 20)).astype(np.float32) * np.geomspace(1e-3, 10, 20)
    w[:, 3] = 0.0  # an all-zero column keeps a finite scale
    q = quantize_int8(jnp.asarray(w))
    assert q.q.shape == (20, 48) and q.q.dtype == jnp.int8 and q.scale.shape == (20,)
    scale = np.asarray(q.scale)
    np.testing.assert_allclose(scale[[0, 19]], np.abs(w[:, [0, 19]]).max(0) / 127, rtol=1e-6)
    assert scale[3] == 1.0 and not np.asarray(q.q)[3].any()
    back = (np.asarray(q.q, np.float32) * scale[:, None]).T
    assert np.all(np.abs(back - w) <= scale / 2 + 1e-7)  # round to nearest, per column
    assert np.abs(np.asarray(q.q)).max() == 127


def test_int8_linear_is_the_integer_product_rescaled() -> None:
    """Each token's activations rounded to int8 with its own scale (max |x| / 127), the
    product exact in int32, then both scales: equal to numpy's integer math, and within
    ~1 % of the f32 product for Gaussian inputs. An all-zero row gives zeros. One token
    alone gives the same in both of its forms (T = 1: a f32 vector product of the int8
    values, or the GEMM padded to ONE_ROW_GEMM_ROWS rows on an AMX CPU)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 24)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32) * np.array([[1e-3], [1], [30], [1], [1]])
    x[3] = 0.0
    qw = quantize_int8(jnp.asarray(w))
    ours = np.asarray(int8_linear(jnp.asarray(x), qw))
    a = np.maximum(np.abs(x).max(1, keepdims=True), 1e-30) / 127
    xq = np.round(x / a).astype(np.int64)
    ref = (xq @ np.asarray(qw.q, np.int64).T).astype(np.float32) * a * np.asarray(qw.scale)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-30)
    assert not ours[3].any()
    for t in range(5):  # one token alone: a step of T = 1 (the same sums either way)
        for gemm in (False, True, None):
            np.testing.assert_allclose(
                np.asarray(int8_linear(jnp.asarray(x[t:t + 1]), qw, gemm)),
                ref[t:t + 1], rtol=1e-6, atol=1e-30)
    exact = x @ w
    for t in (0, 1, 2, 4):
        assert np.abs(ours[t] - exact[t]).max() < 0.02 * np.abs(exact[t]).max()


def _int8_dot_shapes(f, *args) -> list[str]:
    """The operand shapes of the int8 x int8 dots in f's program."""
    text = jax.jit(f).lower(*args).as_text()
    return [ln.split(":")[-1].strip() for ln in text.splitlines()
            if "dot_general" in ln and "xi8>" in ln]


def test_one_token_takes_the_gemm_on_amx_cpus_only() -> None:
    """The form follows one_row_gemm (padded: an int8 GEMM of ONE_ROW_GEMM_ROWS rows, the
    weight its left operand; not: no int8 dot at all), and by default the CPU
    (model/cpu.py: the AMX flag in /proc/cpuinfo); the head's one row likewise (weight-only
    on AVX2 CPUs, the same GEMM on AMX ones)."""
    rng = np.random.default_rng(3)
    qw = quantize_int8(jnp.asarray(rng.standard_normal((64, 24)), jnp.float32))
    x = jnp.asarray(rng.standard_normal((1, 64)), jnp.float32)
    gemm = _int8_dot_shapes(lambda x: int8_linear(x, qw, True), x)
    assert gemm == [f"(tensor<24x64xi8>, tensor<{ONE_ROW_GEMM_ROWS}x64xi8>) -> "
                    f"tensor<24x{ONE_ROW_GEMM_ROWS}xi32>"]  # the weight as the left operand
    assert _int8_dot_shapes(lambda x: int8_linear(x, qw, False), x) == []
    assert _int8_dot_shapes(lambda x: int8_head(x, qw, HEAD_ROWS_MAX), x) == []
    assert _int8_dot_shapes(lambda x: int8_head(x, qw, 0), x) == gemm
    with open("/proc/cpuinfo") as f:
        amx = "amx_int8" in f.read().split()
    assert cpu.has_amx() == amx
    assert _int8_dot_shapes(lambda x: int8_linear(x, qw), x) == (gemm if amx else [])
    assert _int8_dot_shapes(lambda x: int8_head(x, qw), x) == (gemm if amx else [])


def test_many_rows_multiply_the_int8_values_as_bf16_on_avx512_bf16_cpus(monkeypatch) -> None:
    """as_bf16: the int8 values through a bf16 GEMM with f32 sums - the same integer sums
    as the int8 GEMM, so equal outputs (I = 1536, SmolLM2's down projection). By default
    that form from BF16_GEMM_ROWS_MIN rows on a CPU with AVX-512 BF16 and no AMX only."""
    rng = np.random.default_rng(5)
    qw = quantize_int8(jnp.asarray(rng.standard_normal((1536, 40)), jnp.float32))
    x = jnp.asarray(rng.standard_normal((BF16_GEMM_ROWS_MIN + 3, 1536)), jnp.float32)
    as_s8, as_bf16 = (jax.jit(lambda x, b=b: int8_linear(x, qw, as_bf16=b)) for b in (False, True))
    np.testing.assert_array_equal(np.asarray(as_bf16(x)), np.asarray(as_s8(x)))
    assert _int8_dot_shapes(as_bf16, x) == [] and _int8_dot_shapes(as_s8, x) != []
    assert "xbf16>" in as_bf16.lower(x).as_text()
    for amx in (False, True):
        for bf16 in (False, True):
            monkeypatch.setattr(cpu, "has_amx", lambda amx=amx: amx)
            monkeypatch.setattr(cpu, "has_avx512_bf16", lambda bf16=bf16: bf16)
            assert bf16_gemm(BF16_GEMM_ROWS_MIN) == (bf16 and not amx)
            assert not bf16_gemm(BF16_GEMM_ROWS_MIN - 1)
            text = jax.jit(lambda x: int8_linear(x, qw)).lower(x).as_text()
            assert ("xbf16>" in text) == (bf16 and not amx)


@pytest.mark.parametrize("family", ["deepseek_v3", "llama3"])
def test_int8_runner_tracks_f32(family: str, tiny_model_dir) -> None:
    """DeepSeek-V3: MLA projections, a dense and an MoE group (shared experts quantized,
    routed experts not); llama3: GQA. A prefill batch and a decode batch (one token per
    request)."""
    m = load_model(tiny_model_dir(family), load_tokenizer=False)
    f32 = tiny_runner(m.cfg, m.params)
    int8 = tiny_runner(m.cfg, m.params, quantization="w8a8_int8")
    # on this CPU through oneDNN (model/onednn.py; tests/model/test_onednn.py), the
    # stacked layers' products read in place
    assert isinstance(int8.params["lm_head_int8"], PackedInt8Weight)
    projections = [g[k] for g in int8.params["groups"] for k in ("wqkv", "wkv_a") if k in g]
    assert projections and all(isinstance(w, PackedInt8Weight) and w.packed.ndim == 3
                               for w in projections)
    layer = quantize_params(m.params, "w8a8_int8")["layers"][-1]
    quantized = {k for k, v in layer.items() if isinstance(v, Int8Weight | PackedInt8Weight)}
    assert quantized == LINEAR_WEIGHTS & set(layer) and quantized
    assert not any(isinstance(v, Int8Weight | PackedInt8Weight) for k, v in layer.items()
               if k not in LINEAR_WEIGHTS)
    rng = np.random.default_rng(2)
    seqs = [list(rng.integers(3, m.cfg.vocab_size, n)) for n in (9, 14)]
    slots = ScatteredSlots(512, seed=4)
    rows = [slots.take(len(s) + 1) for s in seqs]
    prefill = build_batch([RequestSlice(np.array(s, np.int32), r[: len(s)])
                           for s, r in zip(seqs, rows, strict=True)], f32.buckets)
    decode = build_batch([RequestSlice(np.array([7], np.int32), r) for r in rows], f32.buckets)
    for batch in (prefill, decode):
        ref, ours = (r.all_logits(batch) for r in (f32, int8))
        assert 0 < rel_err(ours, ref) < 0.15  # measured: DeepSeek 7 %


@pytest.mark.parametrize("quantization", ["w8a8_int8", "w8a16_int8"])
def test_fused_matrices_give_the_same_numbers(quantization: str, tiny_model_dir) -> None:
    """q, k, v (with Qwen2's biases) and gate, up as one int8 matrix each
    (dense_weights.FUSED_WEIGHTS): each output column keeps its own scale, so a step's
    logits are the same bits as with the matrices apart (one product instead of five)."""
    m = load_model(tiny_model_dir("qwen2"), load_tokenizer=False)
    fused, apart = (quantize_params(m.params, quantization, fuse=f) for f in (True, False))
    assert {"wqkv", "w_gate_up", "bq"} <= set(fused["layers"][0])
    assert not {"wq", "wk", "wv", "w_gate", "w_up"} & set(fused["layers"][0])
    runners = [tiny_runner(m.cfg, p) for p in (fused, apart)]  # (already quantized)
    rng = np.random.default_rng(3)
    slots = ScatteredSlots(512, seed=5)
    seqs = [rng.integers(3, m.cfg.vocab_size, n).astype(np.int32) for n in (9, 14)]
    rows = [slots.take(len(s) + 1) for s in seqs]
    for reqs in ([RequestSlice(s, r[:len(s)]) for s, r in zip(seqs, rows, strict=True)],
                 [RequestSlice(np.array([7], np.int32), r) for r in rows]):
        a, b = (r.all_logits(build_batch(reqs, r.buckets)) for r in runners)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_int8_head_rows_and_gemm(family: str, tiny_model_dir) -> None:
    """The LM head's int8 copy (of the embedding when tied, llama; of lm_head, mistral),
    one scale per vocabulary row: steps of up to HEAD_ROWS_MAX rows multiply it weight-only
    on AVX2 CPUs (logits within 2 % of the f32 head's), larger ones (AMX CPUs: all)
    through the layers' int8 GEMM (int8 activations too: within 5 %)."""
    m = load_model(tiny_model_dir(family), load_tokenizer=False)
    head = m.params["embed"] if m.cfg.tie_word_embeddings else m.params["lm_head"]
    assert m.cfg.tie_word_embeddings == (family == "llama") and "lm_head_int8" not in m.params
    q = quantize_params(m.params, "w8a8_int8", use_onednn=False)  # XLA's forms
    np.testing.assert_array_equal(q["lm_head_int8"].q, quantize_int8(head.T).q)
    assert q["lm_head_int8"].q.shape == head.shape
    h = jnp.asarray(np.random.default_rng(4).standard_normal((8, head.shape[1]), np.float32))
    for n in (*range(1, HEAD_ROWS_MAX + 2), 8):
        exact = np.asarray(lm_head(m.params, h[:n], m.cfg))
        ours = np.asarray(int8_head(h[:n], q["lm_head_int8"], HEAD_ROWS_MAX))
        np.testing.assert_array_equal(np.asarray(lm_head(q, h[:n], m.cfg)), np.asarray(
            int8_head(h[:n], q["lm_head_int8"], head_rows_max())))  # the CPU's form
        if n <= HEAD_ROWS_MAX:
            assert 0 < rel_err(ours, exact) < 0.02
        else:
            np.testing.assert_array_equal(ours, np.asarray(int8_linear(h[:n], q["lm_head_int8"])))
            assert 0 < rel_err(ours, exact) < 0.05


def test_quantization_option_reaches_the_runner_on_one_device_only() -> None:
    assert runner_config_for(EngineConfig(quantization="w8a8_int8")).quantization == "w8a8_int8"
    assert runner_config_for(EngineConfig(quantization="none")).quantization == "none"
    with pytest.raises(EngineConfigError, match="one device"):
        EngineConfig(quantization="w8a8_int8", tp=2)
    with pytest.raises(EngineConfigError, match="quantization must be auto or one of"):
        EngineConfig(quantization="fp8")


def test_the_default_form_is_w8a16_with_a_bf16_pool_and_deterministic_on_one_cpu() -> None:
    from radixjax.engine.config import ServingForm, serving_form

    assert runner_config_for(EngineConfig()).quantization == "w8a16_int8"  # tests: cpu
    assert serving_form(EngineConfig(), "cpu") == ServingForm("w8a16_int8", "bfloat16", True)
    # float32 one option away, its KV too; deterministic stays on unless disabled
    assert serving_form(EngineConfig(quantization="none"), "cpu") == \
        ServingForm("none", "float32", True)
    assert serving_form(EngineConfig(enable_deterministic_inference=False), "cpu") == \
        ServingForm("w8a16_int8", "bfloat16", False)
    assert serving_form(EngineConfig(quantization="w8a8_int8", kv_cache_dtype="float32"),
                        "cpu") == ServingForm("w8a8_int8", "float32", True)
    # where it cannot run: several devices, bf16 weights, a GPU (Pallas attention)
    assert serving_form(EngineConfig(tp=2), "cpu") == ServingForm("none", "float32", True)
    assert serving_form(EngineConfig(dtype="bfloat16"), "cpu") == \
        ServingForm("none", "bfloat16", True)
    assert serving_form(EngineConfig(), "gpu") == ServingForm("none", "float32", False)
    assert serving_form(EngineConfig(attention_backend="native"), "gpu").deterministic
    # MLA models (no deterministic form of their attention): float32
    assert serving_form(EngineConfig(), "cpu", mla=True) == ServingForm("none", "float32", False)


def test_a_gguf_file_serves_in_its_blocks_by_default(tiny_model_dir) -> None:
    """A GGUF file whose blocks this backend multiplies (the default model here) takes the
    gguf form on one CPU device; an HF folder, an explicit form or several devices do not."""
    from radixjax.engine.config import ServingForm, serving_form
    from radixjax.engine.load_form import in_blocks
    from radixjax.model import gguf_blocks

    assert serving_form(EngineConfig(), "cpu", gguf=True) == ServingForm("gguf", "bfloat16", True)
    assert serving_form(EngineConfig(quantization="w8a16_int8"), "cpu", gguf=True).quantization \
        == "w8a16_int8"
    assert serving_form(EngineConfig(tp=2), "cpu", gguf=True).quantization == "none"
    # one GPU: the planes and their Pallas kernel (model/gguf_gpu.py, tests/model/test_gguf_gpu.py)
    assert serving_form(EngineConfig(), "gpu", gguf=True) == ServingForm("gguf", "bfloat16", False)
    assert serving_form(EngineConfig(tp=2), "gpu", gguf=True).quantization == "none"
    assert runner_config_for(EngineConfig(), gguf=True).quantization == "gguf"
    assert in_blocks(EngineConfig(), None) == gguf_blocks.available()  # SmolLM2's GGUF
    assert not in_blocks(EngineConfig(), tiny_model_dir("llama"))  # an HF folder
    assert not in_blocks(EngineConfig(quantization="none"), None)


def test_gguf_over_an_hf_folder_says_it_runs_w8a16(tiny_model_dir, caplog) -> None:
    """--quantization gguf where nothing is in blocks (an HF folder): said, and every
    matrix takes the w8a16 path."""
    import logging

    from radixjax.model.quant import A16Int8Weight

    m = load_model(tiny_model_dir("llama"))
    with caplog.at_level(logging.WARNING):
        q = quantize_params(m.params, "gguf", use_onednn=False)
    assert "no matrix is in GGUF blocks" in caplog.text
    assert isinstance(q["layers"][0]["wo"], A16Int8Weight)
