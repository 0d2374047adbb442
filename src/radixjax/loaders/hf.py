"""Load an HF model folder: config.json + *.safetensors (weights stay numpy on the host
until `params_from_numpy` puts each leaf on the device in its dtype)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from radixjax.model.config import ModelConfig
from radixjax.model.params import Params, params_from_numpy

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
_TOP_NAMES = {
    "model.embed_tokens.weight": ("embed", False),
    "model.norm.weight": ("final_norm", False),
    "lm_head.weight": ("lm_head", False),  # kept [V, D]
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()


def load_hf_config(path: Path) -> ModelConfig:
    with open(path / "config.json") as f:
        hf: dict[str, Any] = json.load(f)
    return ModelConfig.from_hf(hf)


def _to_numpy(t: Any) -> np.ndarray:
    # The torch-free "flax" framework handles bf16 checkpoints, which numpy cannot.
    return np.asarray(t.astype("float32") if str(t.dtype) == "bfloat16" else t)


def load_hf_params(path: Path, cfg: ModelConfig, dtype: Any) -> Params:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    top: dict[str, np.ndarray] = {}
    layers: list[dict[str, np.ndarray]] = [{} for _ in range(cfg.num_layers)]
    for file in files:
        with safe_open(str(file), framework="flax") as f:
            for name in f.keys():
                m = _LAYER_RE.match(name)
                if m and m.group(2) in _LAYER_NAMES and int(m.group(1)) < cfg.num_layers:
                    ours, transpose = _LAYER_NAMES[m.group(2)]
                    dest = layers[int(m.group(1))]
                elif name in _TOP_NAMES:
                    ours, transpose = _TOP_NAMES[name]
                    dest = top
                else:
                    continue  # e.g. rotary inv_freq buffers
                arr = _to_numpy(f.get_tensor(name))
                dest[ours] = arr.T if transpose else arr
    if cfg.tie_word_embeddings:
        top.pop("lm_head", None)
    return params_from_numpy(cfg, top, layers, dtype)
