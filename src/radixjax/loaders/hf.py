"""Load an HF model folder: config.json + *.safetensors (weights stay numpy on the host
until `params_from_numpy` puts each leaf on the device in its dtype, or straight into its
shards through a placer). MoE experts come per expert (`mlp.experts.{j}.gate_proj`,
Mixtral's `block_sparse_moe.experts.{j}.w1/w3/w2`) or fused (`mlp.experts.gate_up_proj`
[E, 2F, D], `mlp.experts.down_proj` [E, D, F]); both are stacked to [E, in, out]."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from radixjax.model.config import ModelConfig
from radixjax.model.params import Params, Placer, params_from_numpy

# HF tensor name (after "model.layers.{i}.") -> (our name, transpose)
_LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm", False),
    "self_attn.q_proj.weight": ("wq", True),
    "self_attn.k_proj.weight": ("wk", True),
    "self_attn.v_proj.weight": ("wv", True),
    "self_attn.o_proj.weight": ("wo", True),
    "self_attn.q_proj.bias": ("bq", False),
    "self_attn.k_proj.bias": ("bk", False),
    "self_attn.v_proj.bias": ("bv", False),
    "self_attn.o_proj.bias": ("bo", False),
    "self_attn.q_norm.weight": ("q_norm", False),
    "self_attn.k_norm.weight": ("k_norm", False),
    "post_attention_layernorm.weight": ("mlp_norm", False),
    "mlp.gate_proj.weight": ("w_gate", True),
    "mlp.up_proj.weight": ("w_up", True),
    "mlp.down_proj.weight": ("w_down", True),
    "mlp.gate_proj.bias": ("b_gate", False),
    "mlp.up_proj.bias": ("b_up", False),
    "mlp.down_proj.bias": ("b_down", False),
}
# MLA (DeepSeek): model/mla.py
_LAYER_NAMES.update({
    "self_attn.q_a_proj.weight": ("wq_a", True),
    "self_attn.q_a_layernorm.weight": ("q_a_norm", False),
    "self_attn.q_b_proj.weight": ("wq_b", True),
    "self_attn.kv_a_proj_with_mqa.weight": ("wkv_a", True),
    "self_attn.kv_a_layernorm.weight": ("kv_a_norm", False),
    "self_attn.kv_b_proj.weight": ("wkv_b", True),
})
# shared experts (DeepSeek: shared_experts, Qwen2-MoE: shared_expert + its sigmoid gate)
for _hf_name in ("shared_experts", "shared_expert"):
    for _proj, _ours in (("gate_proj", "ws_gate"), ("up_proj", "ws_up"), ("down_proj", "ws_down")):
        _LAYER_NAMES[f"mlp.{_hf_name}.{_proj}.weight"] = (_ours, True)
_LAYER_NAMES["mlp.shared_expert_gate.weight"] = ("shared_gate", True)  # [1, D] -> [D, 1]
_LAYER_NAMES["mlp.gate.e_score_correction_bias"] = ("router_bias", False)
# MoE router: [E, D] -> ours [D, E]
_LAYER_NAMES["mlp.gate.weight"] = ("router", True)
_LAYER_NAMES["block_sparse_moe.gate.weight"] = ("router", True)
# per-expert weight name -> our stacked leaf (each [out, in], transposed to [in, out])
_EXPERT_NAMES = {
    "gate_proj": "we_gate", "up_proj": "we_up", "down_proj": "we_down",
    "w1": "we_gate", "w3": "we_up", "w2": "we_down",
}
_EXPERT_RE = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_TOP_NAMES = {
    "model.embed_tokens.weight": ("embed", False),
    "model.norm.weight": ("final_norm", False),
    "lm_head.weight": ("lm_head", False),  # kept [V, D]
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Gemma 2 / 3: post_attention_layernorm normalises the attention's output (Llama's is
# the MLP's input norm), pre/post_feedforward_layernorm the MLP's input and output
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": ("post_attn_norm", False),
    "pre_feedforward_layernorm.weight": ("mlp_norm", False),
    "post_feedforward_layernorm.weight": ("post_mlp_norm", False),
}
# Phi-3: fused in the checkpoint, [q | k | v] and [gate | up] rows
_FUSED_NAMES = {"self_attn.qkv_proj.weight": ("wq", "wk", "wv"),
                "mlp.gate_up_proj.weight": ("w_gate", "w_up")}


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()


def load_hf_config(path: Path) -> ModelConfig:
    with open(path / "config.json") as f:
        hf: dict[str, Any] = json.load(f)
    return ModelConfig.from_hf(hf)


def _read(f: Any, flax_f: Any, name: str) -> np.ndarray:
    """Host numpy; bf16 tensors (which safetensors' numpy framework cannot read) go
    through the torch-free "flax" framework and are widened to float32."""
    if f.get_slice(name).get_dtype() != "BF16":
        return f.get_tensor(name)
    return np.asarray(flax_f.get_tensor(name).astype("float32"))


def _stack_experts(found: dict[tuple[str, int], np.ndarray], num_experts: int,
                   where: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if not found:
        return out
    for leaf in ("we_gate", "we_up", "we_down"):
        rows = [found.get((leaf, j)) for j in range(num_experts)]
        if any(r is None for r in rows):
            continue  # reported as missing by params_from_numpy
        out[leaf] = np.stack(rows)
    if len(out) not in (0, 3):
        raise ValueError(f"{where}: incomplete expert weights")
    return out


def _fused_experts(name: str, arr: np.ndarray) -> dict[str, np.ndarray]:
    """transformers-5 fused layout -> stacked [E, in, out] leaves."""
    if name == "gate_up_proj":  # [E, 2F, D]: gate rows first
        f = arr.shape[1] // 2
        return {"we_gate": arr[:, :f].transpose(0, 2, 1), "we_up": arr[:, f:].transpose(0, 2, 1)}
    return {"we_down": arr.transpose(0, 2, 1)}  # down_proj [E, D, F]


def _deinterleave_rope(lw: dict[str, np.ndarray], cfg: ModelConfig) -> None:
    """MLA: reorder the RoPE output columns of the query and the shared key from pairs
    (x0, x1), (x2, x3).. to halves (x0, x2, .. | x1, x3, ..), so the forward's rotate-half
    RoPE rotates the same pairs. q and k move alike, so q.k is unchanged."""
    m = cfg.mla
    assert m is not None
    r = m.qk_rope_head_dim
    perm = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])
    for name in ("wq", "wq_b"):
        if name in lw:  # [in, H * (Dn + Dr)]: each head's last Dr columns
            w = lw[name].reshape(lw[name].shape[0], cfg.num_heads, m.qk_head_dim)
            nope, rope = w[..., :m.qk_nope_head_dim], w[..., m.qk_nope_head_dim:]
            w = np.concatenate([nope, rope[..., perm]], axis=-1)
            lw[name] = w.reshape(w.shape[0], -1)
    if "wkv_a" in lw:  # [D, Rkv + Dr]
        w = lw["wkv_a"]
        lw["wkv_a"] = np.concatenate([w[:, :m.kv_lora_rank], w[:, m.kv_lora_rank:][:, perm]],
                                     axis=1)


def split_fused(w: np.ndarray, parts: tuple[str, ...], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """A Phi-3 fused [O1 + O2 (+ O3), D] matrix -> its parts ("wq", "wk", "wv" or
    "w_gate", "w_up"), each (in, out). The GGUF loader's too."""
    sizes = ((cfg.q_size, cfg.kv_size, cfg.kv_size) if len(parts) == 3
             else (cfg.intermediate_size,) * 2)
    if w.shape[0] != sum(sizes):
        raise ValueError(f"fused {parts}: {w.shape[0]} rows, expected {sum(sizes)}")
    return {p: x.T for p, x in zip(parts, np.split(w, np.cumsum(sizes)[:-1]), strict=True)}


def _gemma_norms(top: dict[str, np.ndarray], layers: list[dict[str, np.ndarray]]) -> None:
    """Gemma's RMSNorm multiplies by (1 + w): stored as that factor (the forward's)."""
    top["final_norm"] = top["final_norm"] + np.float32(1.0)
    for lw in layers:
        for name in ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm",
                     "k_norm"):
            if name in lw:
                lw[name] = lw[name] + np.float32(1.0)


