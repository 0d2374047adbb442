"""Load a GGUF file (read by loaders/gguf_reader.py): metadata -> ModelConfig, tensors
dequantized to float32 by the `gguf` package.

llama.cpp's converter permutes the rows of Q and K for the `llama` architecture (it
uses interleaved RoPE pairs); we undo that so one RoPE (HF's rotate-half) serves both
formats. GGUF matrices dequantize as (out, in); we store (in, out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from radixjax.loaders.gguf_reader import GGUFFile
from radixjax.model.config import ModelConfig
from radixjax.model.params import Params, Placer, params_from_numpy

_LAYER_NAMES = {
    "attn_norm.weight": ("attn_norm", False),
    "attn_q.weight": ("wq", True),
    "attn_k.weight": ("wk", True),
    "attn_v.weight": ("wv", True),
    "attn_output.weight": ("wo", True),
    "attn_q.bias": ("bq", False),
    "attn_k.bias": ("bk", False),
    "attn_v.bias": ("bv", False),
    "attn_output.bias": ("bo", False),
    "attn_q_norm.weight": ("q_norm", False),
    "attn_k_norm.weight": ("k_norm", False),
    "ffn_norm.weight": ("mlp_norm", False),
    "ffn_gate.weight": ("w_gate", True),
    "ffn_up.weight": ("w_up", True),
    "ffn_down.weight": ("w_down", True),
}
_TOP_NAMES = {
    "token_embd.weight": ("embed", False),
    "output_norm.weight": ("final_norm", False),
    "output.weight": ("lm_head", False),  # kept [V, D]
}


def is_gguf_file(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


def load_gguf_config(gf: GGUFFile) -> ModelConfig:
    return ModelConfig.from_gguf(gf.metadata, {t.name for t in gf.tensors})


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's Q/K row permutation. w: [out = heads*Dh, in] -> same shape."""
    out_dim = w.shape[0]
    w = w.reshape(num_heads, out_dim // num_heads // 2, 2, *w.shape[1:])
    return w.swapaxes(1, 2).reshape(out_dim, *w.shape[3:])


def load_gguf_params(gf: GGUFFile, cfg: ModelConfig, arch: str, dtype: Any,
                     placer: Placer | None = None) -> Params:
    top: dict[str, np.ndarray] = {}
    layers: list[dict[str, np.ndarray]] = [{} for _ in range(cfg.num_layers)]
    for t in gf.tensors:
        if t.name.startswith("blk."):
            _, idx, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                continue
            ours, transpose = _LAYER_NAMES[rest]
            dest = layers[int(idx)]
        elif t.name in _TOP_NAMES:
            ours, transpose = _TOP_NAMES[t.name]
            dest = top
        else:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if arch == "llama" and ours in ("wq", "bq"):
            w = unpermute_rope_rows(w, cfg.num_heads)
        elif arch == "llama" and ours in ("wk", "bk"):
            w = unpermute_rope_rows(w, cfg.num_kv_heads)
        dest[ours] = w.T if transpose else w
    return params_from_numpy(cfg, top, layers, dtype, placer)
