"""GGUF loading on tiny models: write an HF model's weights as a GGUF the way
llama.cpp's converter does (Q/K rows permuted for `llama`), load it, compare logits with
the same model loaded from its HF folder."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from radixjax.loaders import ModelNotFoundError, load_model
from radixjax.loaders.gguf_file import unpermute_rope_rows
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
}


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
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
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
            gname = f"blk.{idx}.{_NAMES[rest]}"
            if arch == "llama" and rest.startswith("self_attn.q_proj"):
                t = llama_cpp_permute(t, heads)
            elif arch == "llama" and rest.startswith("self_attn.k_proj"):
                t = llama_cpp_permute(t, kv_heads)
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
                                         ("qwen3", "qwen3")])
def test_gguf_matches_hf_folder(family: str, arch: str, tiny_model_dir, tmp_path) -> None:
    hf_dir = tiny_model_dir(family)
    path = write_gguf(hf_dir, tmp_path / "tiny.gguf", arch)
    g = load_model(path, load_tokenizer=False)
    h = load_model(hf_dir, load_tokenizer=False)
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