def load_hf_params(path: Path, cfg: ModelConfig, dtype: Any,
                   placer: Placer | None = None) -> Params:
    layer_names = _GEMMA_LAYER_NAMES if cfg.gemma_style else _LAYER_NAMES
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    top: dict[str, np.ndarray] = {}
    layers: list[dict[str, np.ndarray]] = [{} for _ in range(cfg.num_layers)]
    experts: list[dict[tuple[str, int], np.ndarray]] = [{} for _ in range(cfg.num_layers)]
    for file in files:
        with safe_open(str(file), framework="numpy") as f, \
                safe_open(str(file), framework="flax") as flax_f:
            for name in f.keys():
                m = _LAYER_RE.match(name)
                if m and int(m.group(1)) >= cfg.num_layers:
                    continue
                rest = m.group(2) if m else ""
                e = _EXPERT_RE.match(rest)
                if e and e.group(2) in _EXPERT_NAMES:
                    key = (_EXPERT_NAMES[e.group(2)], int(e.group(1)))
                    experts[int(m.group(1))][key] = _read(f, flax_f, name).T
                    continue
                if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
                    fused = _fused_experts(rest.split(".")[-1], _read(f, flax_f, name))
                    layers[int(m.group(1))].update(fused)
                    continue
                if m and rest in _FUSED_NAMES:
                    layers[int(m.group(1))].update(
                        split_fused(_read(f, flax_f, name), _FUSED_NAMES[rest], cfg))
                    continue
                if m and rest in layer_names:
                    ours, transpose = layer_names[rest]
                    dest = layers[int(m.group(1))]
                elif name in _TOP_NAMES:
                    ours, transpose = _TOP_NAMES[name]
                    dest = top
                else:
                    continue  # e.g. rotary inv_freq buffers
                arr = _read(f, flax_f, name)
                dest[ours] = arr.T if transpose else arr
    for i, found in enumerate(experts):
        layers[i].update(_stack_experts(found, cfg.num_experts, f"layers.{i}"))
    if cfg.mla is not None and cfg.mla.rope_interleaved:
        for lw in layers:
            _deinterleave_rope(lw, cfg)
    if cfg.tie_word_embeddings:
        top.pop("lm_head", None)
    if cfg.gemma_style and "final_norm" in top:
        _gemma_norms(top, layers)
    return params_from_numpy(cfg, top, layers, dtype, placer)
