"""GGUF loading on tiny models: write an HF model's weights as a GGUF the way
llama.cpp's converter does (Q/K rows permuted for `llama`), load it, compare logits with
the same model loaded from its HF folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from radixjax.loaders import ModelNotFoundError, default_model_path, load_model
from radixjax.loaders.gguf_file import unpermute_rope_rows
from radixjax.loaders.gguf_reader import read_gguf
from radixjax.model.config import UnsupportedModelError
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import rel_err, tiny_runner

_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    # Phi-3's fused matrices ([gate | up] is llama.cpp's ffn_up there)
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}


# Gemma 2 / 3: post_attention_layernorm is the attention's output norm
_GEMMA_NAMES = {**_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to Q/K rows for the llama arch."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


def write_gguf(hf_dir: Path, out: Path, arch: str) -> Path:
    import json

    cfg = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(str(hf_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    rope = cfg["rope_parameters"]
    if "full_attention" in rope:  # Gemma 3: the global layers' (the local base is fixed)
        rope = rope["full_attention"]
        w.add_uint32(f"{arch}.attention.sliding_window_pattern",
                     cfg["layer_types"].index("full_attention") + 1)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_eos_token_id(2)
    for name, t in tensors.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, idx, rest = name.split(".", 3)
            gname = f"blk.{idx}.{(_GEMMA_NAMES if arch == 'gemma3' else _NAMES)[rest]}"
            if arch == "llama" and rest.startswith("self_attn.q_proj"):
                t = llama_cpp_permute(t, heads)
            elif arch == "llama" and rest.startswith("self_attn.k_proj"):
                t = llama_cpp_permute(t, kv_heads)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            t = t + 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.random.default_rng(0).normal(size=(4 * 16, 7))
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(w, 4), 4), w)
    b = np.arange(32.0)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(b, 2), 2), b)


# mistral: llama arch in GGUF (permuted Q/K), untied head, GQA 8, sliding window.
@pytest.mark.parametrize("family,arch", [("mistral", "llama"), ("qwen2", "qwen2"),
                                         ("qwen3", "qwen3"), ("gemma3", "gemma3"),
                                         ("phi3", "phi3")])
def test_gguf_matches_hf_folder(family: str, arch: str, tiny_model_dir, tmp_path) -> None:
    hf_dir = tiny_model_dir(family)
    path = write_gguf(hf_dir, tmp_path / "tiny.gguf", arch)
    g = load_model(path, load_tokenizer=False)
    h = load_model(hf_dir, load_tokenizer=False)
    if arch == "gemma3":  # GGUF has no query_pre_attn_scalar (llama.cpp: 1 / sqrt(Dh),
        # equal in the released Gemma 3s; the tiny one sets its own)
        assert g.cfg.query_scale is None and h.cfg.query_scale == 24**-0.5
        g.cfg = dataclasses.replace(g.cfg, query_scale=h.cfg.query_scale)
        # the whole architecture read from the metadata (the tiny file's tokens differ)
        assert g.cfg == dataclasses.replace(h.cfg, eos_token_ids=g.cfg.eos_token_ids,
                                            bos_token_id=g.cfg.bos_token_id,
                                            rms_norm_eps=g.cfg.rms_norm_eps)  # (an f32)
    assert g.cfg.tie_word_embeddings == h.cfg.tie_word_embeddings
    assert (g.cfg.qkv_bias, g.cfg.qk_norm) == (h.cfg.qkv_bias, h.cfg.qk_norm)
    ids = np.random.default_rng(1).integers(3, 200, 30).astype(np.int32)
    out = []
    for m in (g, h):
        runner = tiny_runner(m.cfg, m.params)
        out.append(runner.all_logits(
            build_batch([RequestSlice(ids, np.arange(1, 31, dtype=np.int32))], runner.buckets)))
    assert g.cfg.sliding_windows == h.cfg.sliding_windows
    assert rel_err(out[0], out[1]) < 1e-5


def test_bad_model_paths_raise(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError):
        load_model(tmp_path / "nope")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(UnsupportedModelError):
        load_model(tmp_path)


def assert_reads_like_gguf_package(path: Path) -> None:
    """read_gguf gives what gguf.GGUFReader (the reference, ~50x slower) gives: every
    metadata value and every tensor's type, shape and bytes."""
    ours, ref = read_gguf(path), gguf.GGUFReader(str(path))
    expected = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == expected
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and a.data.dtype == b.data.dtype, a.name
        np.testing.assert_array_equal(a.data, b.data, err_msg=a.name)


def test_reader_matches_the_gguf_package(tmp_path) -> None:
    """Every metadata value type (scalars, bool, strings, arrays of numbers and of
    strings), a float32, a float16 and a Q8_0 tensor."""
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_uint32("t.u32", 7)
    w.add_int64("t.i64", -3)
    w.add_float32("t.f32", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "naïve — 日本")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_token_list(["a", "ü", "<|im_end|>", ""])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.normal(size=(3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.normal(size=(4, 2)).astype(np.float16))
    q = rng.normal(size=(2, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_reads_like_gguf_package(tmp_path / "t.gguf")


def test_reader_matches_the_gguf_package_on_the_default_model() -> None:
    assert_reads_like_gguf_package(default_model_path())
