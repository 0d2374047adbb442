"""The gguf form on a GPU (model/gguf_gpu.py): a GGUF's matrices loaded as planes and
multiplied by the Pallas kernel, interpreted on this CPU. The shipped models' prompt
logits equal float32's to float rounding (the planes hold the exact weights; a float32
dot), with layers of different types stacked in one form (Gemma 3's Q4_K_M), and the
forward lowers for CUDA with every product a Triton call over the planes."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import jax
import numpy as np
import pytest

from pallas_kernels.compat import lower_for_cuda
from pallas_kernels.gguf_planes import FORMS
from radixjax.loaders import load_model
from radixjax.model.gguf_gpu import PlanesWeight
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import rel_err, tiny_runner


def _logits(runner, ids: np.ndarray) -> np.ndarray:
    return runner.all_logits(build_batch(
        [RequestSlice(ids, np.arange(1, 1 + len(ids), dtype=np.int32))], runner.buckets))


def _assert_equals_float32(planes, f32, ids: np.ndarray) -> None:
    """A prompt's logits through the planes (interpreted kernel) against float32's."""
    kw = dict(max_batch_tokens=16, num_slots=64)
    got = _logits(tiny_runner(planes.cfg, planes.params, quantization="gguf", **kw), ids)
    ref = _logits(tiny_runner(f32.cfg, f32.params, quantization="none", **kw), ids)
    assert rel_err(got, ref) < 1e-4
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))


@pytest.fixture(scope="module")
def smollm2_planes():
    return load_model(None, load_tokenizer=False, gguf_blocks="planes")


def test_smollm2_as_planes_equals_float32(smollm2, smollm2_planes) -> None:
    m = smollm2_planes
    assert isinstance(m.params["embed"], PlanesWeight)  # tied: the head too
    assert all(isinstance(m.params["layers"][0][n], PlanesWeight)
               for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
    ids = np.asarray(smollm2.tokenizer("def fib(n):\n    return n if n < 2 else").input_ids,
                     np.int32)
    _assert_equals_float32(m, smollm2, ids)


def test_gemma3_layers_of_two_types_stack_in_one_form() -> None:
    """Gemma 3 270M Q4_K_M: attn_v and ffn_down are Q4_K in some layers, Q6_K in others;
    each stack holds them in one form, the same weights."""
    m = load_model("gemma3-270m", load_tokenizer=False, gguf_blocks="planes")
    forms = {name: {w.segments[0].form for w in (lp[name] for lp in m.params["layers"])}
             for name in ("wv", "w_down")}
    assert all(len(f) == 2 for f in forms.values()), forms
    assert FORMS[12] in forms["w_down"] and FORMS[14] in forms["w_down"]  # Q4_K, Q6_K
    _assert_equals_float32(m, load_model("gemma3-270m", load_tokenizer=False),
                           np.arange(100, 116, dtype=np.int32))


def test_forward_in_planes_lowers_for_cuda(smollm2_planes) -> None:
    """The step's forward with the planes and the Pallas attention backend, lowered for
    a GPU: in the layers' scan body 7 products (q, k, v, o, gate, up, down) and the
    head, each one Triton call; no weight matrix appears in a float type."""
    from radixjax.model.attention import AttentionMetadata
    from radixjax.model.layer_stack import stack_layers
    from radixjax.model.llama import forward, init_kv_pool
    from radixjax.model.pallas_backend import pallas_attention
    from radixjax.model.quant import quantize_params

    m = smollm2_planes
    cfg = m.cfg
    params = jax.tree.map(  # compiled kernels: lowered for CUDA, never run here
        lambda w: replace(w, interpret=False) if isinstance(w, PlanesWeight) else w,
        stack_layers(cfg, quantize_params(m.params, "gguf")),
        is_leaf=lambda w: isinstance(w, PlanesWeight))
    sd = jax.ShapeDtypeStruct
    kv = jax.tree.map(lambda a: sd(a.shape, a.dtype), init_kv_pool(cfg, 256, np.float32))
    i32 = partial(sd, dtype=np.int32)
    md = AttentionMetadata(i32((16,)), i32((16,)), i32((16,)), i32((2,)), i32((2,)),
                           i32((2,)), i32((2,)), i32((3, 256)))
    text = lower_for_cuda(partial(forward, cfg=cfg,
                                  backend=partial(pallas_attention, page_size=16,
                                                  interpret=False)),
                          params, kv, i32((16,)), md).as_text()
    calls = re.findall(r"call @(_matmul(?:_\d+)?)\(", text)  # the kernel's jit
    assert len(calls) == 8, calls  # 7 + head
    assert text.count("stablehlo.custom_call @__gpu$xla.gpu.triton") == 2 + len(set(calls))
    d, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    for n, k in ((i, d), (d, i), (v, d)):
        assert not re.search(rf"tensor<(\d+x)?{n}x{k}x(f32|bf16|f16)>", text), (n, k)
